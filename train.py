"""
Train one configuration of the double-heads ablation, or all six; or sample from a trained run.

    python train.py --attn gla2 --double_heads        # one run, tiny preset, CPU ok
    python train.py --attn all                        # the six runs of the ablation
    torchrun --standalone --nproc_per_node=8 train.py --attn all --preset paper --data edu_fineweb100B/ --grad_accum 60 --compile
    python train.py --sample out/gla2/seed1337 --prompt "The return value"

The ablation (Liu et al., "Multi-Head Low-Rank Attention", ICLR 2026, arXiv
2603.02188) trains GQA, MLA and GLA-2 twice: baseline, and with the query heads
doubled at equal parameters and equal KV cache (gla.make_config), each for
--seeds seeds (--seed, --seed + 1, ...). For a fair difference, the runs of one
seed see the same data in the same order, start from the same torch seed, and
are evaluated on the same fixed validation batches: batch `i` is a pure function
of (seed, i), which also makes resuming exact. plot.py pairs baseline and double
heads seed by seed, so the data noise cancels in their difference, and the
spread across seeds is the band of the figure.

Writes <out_dir>/<run>/seed<seed>/{config.json, metrics.jsonl, ckpt.pt}, run =
gqa, gqa_double_heads, mla, ..., and holds each run's .lock while training it. Bad input
(a disk without room included): one line on stderr, exit status 2. Ctrl-C or SIGTERM:
a checkpoint after the current step, exit status 130 or 143; a second one stops at once.
"""

import argparse
import ast
import ctypes
import dataclasses
import errno
import fcntl
import functools
import hashlib
import json
import math
import multiprocessing
import os
import pathlib
import random
import shutil
import signal
import socket
import sys
import sysconfig
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager, nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import gla
from plot import atomic_write

VARIANTS = ("gqa", "mla", "gla2")
# Override the preset's model (gla.make_config derives everything else from them).
MODEL_FLAGS = ("n_layer", "n_embd", "head_dim", "block_size", "vocab_size", "n_head", "n_kv_head")
PLAIN_LOG_SECONDS = 60  # progress line interval when stderr is not a terminal (no tqdm bar)
# llm.c / modded-nanogpt token shards: 256 int32 header [magic, version, n_tokens, ...], then uint16 tokens.
SHARD_MAGIC, SHARD_VERSION, SHARD_HEADER_INTS = 20240520, 1, 256
# Training defaults per preset; paper = Liu et al. 2026's ablation, as its MLRA release trains it
# (60 sequences x 8 GPUs, 100k iterations, ~98B tokens).
TRAIN_DEFAULTS = {
    "tiny": dict(max_iters=400, batch_size=16, learning_rate=2e-3, warmup_iters=200,
                 eval_interval=25, eval_iters=8, ckpt_interval=100, seeds=2),
    "small": dict(max_iters=10000, batch_size=64, learning_rate=6e-4, warmup_iters=500,
                  eval_interval=250, eval_iters=20, ckpt_interval=1000, seeds=1),
    "paper": dict(max_iters=100000, batch_size=480, learning_rate=1.6e-4, warmup_iters=2000,
                  eval_interval=1000, eval_iters=20, ckpt_interval=1000, seeds=1),
}


class UsageError(Exception):
    """Bad input: printed as one line, exit status 2, nothing written."""


class Diverged(Exception):
    """The loss became NaN or infinite: printed as one line, exit status 1."""


class WriteError(Exception):
    """A run's file could not be written (a full disk, a lost permission): one line, exit status 1."""


class Interrupted(Exception):
    """SIGINT / SIGTERM stopped training between two steps, checkpointed: one line, exit status 128 + signal."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line through cli(), not argparse's usage block
        raise UsageError(message)


def get_args(argv=None):
    """Parse and check the flags, filling per-preset defaults. Raises UsageError."""
    p = Parser(prog="train.py", description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default="gqa", choices=[*VARIANTS, "all"], help="variant, or all six runs")
    p.add_argument("--double_heads", action="store_true", help="double the query heads (same KV cache)")
    p.add_argument("--preset", default="tiny", choices=list(gla.PRESETS))
    p.add_argument("--max_iters", type=int, help="optimizer steps (default: per preset)")
    p.add_argument("--batch_size", type=int, help="sequences per step, all processes together")
    p.add_argument("--grad_accum", type=int, default=1, help="micro-batches per process per step")
    p.add_argument("--n_layer", type=int, help="layers (default: per preset)")
    p.add_argument("--n_embd", type=int, help="model width (default: per preset)")
    p.add_argument("--head_dim", type=int, help="head dim; MLA/GLA derive their dims from it (default: per preset)")
    p.add_argument("--block_size", type=int, help="sequence length (default: per preset)")
    p.add_argument("--vocab_size", type=int, help="vocabulary size (default: per preset; bytes need 256)")
    p.add_argument("--n_head", type=int, help="baseline query heads (default: n_embd / head_dim)")
    p.add_argument("--n_kv_head", type=int, help="GQA key/value heads (default: baseline n_head / 4)")
    p.add_argument("--learning_rate", type=float, help="peak learning rate")
    p.add_argument("--warmup_iters", type=int, help="linear warmup steps")
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--decay", default="all", choices=["all", "matrices"],
                   help="parameters that weight decay pulls toward zero: all (the paper's release, RMSNorm "
                        "gains included; default) or matrices (nanoGPT's convention: not the norms)")
    p.add_argument("--init", default="coupled", choices=["coupled", "independent"],
                   help="coupled (default): the two arms of a seed share the draws of what they have in common "
                        "(common random numbers, gla.GPT.couple_init); independent: each model draws its own")
    p.add_argument("--grad_clip", type=float, default=1.0)
    p.add_argument("--eval_interval", type=int, help="steps between validation evaluations")
    p.add_argument("--eval_iters", type=int, help="validation batches per evaluation")
    p.add_argument("--ckpt_interval", type=int, help="steps between checkpoints (and one at the end)")
    p.add_argument("--out_dir", default="out")
    p.add_argument("--data", help="text file (bytes), folder with train.bin/val.bin, or llm.c shards")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="autocast dtype (default: bfloat16 on cuda)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--seed", type=int, default=1337, help="first seed")
    p.add_argument("--seeds", type=int, help="seeds per run: --seed, --seed + 1, ... (default: per preset)")
    p.add_argument("--jobs", type=int, help="CPU: seeds trained at once, one process each, the cores shared "
                                            "between them (default: as many as seeds and cores allow)")
    p.add_argument("--allow_repeats", action="store_true",
                   help="--preset paper: train even if the run reads its training data more than once")
    p.add_argument("--resume", action="store_true", help="continue each run from its checkpoint")
    p.add_argument("--overwrite", action="store_true", help="start runs over even if they have a checkpoint")
    p.add_argument("--data_order", default="permuted", choices=["permuted", "sequential"],
                   help="permuted: windows without replacement in a keyed order; sequential: each process reads its "
                        "training shards in order, as the MLRA release's loader does")
    p.add_argument("--dry_run", action="store_true", help="print each run's shapes and measured peak memory as "
                                                          "JSON lines and exit, without data or training")
    p.add_argument("--world_size", type=int, help="--dry_run: plan for this many processes (default: WORLD_SIZE)")
    p.add_argument("--device_memory", type=float, metavar="GIB",
                   help="--dry_run: also report the largest micro-batch that fits a device of GIB GiB")
    g = p.add_argument_group("sampling: python train.py --sample RUN [RUN ...] --prompt TEXT (under torchrun "
                             "--nproc_per_node=N with --tp N: tensor-parallel)")
    g.add_argument("--sample", nargs="+", metavar="RUN", help="sample from these runs (ckpt.pt or its folder) in "
                   "turn instead of training; --seed seeds the draws, --compile compiles the steps")
    g.add_argument("--prompt", default="\n", help="text, or GPT-2 token ids without tiktoken (default: a newline)")
    g.add_argument("--max_new_tokens", type=int, help="default: fill the run's block_size")
    g.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    g.add_argument("--top_k", type=int, default=200, help="sample among the k likeliest tokens (0: all)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel processes (gloo on CPU, nccl on GPUs)")
    args = p.parse_args(argv)
    for key, value in TRAIN_DEFAULTS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("max_iters", "batch_size", "grad_accum", "eval_interval", "eval_iters", "ckpt_interval", "seeds",
                "jobs", "world_size", "device_memory", *MODEL_FLAGS):
        value = getattr(args, key)
        if value is not None and value <= 0:
            p.error(f"--{key} must be positive, got {value}")
    if args.warmup_iters < 0:
        p.error(f"--warmup_iters must be zero or more, got {args.warmup_iters}")
    for key in ("learning_rate", "grad_clip"):
        if not (math.isfinite(getattr(args, key)) and getattr(args, key) > 0):
            p.error(f"--{key} must be a positive finite number, got {getattr(args, key)}")
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        p.error(f"--weight_decay must be a finite number >= 0, got {args.weight_decay}")
    if args.max_new_tokens is not None and args.max_new_tokens < 0:
        p.error(f"--max_new_tokens must be >= 0, got {args.max_new_tokens}")
    if (args.world_size or args.device_memory) and not args.dry_run:
        p.error("--world_size and --device_memory plan a --dry_run; pass --dry_run (torchrun sets the real world size)")
    if args.resume and args.overwrite:
        p.error("--resume and --overwrite contradict each other; pass one")
    if not (0 <= args.seed and args.seed + args.seeds <= 2**32):
        p.error(f"--seed must be in [0, 2**32 - seeds] = [0, {2**32 - args.seeds}], got {args.seed}")
    return args


def models_of(args):
    """(variant, double_heads) of each requested model."""
    if args.attn == "all":
        return [(v, d) for v in VARIANTS for d in (False, True)]
    return [(args.attn, args.double_heads)]


def runs_of(args):
    """(variant, double_heads, seed) of each requested run, in the order they train:
    seed by seed, so an interrupted ablation already has whole seeds to plot."""
    return [(v, d, seed) for seed in range(args.seed, args.seed + args.seeds) for v, d in models_of(args)]


def run_name(variant, double_heads):
    """Folder name of a model under --out_dir: gqa, gqa_double_heads, mla, ..."""
    return variant + ("_double_heads" if double_heads else "")


def run_dir(out_dir, variant, double_heads, seed):
    """Folder of one run: <out_dir>/<run name>/seed<seed>."""
    return pathlib.Path(out_dir) / run_name(variant, double_heads) / f"seed{seed}"


def model_config(args, variant, double_heads):
    """GPTConfig of one run: the preset, the variant, and the model flags. Raises ConfigError."""
    overrides = {k: getattr(args, k) for k in MODEL_FLAGS if getattr(args, k) is not None}
    return gla.make_config(args.preset, variant, double_heads, **overrides)


def n_params(config):
    """Parameters of the model of config, counted on the meta device (no memory)."""
    with torch.device("meta"):
        return gla.GPT(config).num_params()


def summary(config, variant, double_heads, preset):
    """The --dry_run line. n_kv_head: KV heads a decode step reads (latent heads for MLA/GLA)."""
    return dict(attn=variant, double_heads=double_heads, preset=preset, n_params=n_params(config),
                ffn_hidden=config.ffn_hidden, n_head=config.n_head,
                n_kv_head=config.n_groups,
                kv_cache_elems_per_token_per_layer=config.kv_cache_elems_per_token_per_layer)


# ----------------------------------------------------------------------------
# Data


def stdlib_corpus():
    """~2 MB of English that ships with every Python: the reference text in
    pydoc_data.topics and the docstrings of the standard library's modules,
    read with ast (never imported). Documents are shuffled with a fixed seed so
    the validation split (last 10%) is not just the last modules of the alphabet."""
    from pydoc_data.topics import topics

    docs = [topics[key] for key in sorted(topics)]
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if parts[0] in ("site-packages", "dist-packages", "test", "idlelib", "lib2to3") or "tests" in parts:
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    docs.append(doc)
    random.Random(0).shuffle(docs)
    return "\n\n".join(docs).encode("utf-8")


def read_shard(path):
    """Tokens of one llm.c shard (uint16, memory-mapped) after checking its header."""
    header = np.fromfile(path, dtype=np.int32, count=SHARD_HEADER_INTS)
    hint = "regenerate it with llm.c's dev/data/fineweb.py"
    if len(header) < 1 or header[0] != SHARD_MAGIC:
        raise UsageError(f"{path}: not an llm.c token shard (magic {header[0] if len(header) else None}, "
                         f"expected {SHARD_MAGIC}); {hint}")
    if len(header) < SHARD_HEADER_INTS:
        raise UsageError(f"{path}: {os.path.getsize(path)} bytes, shorter than the {SHARD_HEADER_INTS * 4}-byte "
                         f"header of an llm.c shard; the file is truncated, {hint}")
    if header[1] != SHARD_VERSION:
        raise UsageError(f"{path}: shard version {header[1]}, expected {SHARD_VERSION}")
    n_tokens, offset = int(header[2]), SHARD_HEADER_INTS * 4
    if n_tokens < 0:
        raise UsageError(f"{path}: header says {n_tokens} tokens, a negative count; the header is corrupt, {hint}")
    if os.path.getsize(path) != offset + 2 * n_tokens:
        raise UsageError(f"{path}: header says {n_tokens} tokens but the file holds "
                         f"{(os.path.getsize(path) - offset) / 2:g}; the shard is truncated or corrupt")
    return np.memmap(path, dtype=np.uint16, mode="r", offset=offset, shape=(n_tokens,))


def read_bin(path):
    """nanoGPT's train.bin / val.bin: raw uint16 tokens, memory-mapped."""
    size = os.path.getsize(path)
    if size % 2:
        raise UsageError(f"{path}: {size} bytes is not a whole number of uint16 tokens; the file is truncated")
    return np.memmap(path, dtype=np.uint16, mode="r") if size else np.zeros(0, np.uint16)


class TokenData:
    """Train and validation token streams and the deterministic batch sampler.

    Each split is a list of 1-D arrays (uint8 bytes or uint16 tokens, often
    memory-mapped shards). A window never crosses two arrays.
    """

    def __init__(self, train, val, source, fingerprint):
        self.splits = {"train": train, "val": val}
        self.source, self.fingerprint = source, fingerprint
        self.n_tokens = {name: sum(len(a) for a in arrays) for name, arrays in self.splits.items()}

    @classmethod
    def load(cls, spec, cache_dir, fingerprint=None):
        """spec None: the stdlib corpus (cached in cache_dir); a text file (bytes,
        90/10 split); a folder with train.bin/val.bin; a folder of llm.c shards.
        fingerprint: the data's, when another process has computed it (not read again)."""
        if spec is None:
            check_out_dir(cache_dir)
            path = pathlib.Path(cache_dir) / "stdlib_corpus.txt"
            if not path.exists():
                text = stdlib_corpus()
                atomic_write({path: lambda f: f.write(text)})
            return cls._from_bytes(path.read_bytes(), f"stdlib corpus ({path})", fingerprint)
        path = pathlib.Path(spec)
        if path.is_file() and path.suffix == ".bin":
            raise UsageError(f"--data {spec}: token files are read from their folder; pass --data {path.parent}")
        if path.is_file():
            return cls._from_bytes(path.read_bytes(), f"text file {path}", fingerprint)
        if not path.is_dir():
            raise UsageError(f"--data {spec}: no such file or folder")
        if (path / "train.bin").is_file() and (path / "val.bin").is_file():
            train, val = [read_bin(path / "train.bin")], [read_bin(path / "val.bin")]
        else:
            train, val = sorted(path.glob("*_train_*.bin")), sorted(path.glob("*_val_*.bin"))
            if not train or not val:
                raise UsageError(f"--data {spec}: the folder has neither train.bin/val.bin nor "
                                 "*_train_*.bin/*_val_*.bin shards")
            train, val = [read_shard(p) for p in train], [read_shard(p) for p in val]
        if fingerprint:
            return cls(train, val, f"token files in {path}", fingerprint)
        # Hashing 20 GB of shards at every start is too slow; names, sizes and the
        # first and last MiB of each file catch a swapped or regenerated dataset.
        digest = hashlib.sha256()
        for p in sorted(path.glob("*.bin")):
            size = p.stat().st_size
            digest.update(f"{p.name}:{size}".encode())
            with open(p, "rb") as f:
                digest.update(f.read(1 << 20))
                f.seek(max(0, size - (1 << 20)))
                digest.update(f.read())
        return cls(train, val, f"token files in {path}", digest.hexdigest()[:16])

    @classmethod
    def _from_bytes(cls, raw, source, fingerprint=None):
        if not raw:
            raise UsageError(f"{source} is empty")
        data = np.frombuffer(raw, dtype=np.uint8)
        n_train = int(0.9 * len(data))
        return cls([data[:n_train]], [data[n_train:]], source, fingerprint or hashlib.sha256(raw).hexdigest()[:16])

    def check(self, block_size, vocab_size):
        """UsageError if a split is shorter than one block + 1 or holds a token id >=
        vocab_size. We scan every token once (memory-mapped shards stream from disk,
        ~10 s for 10B tokens) so that bad data stops us before anything is written."""
        for name, arrays in self.splits.items():
            if max((len(a) for a in arrays), default=0) < block_size + 1:
                raise UsageError(f"{self.source}: the {name} split has no {block_size + 1} consecutive tokens "
                                 f"(one block + 1); use more data or a smaller --block_size")
            top = max(int(a.max()) for a in arrays if len(a))
            if top >= vocab_size:
                raise UsageError(f"{self.source}: {name} token id {top} >= vocab_size {vocab_size}; "
                                 f"pass --vocab_size {top + 1} or more (GPT-2 tokens: 50304)")

    def windows(self, split, block_size):
        """Windows of one pass over a split: per array, how many non-overlapping windows of
        block_size + 1 tokens it holds (window w starts at token w * block_size, so a
        window's last token is the next one's first, as llm.c's loader reads)."""
        return np.array([max(len(a) - 1, 0) // block_size for a in self.splits[split]], dtype=np.int64)

    def batch(self, split, step, batch_size, block_size, seed, rank=0, world_size=1, order="permuted"):
        """Inputs and next-token targets of process `rank`'s share of a global batch:
        rows [rank B/W, (rank+1) B/W) of it, (batch_size // world_size, block_size)
        int64 each, on CPU.

        Windows are drawn without replacement, pass by pass: global row j of the run
        (j = step * batch_size + row) is position j mod N of pass j // N over the split's
        N windows, in an order that a keyed permutation of [0, N) gives (one key per
        seed, split and pass; no table of N entries). So within a pass every window is
        read exactly once, as the paper's loader reads each token once, and a new pass
        reads them in a new order. A pure function of (split, step, seed): every run
        draws the same windows at the same step, the processes' shares are disjoint and
        each reads only its own, and resuming needs no state.

        order "sequential" reads as the MLRA release's loader does: process r takes the
        arrays (shards) r, r + W, r + 2W, ... and reads their windows in order, its row i
        of the run being window i mod N_r of its own N_r (check_passes refuses a process
        without one).
        """
        arrays, counts = self.splits[split], self.windows(split, block_size)
        per = batch_size // world_size
        if order == "sequential":
            arrays, counts = arrays[rank::world_size], counts[rank::world_size]
            window = (step * per + np.arange(per)) % int(counts.sum())
        else:
            n = int(counts.sum())
            passes, k = np.divmod(step * batch_size + np.arange(rank * per, (rank + 1) * per), n)
            window = np.empty_like(k)
            for p in np.unique(passes):  # a batch spans several passes only if it outnumbers the windows
                window[passes == p] = permute(k[passes == p], n, (seed, split == "val", int(p)))
        ends = np.cumsum(counts)
        which = np.searchsorted(ends, window, side="right")
        offsets = (window - (ends - counts)[which]) * block_size
        rows = np.stack([arrays[w][o:o + block_size + 1] for w, o in zip(which, offsets)]).astype(np.int64)
        rows = torch.from_numpy(rows)
        return rows[:, :-1], rows[:, 1:]


def _mix64(x):
    """splitmix64's finaliser (Steele, Lea, Flood 2014): a bijective scramble of uint64 values."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def permute(i, n, key, rounds=4):
    """A pseudo-random permutation of [0, n), evaluated at the indices i (int64 array),
    with O(len(i)) memory: a balanced Feistel network (Luby and Rackoff 1988) on the
    smallest even number of bits that holds n - 1, and cycle walking (Black and Rogaway
    2002) for the values it maps past n: apply it again until they land in [0, n).
    The domain is under 4n (n >= 2), so that takes under 4 tries on average. key: a tuple of
    ints and bools; equal keys give equal permutations."""
    half = (max(2, int(n - 1).bit_length()) + 1) // 2
    mask = np.uint64((1 << half) - 1)
    subkeys = [np.uint64(int.from_bytes(hashlib.blake2b(repr((key, r)).encode(), digest_size=8).digest(), "little"))
               for r in range(rounds)]
    x = np.asarray(i, dtype=np.uint64).copy()
    todo = np.ones(len(x), dtype=bool)
    with np.errstate(over="ignore"):  # uint64 products wrap, as the mix intends
        while todo.any():
            left, right = x[todo] >> np.uint64(half), x[todo] & mask
            for sub in subkeys:
                left, right = right, left ^ (_mix64(right ^ sub) & mask)
            x[todo] = (left << np.uint64(half)) | right
            todo[todo] = x[todo] >= n
    return x.astype(np.int64)


# ----------------------------------------------------------------------------
# Training


# The signal that asked training to stop, 0 if none: the training loop reads it between steps. The --jobs workers
# read their parent's (train_seeds_in_processes), so a signal to the parent alone stops them too.
STOP = ctypes.c_int(0)


@contextmanager
def stop_on_signals():
    """While training, SIGINT (Ctrl-C) and SIGTERM set STOP, for each run to checkpoint after its step and stop; a
    second one raises KeyboardInterrupt: at once, each run's last checkpoint kept."""
    def stop(signum, frame):
        if STOP.value:
            raise KeyboardInterrupt
        STOP.value = signum
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@dataclasses.dataclass
class Context:
    """Where and how we compute: device, autocast, and the torchrun process group."""

    device: torch.device
    dtype: torch.dtype
    rank: int = 0
    world_size: int = 1
    bars: bool = True  # tqdm bars on a terminal; off in --jobs workers, whose output interleaves
    threads: int = dataclasses.field(default_factory=torch.get_num_threads)  # CPU threads for this process

    @property
    def master(self):
        return self.rank == 0

    def autocast(self):
        if self.dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def all_mean(self, value):
        """Mean of a float over processes."""
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.item() / self.world_size


def device_type(args):
    """"cuda" or "cpu": --device, checked (UsageError), or cuda when available."""
    if args.device not in (None, "cpu", "cuda") and not args.device.startswith("cuda:"):
        raise UsageError(f"--device {args.device}: use cpu or cuda")
    if args.device and args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device} but CUDA is not available here; use --device cpu")
    return args.device.split(":")[0] if args.device else ("cuda" if torch.cuda.is_available() else "cpu")


def setup_context(args):
    """Device, dtype and, under torchrun (RANK/WORLD_SIZE set), the process group."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    kind = device_type(args)
    dtype = getattr(torch, args.dtype or ("bfloat16" if kind == "cuda" else "float32"))
    if "RANK" not in os.environ:
        return Context(torch.device(args.device or kind), dtype)
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if kind == "cuda":
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if kind == "cuda" else "gloo")
    return Context(torch.device(f"cuda:{local}" if kind == "cuda" else "cpu"), dtype, rank, world)


def leave_process_group(finished):
    """Destroy torchrun's process group, if there is one (even of one process). A rank that finished its work first
    waits at a barrier for the others: a gloo rank that tore its group down while rank 0 was still writing its
    checkpoint aborted at exit ("terminate called without an active exception"). After an error, no barrier: the
    other ranks may never reach it."""
    if dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()


def lr_at(step, args):
    """Linear warmup, then cosine decay to 0.1 x peak at max_iters (the MLRA release's schedule)."""
    peak = args.learning_rate
    if step < args.warmup_iters:
        return peak * (step + 1) / args.warmup_iters
    progress = min(1.0, (step - args.warmup_iters) / max(1, args.max_iters - args.warmup_iters))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model, args):
    """AdamW, betas (0.9, 0.95), eps 1e-8 (Liu et al. 2026, the MLRA release's trainer).

    args.decay "all": weight decay on every parameter, RMSNorm gains included, as the
    release's optimizer does (it takes model.parameters() whole): the paper's recipe.
    "matrices": nanoGPT's convention, decay on >= 2-D weights only (a second group
    without decay holds the norm gains).
    PyTorch's fused kernel where it has one (CPU, CUDA): one pass over each parameter
    instead of a dozen element-wise ops; the same update up to float rounding.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if args.decay == "all":
        groups = [{"params": params, "weight_decay": args.weight_decay}]
    else:
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    fused = all(p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(groups, lr=args.learning_rate, betas=(0.9, 0.95), fused=fused)


def run_spec(args, config, data, dtype):
    """What a run is: resuming under any other spec is refused. dtype: its autocast dtype."""
    train = {k: getattr(args, k) for k in ("preset", "max_iters", "batch_size", "grad_accum", "learning_rate",
                                           "warmup_iters", "weight_decay", "decay", "grad_clip", "eval_interval",
                                           "eval_iters", "seed", "data_order", "init")}
    train["dtype"] = str(dtype).removeprefix("torch.")
    # The data is identified by its content (fingerprint), not by its path, so a
    # moved or relatively-named folder still resumes.
    return {"model": dataclasses.asdict(config), "train": train, "data": {"fingerprint": data.fingerprint}}


def spec_differences(saved, current, prefix=""):
    """Every differing key of two nested dicts, as 'key: saved -> current'."""
    diffs = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += spec_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            diffs.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return diffs


def rng_state():
    """Every RNG state (torch, CUDA, numpy, python) as tensors and tuples that
    torch.load(weights_only=True) accepts."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    mt, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = (mt, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached)
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    """Restore what rng_state saved."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    mt, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((mt, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_checkpoint(path, spec):
    """The checkpoint at path (weights_only: it cannot run code), if it matches spec."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        saved = ckpt["config"]
    except Exception as e:  # unpickling errors come in many types; all mean the same here
        raise UsageError(f"cannot resume {path}: not a readable checkpoint of train.py ({type(e).__name__}); "
                         "delete it to start that run over") from None
    diffs = spec_differences(saved, spec)
    if diffs:
        raise UsageError(f"cannot resume {path}: it was trained with a different setup ({', '.join(diffs)}); "
                         "use another --out_dir or drop --resume to start over")
    return ckpt


def read_metrics(path, up_to_iter):
    """Evaluations in metrics.jsonl up to an iteration; a line cut by a kill is dropped."""
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("iter"), int) and row["iter"] <= up_to_iter:
                rows.append(row)
    return rows


def micro_batches(x, y, n, device):
    """The n equal micro-batches of this process's share (x, y) of a batch, moved to device: no forward, in
    training or evaluation, sees more sequences than one micro-batch (the memory check measures that much)."""
    micro = x.size(0) // n
    return [(x[m * micro:(m + 1) * micro].to(device), y[m * micro:(m + 1) * micro].to(device)) for m in range(n)]


@torch.no_grad()
def evaluate(model, data, args, ctx, block_size):
    """Mean loss on the fixed validation batches 0..eval_iters-1, shared by every run, in grad_accum
    micro-batches each (equal sizes, so the mean of their means is the batch's mean)."""
    model.eval()
    total = 0.0
    for k in range(args.eval_iters):
        x, y = data.batch("val", k, args.batch_size, block_size, args.seed, ctx.rank, ctx.world_size)
        for xb, yb in micro_batches(x, y, args.grad_accum, ctx.device):
            with ctx.autocast():
                _, loss = model(xb, yb)
            total += loss.item()
    model.train()
    return ctx.all_mean(total / (args.eval_iters * args.grad_accum))


def train_step(model, x, y, args, ctx):
    """Forward and backward of this process's share (x, y) of one step's batch, in
    grad_accum micro-batches (DDP averages the gradients on the last one).
    Returns the step's mean loss over all processes."""
    total = 0.0
    for m, (xb, yb) in enumerate(micro_batches(x, y, args.grad_accum, ctx.device)):
        last = m == args.grad_accum - 1
        with ctx.autocast(), (nullcontext() if last or ctx.world_size == 1 else model.no_sync()):
            _, loss = model(xb, yb)
            (loss / args.grad_accum).backward()
        total += loss.item() / args.grad_accum
    return ctx.all_mean(total)


def train_run(args, variant, double_heads, data, ctx, log):
    """Train (or resume, or skip if finished) one run, the one of seed args.seed;
    returns its last evaluation."""
    folder = run_dir(args.out_dir, variant, double_heads, args.seed)
    name = f"{run_name(variant, double_heads)} seed {args.seed}"
    config = model_config(args, variant, double_heads)
    spec = run_spec(args, config, data, ctx.dtype)
    ckpt_path, metrics_path = folder / "ckpt.pt", folder / "metrics.jsonl"

    torch.manual_seed(args.seed)  # same init for every process and every resume
    model = gla.GPT(config)
    if args.init == "coupled":
        model.couple_init(args.seed, model_config(args, variant, not double_heads))
    model.to(ctx.device)
    optimizer = make_optimizer(model, args)
    step, elapsed, loss_sum, loss_count, rows = 0, 0.0, 0.0, 0, []
    if args.resume and ckpt_path.exists():
        ckpt = load_checkpoint(ckpt_path, spec)
        try:
            gla.load_state(model, ckpt["model"])
        except ValueError as e:
            raise UsageError(f"cannot resume {ckpt_path}: {e}") from None
        optimizer.load_state_dict(ckpt["optimizer"])  # its saved `fused` flag wins: an old run continues unchanged
        set_rng_state(ckpt["rng"])
        step, elapsed = ckpt["iter"], ckpt["elapsed_s"]
        loss_sum, loss_count = ckpt["train_loss_sum"], ckpt["train_loss_count"]
        del ckpt  # the model and optimizer hold copies now: no second set of weights for the whole run
        rows = read_metrics(metrics_path, step)
        if step >= args.max_iters:
            log(f"{name}: finished at iteration {step}, skipped")
            return rows[-1] if rows else None
        log(f"{name}: resuming at iteration {step}")
    saved = step  # the iteration of the checkpoint on disk (0: none)

    def write(path, fill, append=False):
        # A full disk, a lost permission: one line naming the file, and the files written before stay whole
        # (atomic_write; a cut append leaves a partial last line, which read_metrics drops). torch.save turns a
        # failed write into a RuntimeError whose context is the OSError.
        try:
            if append:
                with open(path, "ab") as f:
                    fill(f)
            else:
                atomic_write({path: fill})
        except (OSError, RuntimeError) as e:
            error = e if isinstance(e, OSError) else e.__context__
            if not isinstance(error, OSError):
                raise
            kept = f"the checkpoint of iteration {saved} and its metrics are kept" if saved else "no checkpoint yet"
            fix = "free space" if error.errno in (errno.ENOSPC, errno.EDQUOT) else "make it writable"
            raise WriteError(f"cannot write {path}: {error.strerror or error}; {kept}: {fix}, then --resume") from None

    if ctx.master:
        if step == 0:  # starting over: a stale checkpoint must not be resumed later
            ckpt_path.unlink(missing_ok=True)
        folder.mkdir(parents=True, exist_ok=True)
        for tmp in folder.glob(".*.pt.*"):  # left by a process killed inside atomic_write
            tmp.unlink()
        info = {**spec, "data": {**spec["data"], "source": data.source}}
        write(folder / "config.json", lambda f: f.write(json.dumps(info, indent=2).encode()))
        # Rewrite the metrics so they end exactly at the checkpoint: a resume neither
        # repeats nor loses an evaluation.
        write(metrics_path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in rows).encode()))
        log(f"{name}: {model.num_params():,} parameters, n_head {config.n_head}, ffn_hidden {config.ffn_hidden}, "
            f"KV cache {config.kv_cache_elems_per_token_per_layer} elements/token/layer")

    train_model = torch.compile(model) if args.compile else model
    if ctx.world_size > 1:
        train_model = DDP(train_model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    tokens_per_step = args.batch_size * config.block_size

    def diverged(what):
        raise Diverged(f"{name}: {what} at iteration {step}; stopped, the last good checkpoint is kept at "
                       f"{ckpt_path}" + ("" if ckpt_path.exists() else " (none yet)"))

    def save(step):
        nonlocal saved
        # A finite loss can still be followed by an update that overflows the weights:
        # we never let such a state replace the last good checkpoint.
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            diverged("non-finite weights")
        if ctx.master:
            ckpt = dict(model=model.state_dict(), optimizer=optimizer.state_dict(), iter=step,
                        tokens=step * tokens_per_step, elapsed_s=elapsed, train_loss_sum=loss_sum,
                        train_loss_count=loss_count, rng=rng_state(), config=spec)
            write(ckpt_path, lambda f: torch.save(ckpt, f))
        saved = step

    # disable=None: progress bars on a terminal only, so logs in files stay readable.
    bar = tqdm(total=args.max_iters, initial=step, desc=name, disable=None if ctx.master and ctx.bars else True,
               leave=False,
               dynamic_ncols=True)
    t0 = time.time() - elapsed
    last_log = time.time()
    try:
        while step < args.max_iters:
            if ctx.all_mean(float(STOP.value != 0)):  # between two steps, agreed by every process: a whole state
                if step != saved:
                    elapsed = time.time() - t0
                    save(step)
                raise Interrupted(f"{name}: interrupted at iteration {step}")
            lr = lr_at(step, args)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = data.batch("train", step, args.batch_size, config.block_size, args.seed, ctx.rank, ctx.world_size,
                              args.data_order)
            step_loss = train_step(train_model, x, y, args, ctx)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip).item()
            if not math.isfinite(step_loss) or not math.isfinite(grad_norm):
                diverged(f"loss {step_loss}, gradient norm {grad_norm}")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            loss_sum, loss_count = loss_sum + step_loss, loss_count + 1
            bar.update(1)
            tok_s = step * tokens_per_step / (time.time() - t0)
            bar.set_postfix(loss=f"{step_loss:.3f}", tok_s=f"{tok_s:.0f}")
            if bar.disable and time.time() - last_log > PLAIN_LOG_SECONDS:  # no terminal: a line now and then
                last_log = time.time()
                log(f"{name} iter {step}/{args.max_iters}: loss {step_loss:.4f}, {tok_s:.0f} tokens/s")

            if step % args.eval_interval == 0 or step == args.max_iters:
                val_loss = evaluate(model, data, args, ctx, config.block_size)
                elapsed = time.time() - t0
                row = dict(iter=step, tokens=step * tokens_per_step, train_loss=loss_sum / loss_count,
                           val_loss=val_loss, lr=lr, elapsed_s=round(elapsed, 3),
                           tokens_per_s=round(step * tokens_per_step / elapsed, 1))
                loss_sum, loss_count = 0.0, 0
                rows.append(row)
                if ctx.master:
                    write(metrics_path, lambda f: f.write((json.dumps(row) + "\n").encode()), append=True)
                    bar.write(f"{name} iter {step}: train {row['train_loss']:.4f} val {val_loss:.4f}")
            if step % args.ckpt_interval == 0 or step == args.max_iters:
                elapsed = time.time() - t0
                save(step)
    finally:
        bar.close()  # an error message then starts on a clean line
    return rows[-1] if rows else None


# ----------------------------------------------------------------------------
# Sampling from a run: python train.py --sample out/gla2/seed1337 --prompt "The return value"


def sample_runs(args):
    """--sample: text from each run through GPT.generate (its KV cache and decode path), and tokens/s. Under
    torchrun with --tp N, each rank builds the full model (for a moment it holds all the weights: simple, not
    frugal), keeps its shard (gla.shard_for_tp) and runs the same generate; the all-reduces give every rank the same
    logits, so the same seed draws the same tokens everywhere, which we check. Rank 0 prints the text and what every
    rank holds. Bad input is found before the process group exists (weights that do not fit their model, when each
    run is loaded), on every rank alike: one line, exit status 2."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if args.tp != world:
        raise UsageError(f"--tp {args.tp} needs {args.tp} process(es), found WORLD_SIZE={world}: " + (
            f"launch torchrun --standalone --nproc_per_node={args.tp} train.py --sample ... --tp {args.tp}"
            if args.tp > 1 else f"pass --tp {world}"))
    try:
        gla.check_sampling(args.temperature, args.top_k)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if device_type(args) == "cuda" and world > torch.cuda.device_count():
        raise UsageError(f"--tp {world} on CUDA needs {world} GPUs, found {torch.cuda.device_count()}; "
                         "use --device cpu (gloo) or fewer processes")
    jobs = []
    for path in args.sample:
        config, state, codec = gla.load_run(path)
        gla.tp_share(config, 0, args.tp)  # ConfigError for a --tp the model cannot split
        prompt, capacity = codec.encode(args.prompt), config.block_size  # positions past it were never trained
        if not prompt or len(prompt) >= capacity:
            raise UsageError(f"{path}: the prompt is {len(prompt)} tokens ({codec.name}); it needs 1 to "
                             f"{capacity - 1} to fit the cache of block_size={capacity} with a new token")
        if not 0 <= min(prompt) <= max(prompt) < config.vocab_size:
            raise UsageError(f"{path}: prompt token ids must lie in [0, vocab_size={config.vocab_size}), got "
                             f"{min(prompt)} to {max(prompt)}")
        new = capacity - len(prompt) if args.max_new_tokens is None else args.max_new_tokens
        if len(prompt) + new > capacity:
            raise UsageError(f"{path}: a {len(prompt)}-token prompt + --max_new_tokens {new} exceed the cache of "
                             f"block_size={capacity} tokens; lower --max_new_tokens or shorten the prompt")
        jobs.append((path, config, state, codec, prompt, new))
    ctx, finished = setup_context(args), False
    try:
        for path, config, state, codec, prompt, new in jobs:
            model = gla.GPT(config)
            try:
                gla.load_state(model, state)
            except ValueError as e:
                raise UsageError(f"{path}: {e}") from None
            model.to(ctx.device).eval()
            if world > 1:
                gla.shard_for_tp(model, ctx.rank, world)
            generate = functools.partial(model.generate, torch.tensor([prompt], device=ctx.device), new,
                                         args.temperature, args.top_k, compile=args.compile)
            if args.compile:
                generate()  # compiles the step (once per length); the timed run below reuses it
            torch.manual_seed(args.seed)
            t0 = time.perf_counter()
            tokens = generate()[0].tolist()  # .tolist() waits for the GPU
            seconds = time.perf_counter() - t0
            mine = (gla.cache_report(model, config, ctx.rank, world, len(tokens)), tokens)
            ranks = [mine]
            if world > 1:
                ranks = [None] * world
                dist.all_gather_object(ranks, mine)
            if any(other != tokens for _, other in ranks):
                raise RuntimeError("the ranks drew different tokens: their logits differ; a sharding bug")
            if ctx.master:
                how = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, top_k {args.top_k}"
                variant = f"gla{config.n_latent_heads}" if config.attn == "gla" else config.attn
                print(f"== {path}: {variant}, {codec.name}, tp {world}, {ctx.device.type}, "
                      f"{model.tok_emb.weight.dtype}, {how}, seed {args.seed}\n{codec.decode(tokens)}\n"
                      f"-- {new} new tokens in {seconds:.3f} s: {new / seconds:.1f} tokens/s (batch 1, prompt of "
                      f"{len(prompt)} tokens, prefill included)", *(report for report, _ in ranks), sep="\n",
                      flush=True)
        finished = True
    finally:
        leave_process_group(finished)
    return 0


def check_out_dir(out_dir):
    """UsageError unless out_dir is (or can become) a writable folder."""
    path = pathlib.Path(out_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as e:
        raise UsageError(f"--out_dir {out_dir} is not a writable folder ({e.strerror}); choose another") from None


CKPT_SLACK = 2**20  # a checkpoint's bytes beyond 12 a parameter (RNG states, the zip's headers), generously
METRICS_ROW_BYTES = 256  # a metrics.jsonl row takes about 200


def check_disk(args, configs, jobs):
    """UsageError unless the disk of --out_dir has room for what the runs will write. At the end every run's
    checkpoint exists (12 bytes a parameter: float32 weights and AdamW's two moments), less what its ckpt.pt already
    holds (a run resumed, finished or overwritten); while one is replaced (atomic_write) old and new both exist: one
    more copy of the largest per --jobs process writing at once. And the metrics rows."""
    size = {model: 12 * n_params(c) + CKPT_SLACK for model, c in zip(models_of(args), configs)}
    runs, free = runs_of(args), shutil.disk_usage(args.out_dir).free
    ckpts = [run_dir(args.out_dir, *run) / "ckpt.pt" for run in runs]
    need = sum(max(0, size[run[:2]] - (p.stat().st_size if p.exists() else 0)) for run, p in zip(runs, ckpts))
    need += jobs * max(size.values()) + len(runs) * METRICS_ROW_BYTES * (args.max_iters // args.eval_interval + 1)
    if need > free:
        raise UsageError(f"--out_dir {args.out_dir}: {len(runs)} run(s) need {need / 2**20:,.1f} MiB of disk (their "
                         f"checkpoints, a copy while one is replaced, metrics) but {free / 2**20:,.1f} MiB are free; "
                         "free space or choose another --out_dir")


def lock_runs(stack, folders):
    """Hold each run folder until stack closes: an exclusive flock on <folder>/.lock, which names its holder. The
    kernel drops it with the process (a kill -9 leaves no stale lock); plot.py reads without it. UsageError for a
    folder that another process holds, before anything of it is written."""
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        lock = stack.enter_context(open(folder / ".lock", "a+"))
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            raise UsageError(f"{folder} is being trained by {lock.read().strip() or 'another process'}; wait for it "
                             "to finish, stop it, or choose another --out_dir") from None
        lock.truncate(0)
        lock.write(f"process {os.getpid()} on {socket.gethostname()}\n")
        lock.flush()


def main(argv=None):
    """Train the requested runs (or print their --dry_run summaries); returns 0. Raises UsageError / ConfigError
    for bad input, Diverged for a NaN loss, WriteError for a failed write, Interrupted after a signal."""
    args = get_args(argv)
    models = models_of(args)
    if args.sample:
        return sample_runs(args)
    configs = [model_config(args, v, d) for v, d in models]  # ConfigError before anything is written
    world = args.world_size or int(os.environ.get("WORLD_SIZE", 1))
    if args.batch_size % (world * args.grad_accum):
        raise UsageError(f"--batch_size {args.batch_size} is not divisible by {world} process(es) x "
                         f"--grad_accum {args.grad_accum}; pick a multiple")
    if args.dry_run:
        return dry_run(args, models, configs, world)
    runs = runs_of(args)
    if not (args.resume or args.overwrite):  # a forgotten --resume must not discard days of training
        for run in runs:
            folder = run_dir(args.out_dir, *run)
            if (folder / "ckpt.pt").exists():
                raise UsageError(f"{folder} already holds a trained run; "
                                 "pass --resume to continue it, --overwrite to start over, or another --out_dir")
    ctx = setup_context(args)
    jobs = jobs_of(args, ctx)
    check_memory(args, configs, ctx, jobs)
    log = tqdm.write if ctx.master else (lambda msg: None)
    block_size = configs[0].block_size  # one for every run: the preset's or --block_size
    data, passes = load_data(args, ctx, block_size, min(c.vocab_size for c in configs))
    check_out_dir(args.out_dir)
    with ExitStack() as locks, stop_on_signals():  # rank 0 holds the run folders (for any --jobs workers too)
        on_master(ctx, lambda: (check_disk(args, configs, jobs),
                                lock_runs(locks, [run_dir(args.out_dir, *run) for run in runs])))
        where = f"{jobs} processes of {ctx.threads // jobs} thread(s)" if jobs > 1 else f"{ctx.world_size} process(es)"
        log(f"data: {data.source}, {data.n_tokens['train']:,} train / {data.n_tokens['val']:,} val tokens, "
            f"sha256 {data.fingerprint}; {where} on {ctx.device}, {args.dtype or ctx.dtype}")
        log(f"training: {passes}, windows of {block_size} tokens drawn without replacement")

        seeds = list(range(args.seed, args.seed + args.seeds))
        if jobs == 1:
            results = train_seeds(args, seeds, data, ctx, log)
        else:
            results = train_seeds_in_processes(args, seeds, dataclasses.replace(ctx, threads=ctx.threads // jobs,
                                                                                bars=False), jobs)
    for folder, last in results.items():
        if last:
            log(f"{folder}: final val loss {last['val_loss']:.4f} after {last['tokens']:,} tokens")
    leave_process_group(finished=True)
    return 0


def dry_run(args, models, configs, world):
    """--dry_run: a JSON line per run: its shapes, and for `world` processes the measured peak bytes of a training
    step (train_peak) and of an evaluation at its micro-batch; with --device_memory, the largest micro-batch whose
    peaks fit such a device less MEMORY_MARGIN, and its --grad_accum. Plans bf16 autocast on GPUs unless --device
    cpu or --dtype says otherwise."""
    per_process = args.batch_size // world
    micro, dtype = per_process // args.grad_accum, getattr(torch, args.dtype or (
        "float32" if args.device == "cpu" else "bfloat16"))
    for (v, d), config in zip(models, configs):
        line = dict(run=run_name(v, d), **summary(config, v, d, args.preset), world_size=world, micro_batch=micro,
                    dtype=str(dtype).removeprefix("torch."), peak_train_bytes=train_peak(config, micro, dtype, world > 1),
                    peak_eval_bytes=gla.peak_bytes(config, micro, dtype, train=False))
        if args.device_memory:
            fit = largest_micro_batch(config, per_process, dtype, world > 1,
                                      (1 - MEMORY_MARGIN) * args.device_memory * 2**30)
            line.update(device_memory_gib=args.device_memory, max_micro_batch=fit,
                        grad_accum=per_process // fit if fit else None)
        print(json.dumps(line), flush=True)
    return 0


def on_master(ctx, check):
    """check() on rank 0 alone, its result given to every rank; its UsageError too, so a refusal stops all alike."""
    verdict = [None, None]  # error, result
    if ctx.master:
        try:
            verdict[1] = check()
        except UsageError as e:
            verdict[0] = str(e)
    if ctx.world_size > 1:
        dist.broadcast_object_list(verdict, src=0)
    if verdict[0]:
        raise UsageError(verdict[0])
    return verdict[1]


def load_data(args, ctx, block_size, vocab_size):
    """This process's TokenData and the check_passes line. Rank 0 alone loads, scans (TokenData.check) and
    fingerprints the data; the others take its verdict (on_master), and then map the same files without reading
    them."""
    loaded = []

    def check():
        loaded.append(TokenData.load(args.data, args.out_dir))
        loaded[0].check(block_size, vocab_size)
        return loaded[0].fingerprint, check_passes(args, loaded[0], block_size, ctx.world_size)
    fingerprint, passes = on_master(ctx, check)
    return loaded[0] if ctx.master else TokenData.load(args.data, args.out_dir, fingerprint), passes


def human(n):
    """98.3B, 819K: a count in three significant digits (999,600 is 1M, not 1e+03K)."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if float(f"{n:.3g}") >= scale:
            return f"{float(f'{n / scale:.3g}'):g}{unit}"
    return str(n)


def check_passes(args, data, block_size, world_size=1):
    """'98.3B tokens per run = 0.98 passes over 99.6B': what each run reads of the training
    split (--data_order sequential: the process with the fewest windows of its own shards
    sets the passes). The paper's runs read FineWeb-Edu 100BT once; under --preset paper a
    run that would read its data again is refused (UsageError) unless --allow_repeats."""
    tokens = args.max_iters * args.batch_size * block_size
    counts = data.windows("train", block_size)
    pass_tokens = int(counts.sum()) * block_size
    passes = tokens / pass_tokens
    if args.data_order == "sequential":
        if len(counts) < world_size or min(counts[r::world_size].sum() for r in range(world_size)) == 0:
            raise UsageError(f"--data_order sequential gives each of the {world_size} processes shards of its own, "
                             f"but {data.source} has {len(counts)} training file(s) with windows of {block_size + 1} "
                             "tokens for fewer processes; use more shards or --data_order permuted")
        passes = max(tokens / world_size / (counts[r::world_size].sum() * block_size) for r in range(world_size))
    if args.preset == "paper" and passes > 1 and not args.allow_repeats:
        raise UsageError(f"--preset paper reads its training data once, as the paper does, but {human(tokens)} "
                         f"tokens per run are {passes:.2f} passes over the {human(pass_tokens)} of {data.source}; "
                         "use more data (FineWeb-Edu sample-100BT, see README), fewer --max_iters, or --allow_repeats")
    return f"{human(tokens)} tokens per run = {passes:.2f} passes over {human(pass_tokens)}"


# ----------------------------------------------------------------------------
# Memory, measured before anything is built

# Kept free of the device's memory for what fake tensors cannot see: the CUDA caching allocator's
# fragmentation, cuBLAS / NCCL workspaces, torch.compile's own buffers.
MEMORY_MARGIN = 0.10
DDP_BYTES_PER_PARAM = 4  # DDP's gradient buckets: a float32 copy of every gradient


def train_peak(config, micro_batch, dtype, ddp):
    """peak_bytes of a training step, plus DDP's gradient buckets under DDP."""
    return gla.peak_bytes(config, micro_batch, dtype) + (DDP_BYTES_PER_PARAM * n_params(config) if ddp else 0)


def largest_micro_batch(config, per_process, dtype, ddp, budget):
    """The largest micro-batch, a divisor of per_process sequences, whose training step and evaluation both peak
    within budget bytes (0 if none). Peaks grow linearly with the micro-batch: measured at 1 and 2 sequences, the
    line gives the candidate, which is then measured itself (and the next divisor down, while it does not fit)."""
    one, two = train_peak(config, 1, dtype, ddp), train_peak(config, 2, dtype, ddp)
    guess = 1 + (budget - one) // max(two - one, 1)
    for m in (d for d in range(per_process, 0, -1) if per_process % d == 0 and d <= max(guess, 1)):
        if max(train_peak(config, m, dtype, ddp), gla.peak_bytes(config, m, dtype, train=False)) <= budget:
            return m
    return 0


def device_memory(device):
    """Free bytes on a CUDA device, or the memory available to new processes on this host."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(args, configs, ctx, jobs):
    """UsageError (one line) when the largest run's measured training peak, times the processes that share the
    device (on a CPU: the --jobs workers, or the torchrun processes of this host), exceeds its free memory less
    MEMORY_MARGIN: before any model is built, so a run that cannot fit fails at once, not hours in."""
    per_process = args.batch_size // ctx.world_size
    micro, ddp = per_process // args.grad_accum, ctx.world_size > 1
    sharing = jobs * int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if ctx.device.type == "cpu" else 1
    worst = max(configs, key=lambda c: train_peak(c, micro, ctx.dtype, ddp))
    need, have = sharing * train_peak(worst, micro, ctx.dtype, ddp), device_memory(ctx.device)
    budget = (1 - MEMORY_MARGIN) * have
    if need > budget:
        fit = largest_micro_batch(worst, per_process, ctx.dtype, ddp, budget / sharing)
        advice = (f"--grad_accum {per_process // fit} ({fit} sequences per micro-batch) would fit" if fit else
                  "not even one sequence per micro-batch fits: use GPUs with more memory or a smaller model")
        raise UsageError(f"this run needs {need / 2**30:.1f} GiB on {ctx.device} (measured: {sharing} process(es), "
                         f"a training step of {micro} sequences) but {have / 2**30:.1f} GiB are free, "
                         f"{100 * MEMORY_MARGIN:.0f}% of it kept in reserve; {advice} (or fewer --jobs; "
                         "--dry_run --device_memory GIB plans without training)")


def jobs_of(args, ctx):
    """Processes that train seeds side by side, ctx.threads // jobs threads each: --jobs, else as many as seeds and
    threads allow on CPU; 1 on GPUs and under torchrun. Raises UsageError for more than that."""
    most = ctx.threads if ctx.device.type == "cpu" and ctx.world_size == 1 else 1
    if min(args.jobs or most, args.seeds) > most:
        raise UsageError(f"--jobs {args.jobs}: this run trains at most {most} seed(s) at once (one per CPU thread, "
                         f"torch has {ctx.threads}; one on GPUs and under torchrun); use --jobs {most} or fewer")
    return min(args.jobs or most, args.seeds)


def train_seeds(args, seeds, data, ctx, log):
    """Train every requested model for each seed in turn; {run folder: last evaluation}."""
    runs = [(v, d, s) for v, d, s in runs_of(args) if s in seeds]
    results = {}
    for variant, double_heads, seed in tqdm(runs, desc="ablation",
                                            disable=None if ctx.master and ctx.bars and len(runs) > 1 else True):
        run_args = argparse.Namespace(**{**vars(args), "seed": seed})  # the run's own seed, everything else shared
        results[run_dir(args.out_dir, variant, double_heads, seed)] = train_run(run_args, variant, double_heads, data,
                                                                                 ctx, log)
    return results


def train_seeds_in_processes(args, seeds, ctx, jobs):
    """Train the seeds side by side in `jobs` spawned processes of ctx.threads threads
    each; {run folder: last evaluation}. Tiny models use few cores well: one process per
    seed trains more tokens per second than one process using all the cores.

    The workers never outlive the ablation. They ignore SIGINT (a terminal's Ctrl-C
    reaches the whole process group) and read this process's STOP instead: a signal to it
    has each worker checkpoint after its step and return (Interrupted, raised here for
    all); a second one, or a worker's error (raised here), terminates them
    (Pool.__exit__), each run's last checkpoint whole (atomic writes)."""
    global STOP
    spawn = multiprocessing.get_context("spawn")
    STOP = spawn.RawValue("i", STOP.value)
    default = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited through exec: from the workers' first line
    try:
        pool = spawn.Pool(jobs, initializer=share_stop, initargs=(STOP,))
    finally:
        signal.signal(signal.SIGINT, default)
    with pool:
        parts = pool.starmap(train_seed_process, [(args, seed, ctx) for seed in seeds], chunksize=1)
    if any(isinstance(part, Interrupted) for part in parts):
        raise Interrupted(", ".join(str(part) for part in parts if isinstance(part, Interrupted)))
    return {folder: last for part in parts for folder, last in part.items()}


def share_stop(stop):
    """--jobs worker initializer: the parent's STOP."""
    global STOP
    STOP = stop


def train_seed_process(args, seed, ctx):
    """One --jobs worker: the runs of one seed, on ctx.threads threads."""
    # tqdm would create a multiprocessing lock (a named semaphore) here, which the
    # shared resource tracker then reports as "leaked" at exit; a thread lock suffices.
    tqdm.set_lock(threading.RLock())
    torch.set_num_threads(ctx.threads)
    data = TokenData.load(args.data, args.out_dir)  # the checked data, read again (corpus: from its cache)
    try:
        return train_seeds(args, [seed], data, ctx, lambda msg: print(msg, flush=True))
    except Interrupted as e:  # returned: raised, Pool would end the other workers before they checkpoint
        return e


def cli(argv=None):
    """main() with bad input reported as one line on stderr (under torchrun, by every
    rank, with its rank): exit status 2 for usage and data errors, 1 for a diverged run
    or a failed write. A signal's stop, one line too: 128 + its number (130 SIGINT, 143
    SIGTERM); KeyboardInterrupt: Ctrl-C before training, or a second signal."""
    STOP.value = 0
    rank = f"rank {os.environ['RANK']}: " if int(os.environ.get("WORLD_SIZE", 1)) > 1 else ""
    try:
        return main(argv)
    except (UsageError, gla.ConfigError, Diverged, WriteError) as e:
        print(f"train.py: error: {rank}{e}", file=sys.stderr)
        return 2 if isinstance(e, (UsageError, gla.ConfigError)) else 1
    except (Interrupted, KeyboardInterrupt) as e:
        stop = e if isinstance(e, Interrupted) else "stopped at once" if STOP.value else "interrupted"
        print(f"train.py: {rank}{stop}" + (": --resume continues" if STOP.value else ""), file=sys.stderr)
        return 128 + (STOP.value or signal.SIGINT)


if __name__ == "__main__":
    sys.exit(cli())

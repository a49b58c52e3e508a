"""
Train one configuration of the double-heads ablation, or all six; or sample from a trained run.

    python train.py --attn gla2 --double_heads        # one run, tiny preset, CPU ok
    python train.py --attn all                        # the six runs of the ablation
    torchrun --standalone --nproc_per_node=8 train.py --attn all --preset paper \\
        --data edu_fineweb100B/ --grad_accum 60 --compile
    python train.py --sample out/gla2/seed1337 --prompt "The return value"

The ablation (Liu et al., "Multi-Head Low-Rank Attention", ICLR 2026, arXiv 2603.02188) trains GQA, MLA and GLA-2 as
baseline and with doubled query heads (equal parameters and KV cache: gla.make_config), for seeds --seed, --seed + 1,
... A seed's runs share the data order, torch seed and validation batches (batch i is a pure function of (seed, i),
which also makes resuming exact), so plot.py's seed-by-seed difference cancels the data noise.

Writes <out_dir>/<run>/seed<seed>/{config.json, metrics.jsonl, ckpt.pt} (run = gqa, gqa_double_heads, mla, ...),
holding its .lock meanwhile. Bad input (a disk without room included): one line on stderr, exit status 2. Ctrl-C or
SIGTERM: a checkpoint after the current step, exit status 130 or 143; a second one stops at once.
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
import sys
import sysconfig
import tempfile
import threading
import time
from collections import namedtuple
from contextlib import ExitStack, contextmanager, nullcontext, suppress

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import gla
from bench import memory  # the memory pre-flight: a step's peak measured on fake tensors, as bench/memory.py plans

# Override the preset's model (gla.make_config derives everything else from them).
MODEL_FLAGS = ("n_layer", "n_embd", "head_dim", "block_size", "vocab_size", "n_head", "n_kv_head")
# llm.c / modded-nanogpt token shards: 256 int32 header [magic, version, n_tokens, ...], then uint16 tokens.
SHARD_MAGIC, SHARD_VERSION, SHARD_HEADER_INTS = 20240520, 1, 256
# Training defaults per preset; paper: the ablation as Liu et al.'s MLRA release trains it (8 GPUs, ~98B tokens).
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


class RunError(Exception):
    """A run cannot go on (a NaN loss, a file it cannot write): one line, exit status 1, earlier checkpoints kept."""


class Interrupted(Exception):
    """SIGINT / SIGTERM stopped training between two steps, checkpointed: one line, exit status 128 + signal."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line through cli(), not argparse's usage block
        raise UsageError(message)


def get_args(argv=None):
    """Parse and check the flags, filling per-preset defaults. Raises UsageError."""
    p = Parser(prog="train.py", description=__doc__.split("\n\n")[1],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default="gqa", choices=[*gla.VARIANTS, "all"], help="variant, or all six runs")
    p.add_argument("--double_heads", action="store_true", help="double the query heads (same KV cache)")
    p.add_argument("--preset", default="tiny", choices=list(gla.PRESETS))
    p.add_argument("--max_iters", type=int, help="optimizer steps (default: per preset)")
    p.add_argument("--batch_size", type=int, help="sequences per step, all processes together")
    p.add_argument("--grad_accum", type=int, default=1, help="micro-batches per process per step")
    model_help = ("layers", "model width", "head dim; MLA/GLA derive theirs from it", "sequence length",
                  "vocabulary size (bytes need 256)", "baseline query heads (default: n_embd / head_dim)",
                  "GQA KV heads (default: baseline n_head / 4)")
    for flag, text in zip(MODEL_FLAGS, model_help):
        p.add_argument(f"--{flag}", type=int, help=text if "default" in text else text + " (default: per preset)")
    p.add_argument("--learning_rate", type=float, help="peak learning rate")
    p.add_argument("--warmup_iters", type=int, help="linear warmup steps")
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--init", default="coupled", choices=["coupled", "independent"],
                   help="coupled: a seed's two arms share the draws of what they have in common (gla.GPT.couple_init)")
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
    p.add_argument("--jobs", type=int, help="CPU: seeds trained at once, one process each (default: all that fit)")
    p.add_argument("--allow_repeats", action="store_true", help="--preset paper: allow reading the data again")
    once = p.add_mutually_exclusive_group()  # --resume and --overwrite contradict each other
    once.add_argument("--resume", action="store_true", help="continue each run from its checkpoint")
    once.add_argument("--overwrite", action="store_true", help="start runs over even if they have a checkpoint")
    g = p.add_argument_group("sampling: train.py --sample RUN [RUN ...] --prompt TEXT (torchrun + --tp N: sharded)")
    g.add_argument("--sample", nargs="+", metavar="RUN", help="runs (ckpt.pt or folder) to sample from, by --seed")
    g.add_argument("--prompt", default="\n", help="text, or GPT-2 token ids without tiktoken (default: a newline)")
    g.add_argument("--max_new_tokens", type=int, help="default: fill the run's block_size")
    g.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    g.add_argument("--top_k", type=int, default=200, help="sample among the k likeliest tokens (0: all)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel processes (gloo on CPU, nccl on GPUs)")
    args = p.parse_args(argv)
    vars(args).update({k: v for k, v in TRAIN_DEFAULTS[args.preset].items() if getattr(args, k) is None})
    rules = [*((key, lambda v: v <= 0, "positive") for key in ("max_iters", "batch_size", "grad_accum", "eval_interval",
               "eval_iters", "ckpt_interval", "seeds", "jobs", *MODEL_FLAGS)),
             ("warmup_iters", lambda v: v < 0, "zero or more"),
             ("learning_rate", lambda v: not (math.isfinite(v) and v > 0), "a positive finite number"),
             ("grad_clip", lambda v: not (math.isfinite(v) and v > 0), "a positive finite number"),
             ("weight_decay", lambda v: not (math.isfinite(v) and v >= 0), "a finite number >= 0"),
             ("max_new_tokens", lambda v: v < 0, ">= 0")]
    for key, bad, need in rules:  # in this order: the first bad flag is the one reported
        value = getattr(args, key)
        if value is not None and bad(value):
            p.error(f"--{key} must be {need}, got {value}")
    if not (0 <= args.seed and args.seed + args.seeds <= 2**32):
        p.error(f"--seed must be in [0, 2**32 - seeds] = [0, {2**32 - args.seeds}], got {args.seed}")
    return args


def models_of(args):
    """(variant, double_heads) of each requested model."""
    all_six = [(v, d) for v in gla.VARIANTS for d in (False, True)]
    return all_six if args.attn == "all" else [(args.attn, args.double_heads)]


def runs_of(args):
    """(variant, double_heads, seed) of each run, seed by seed: an interrupted ablation has whole seeds to plot."""
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


def atomic_write(writers):
    """Write each file of {path: write(binary file)} to a fsynced temporary in its folder, then rename all into place:
    a kill leaves each file old or new; an error while writing (a full disk) replaces none. plot.py, bench/ use it."""
    tmp = {}
    try:
        for path, write in writers.items():
            path = pathlib.Path(path)
            tmp[path] = path.with_name(f".{path.name}.{os.urandom(4).hex()}")  # a random name: writers never collide
            with open(tmp[path], "xb") as f:  # a new file (O_EXCL), with the umask's usual permissions
                write(f)
                f.flush()
                os.fsync(f.fileno())  # on disk before it replaces the old file, even if the machine dies
        for path, name in tmp.items():
            os.replace(name, path)
    finally:
        for name in tmp.values():
            name.unlink(missing_ok=True)


# ----------------------------------------------------------------------------
# Data


def stdlib_corpus():
    """~2 MB of English that ships with every Python: pydoc_data.topics and the stdlib's docstrings (read by ast, never
    imported), shuffled with a fixed seed so the validation split (last 10%) is not the alphabet's last modules."""
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
        nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                                             ast.AsyncFunctionDef))]
        docs += [doc for doc in map(ast.get_docstring, nodes) if doc and len(doc) > 40]
    random.Random(0).shuffle(docs)
    return "\n\n".join(docs).encode("utf-8")


def read_shard(path):
    """Tokens of one llm.c shard (uint16, memory-mapped) after checking its header. Raises UsageError."""
    header, size = np.fromfile(path, dtype=np.int32, count=SHARD_HEADER_INTS), os.path.getsize(path)
    offset, fix = SHARD_HEADER_INTS * 4, "regenerate it with llm.c's dev/data/fineweb.py"
    if len(header) < SHARD_HEADER_INTS or header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
        raise UsageError(f"{path}: not an llm.c token shard (a {offset}-byte header opening {SHARD_MAGIC}, "
                         f"{SHARD_VERSION}; found {header[:2].tolist()} in {size} bytes); {fix}")
    n_tokens = int(header[2])
    if n_tokens < 0 or size != offset + 2 * n_tokens:
        raise UsageError(f"{path}: header says {n_tokens} tokens but the file holds {(size - offset) / 2:g}; "
                         f"the shard is truncated or corrupt, {fix}")
    return np.memmap(path, dtype=np.uint16, mode="r", offset=offset, shape=(n_tokens,))


def read_bin(path):
    """nanoGPT's train.bin / val.bin: raw uint16 tokens, memory-mapped."""
    size = os.path.getsize(path)
    if size % 2:
        raise UsageError(f"{path}: {size} bytes is not a whole number of uint16 tokens; the file is truncated")
    return np.memmap(path, dtype=np.uint16, mode="r") if size else np.zeros(0, np.uint16)


class TokenData:
    """Train and validation token streams and the deterministic batch sampler. Each split is a list of 1-D arrays
    (uint8 bytes or uint16 tokens, often memory-mapped shards); a window never crosses two arrays."""

    def __init__(self, train, val, source, fingerprint):
        self.splits = {"train": train, "val": val}
        self.source, self.fingerprint = source, fingerprint
        self.n_tokens = {name: sum(len(a) for a in arrays) for name, arrays in self.splits.items()}

    @classmethod
    def load(cls, spec, cache_dir, fingerprint=None):
        """spec None: the stdlib corpus (cached in cache_dir); a text file (bytes, 90/10 split); a folder with
        train.bin/val.bin or llm.c shards. fingerprint: the data's, if another process computed it (not read again)."""
        if spec is None:
            check_out_dir(cache_dir)
            path = pathlib.Path(cache_dir) / "stdlib_corpus.txt"
            if not path.exists():
                atomic_write({path: lambda f: f.write(stdlib_corpus())})
            return cls._from_bytes(path.read_bytes(), f"stdlib corpus ({path})", fingerprint)
        path = pathlib.Path(spec)
        if path.is_file():
            if path.suffix == ".bin":
                raise UsageError(f"--data {spec}: token files are read from their folder; pass --data {path.parent}")
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
        if not fingerprint:  # not all of 20 GB at every start: names, sizes, the first and last MiB of each file
            digest = hashlib.sha256()
            for p in sorted(path.glob("*.bin")):
                size = p.stat().st_size
                with open(p, "rb") as f:
                    digest.update(f"{p.name}:{size}".encode() + f.read(1 << 20))
                    f.seek(max(0, size - (1 << 20)))
                    digest.update(f.read())
            fingerprint = digest.hexdigest()[:16]
        return cls(train, val, f"token files in {path}", fingerprint)

    @classmethod
    def _from_bytes(cls, raw, source, fingerprint=None):
        if not raw:
            raise UsageError(f"{source} is empty")
        data = np.frombuffer(raw, dtype=np.uint8)
        n_train = int(0.9 * len(data))
        return cls([data[:n_train]], [data[n_train:]], source, fingerprint or hashlib.sha256(raw).hexdigest()[:16])

    def check(self, block_size, vocab_size):
        """UsageError if a split is shorter than one block + 1 or holds a token id >= vocab_size. Every token is
        scanned (~10 s for 10B memory-mapped tokens) so that bad data stops us before anything is written."""
        for name, arrays in self.splits.items():
            if max((len(a) for a in arrays), default=0) < block_size + 1:
                raise UsageError(f"{self.source}: the {name} split has no {block_size + 1} consecutive tokens "
                                 f"(one block + 1); use more data or a smaller --block_size")
            top = max(int(a.max()) for a in arrays if len(a))
            if top >= vocab_size:
                raise UsageError(f"{self.source}: {name} token id {top} >= vocab_size {vocab_size}; "
                                 f"pass --vocab_size {top + 1} or more (GPT-2 tokens: 50304)")

    def windows(self, split, block_size):
        """Per array of a split, its non-overlapping windows of block_size + 1 tokens: window w starts at token
        w * block_size, so its last token is the next one's first (as llm.c's loader reads)."""
        return np.array([max(len(a) - 1, 0) // block_size for a in self.splits[split]], dtype=np.int64)

    def batch(self, split, step, batch_size, block_size, seed, rank=0, world_size=1):
        """Inputs and next-token targets, (batch_size // world_size, block_size) int64 each on CPU: rows [rank B/W,
        (rank+1) B/W) of the global batch. Without replacement, pass by pass: global row j = step * batch_size + row
        is position j mod N of pass j // N over the split's N windows, ordered by a permutation of [0, N) keyed by
        (seed, split, pass) (no table of N entries): each pass reads every window once, as the paper reads each token
        once, in a new order. A pure function of (split, step, seed): all runs draw the same windows at a step, ranks'
        shares are disjoint, resuming needs no state."""
        arrays, counts = self.splits[split], self.windows(split, block_size)
        n, per = int(counts.sum()), batch_size // world_size
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


def permute(i, n, key, rounds=4):
    """A pseudo-random permutation of [0, n) keyed by key (a tuple of ints and bools) at the int64 indices i, in
    O(len(i)) memory: a balanced Feistel network (Luby, Rackoff 1988) on the fewest even bits holding n - 1, cycle
    walking (Black, Rogaway 2002) the values past n (domain < 4n for n >= 2: under 4 tries on average)."""
    half = (max(2, int(n - 1).bit_length()) + 1) // 2
    mask = np.uint64((1 << half) - 1)
    subkeys = [np.uint64(int.from_bytes(hashlib.blake2b(repr((key, r)).encode(), digest_size=8).digest(), "little"))
               for r in range(rounds)]
    def mix(x):  # splitmix64's finaliser (Steele, Lea, Flood 2014): a bijective scramble of uint64 values
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))
    x = np.asarray(i, dtype=np.uint64).copy()
    todo = np.ones(len(x), dtype=bool)
    with np.errstate(over="ignore"):  # uint64 products wrap, as the mix intends
        while todo.any():
            left, right = x[todo] >> np.uint64(half), x[todo] & mask
            for sub in subkeys:
                left, right = right, left ^ (mix(right ^ sub) & mask)
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
    """SIGINT (Ctrl-C) and SIGTERM set STOP: each run checkpoints after its step and stops; a second one raises
    KeyboardInterrupt at once, each run's last checkpoint kept."""
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
        return nullcontext() if self.dtype == torch.float32 else torch.autocast(self.device.type, dtype=self.dtype)

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
    world, kind = int(os.environ.get("WORLD_SIZE", 1)), device_type(args)
    dtype = getattr(torch, args.dtype or ("bfloat16" if kind == "cuda" else "float32"))
    if "RANK" not in os.environ:
        return Context(torch.device(args.device or kind), dtype)
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if kind == "cuda":
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if kind == "cuda" else "gloo")
    return Context(torch.device(f"cuda:{local}" if kind == "cuda" else "cpu"), dtype, rank, world)


def leave_process_group(finished):
    """Destroy torchrun's process group, if any. A rank that finished first waits at a barrier (a gloo rank that left
    while rank 0 still wrote its checkpoint aborted at exit); after an error, none: the others may never reach it."""
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
    """AdamW, betas (0.9, 0.95), eps 1e-8, weight decay on every parameter (RMSNorm gains too, where nanoGPT decays
    matrices only), as the MLRA release trains (Liu et al. 2026); fused (one kernel for all parameters)."""
    return torch.optim.AdamW(model.parameters(), lr=args.learning_rate, betas=(0.9, 0.95),
                             weight_decay=args.weight_decay, fused=True)


def run_spec(args, config, data, dtype):
    """What a run is: resuming under any other spec is refused. The data by its content: a moved folder resumes."""
    train = {k: getattr(args, k) for k in ("preset", "max_iters", "batch_size", "grad_accum", "learning_rate",
                                           "warmup_iters", "weight_decay", "grad_clip", "eval_interval",
                                           "eval_iters", "seed", "init")}
    train["dtype"] = str(dtype).removeprefix("torch.")
    return {"model": dataclasses.asdict(config), "train": train, "data": {"fingerprint": data.fingerprint}}


def spec_differences(saved, current):
    """Each key of the spec current that saved gives another value, as 'part.key: saved -> current'. A key only saved
    names a setting train.py no longer has, at the one value it still trains with: not a difference."""
    return [f"{part}.{key}: {saved.get(part, {}).get(key)!r} -> {value!r}" for part, values in current.items()
            for key, value in values.items() if saved.get(part, {}).get(key) != value]


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
    for line in path.read_text().splitlines() if path.exists() else []:
        with suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return [r for r in rows if isinstance(r, dict) and isinstance(r.get("iter"), int) and r["iter"] <= up_to_iter]


def micro_batches(x, y, n, device):
    """The n equal micro-batches of (x, y), this process's share of a batch, on device: no forward sees more."""
    micro = x.size(0) // n
    return [(x[m * micro:(m + 1) * micro].to(device), y[m * micro:(m + 1) * micro].to(device)) for m in range(n)]


@torch.no_grad()
def evaluate(model, data, args, ctx, block_size):
    """Mean loss on the validation batches 0..eval_iters-1 (every run's), in equal grad_accum micro-batches each."""
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
    """Forward and backward of this process's share (x, y) of a step's batch in grad_accum micro-batches (DDP
    averages the gradients on the last one); the step's mean loss over all processes."""
    total = 0.0
    for m, (xb, yb) in enumerate(micro_batches(x, y, args.grad_accum, ctx.device)):
        last = m == args.grad_accum - 1
        with ctx.autocast(), (nullcontext() if last or ctx.world_size == 1 else model.no_sync()):
            _, loss = model(xb, yb)
            (loss / args.grad_accum).backward()
        total += loss.item() / args.grad_accum
    return ctx.all_mean(total)


def load_state(model, state, where):
    """Load a state dict into model. Raises UsageError (one line, after `where`) naming missing, unexpected or misshapen
    entries."""
    own = model.state_dict()
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in sorted(own.keys() & state.keys())
              if tuple(state[k].shape) != tuple(own[k].shape)]
    problems = [f"{what}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}" for what, keys in (
        ("missing", sorted(own.keys() - state.keys())), ("unexpected", sorted(state.keys() - own.keys())),
        ("shape differs", shapes)) if keys]
    if problems:
        raise UsageError(f"{where}: the weights do not fit this model ({'; '.join(problems)})")
    model.load_state_dict(state)


def train_run(args, variant, double_heads, data, ctx, log):
    """Train (or resume, or skip if finished) the run of seed args.seed; returns its last evaluation."""
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
        load_state(model, ckpt["model"], f"cannot resume {ckpt_path}")
        optimizer.load_state_dict(ckpt["optimizer"])  # its saved `fused` flag wins: an old run continues unchanged
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
        # A full disk, a lost permission: one line naming the file; the files written before stay whole (atomic_write;
        # read_metrics drops an append's cut last line). torch.save's RuntimeError has the OSError as its context.
        try:
            if not append:
                return atomic_write({path: fill})
            with open(path, "ab") as f:
                fill(f)
        except (OSError, RuntimeError) as e:
            error = e if isinstance(e, OSError) else e.__context__
            if not isinstance(error, OSError):
                raise
            kept = f"the checkpoint of iteration {saved} and its metrics are kept" if saved else "no checkpoint yet"
            fix = "free space" if error.errno in (errno.ENOSPC, errno.EDQUOT) else "make it writable"
            raise RunError(f"cannot write {path}: {error.strerror or error}; {kept}: {fix}, then --resume") from None

    if ctx.master:
        if step == 0:  # starting over: a stale checkpoint must not be resumed later
            ckpt_path.unlink(missing_ok=True)
        folder.mkdir(parents=True, exist_ok=True)
        for tmp in folder.glob(".*.pt.*"):  # left by a process killed inside atomic_write
            tmp.unlink()
        info = {**spec, "data": {**spec["data"], "source": data.source}}
        write(folder / "config.json", lambda f: f.write(json.dumps(info, indent=2).encode()))
        # The metrics end exactly at the checkpoint: a resume neither repeats nor loses an evaluation.
        write(metrics_path, lambda f: f.write("".join(json.dumps(r) + "\n" for r in rows).encode()))
        log(f"{name}: {model.num_params():,} parameters, n_head {config.n_head}, ffn_hidden {config.ffn_hidden}, "
            f"KV cache {config.kv_cache_elems_per_token_per_layer} elements/token/layer")
    train_model = torch.compile(model) if args.compile else model
    if ctx.world_size > 1:
        train_model = DDP(train_model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                          gradient_as_bucket_view=True)  # no second copy of the gradients (bench/memory.py)
    tokens_per_step = args.batch_size * config.block_size

    def diverged(what):
        raise RunError(f"{name}: {what} at iteration {step}; stopped, the last good checkpoint is kept at "
                       f"{ckpt_path}" + ("" if ckpt_path.exists() else " (none yet)"))

    def save(step):
        nonlocal saved, elapsed
        elapsed = time.time() - t0
        if not all(torch.isfinite(p).all() for p in model.parameters()):  # a finite loss, then an overflowing update
            diverged("non-finite weights")
        if ctx.master:
            ckpt = dict(model=model.state_dict(), optimizer=optimizer.state_dict(), iter=step,
                        tokens=step * tokens_per_step, elapsed_s=elapsed, train_loss_sum=loss_sum,
                        train_loss_count=loss_count, config=spec)
            write(ckpt_path, lambda f: torch.save(ckpt, f))
        saved = step
    # disable=None: progress bars on a terminal only, so logs in files stay readable.
    bar = tqdm(total=args.max_iters, initial=step, desc=name, disable=None if ctx.master and ctx.bars else True,
               leave=False, dynamic_ncols=True)
    t0, last_log = time.time() - elapsed, time.time()
    try:
        while step < args.max_iters:
            if ctx.all_mean(float(STOP.value != 0)):  # between two steps, agreed by every process: a whole state
                if step != saved:
                    save(step)
                raise Interrupted(f"{name}: interrupted at iteration {step}")
            lr = lr_at(step, args)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = data.batch("train", step, args.batch_size, config.block_size, args.seed, ctx.rank, ctx.world_size)
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
            if bar.disable and time.time() - last_log > 60:  # no terminal (no tqdm bar): a line a minute
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
                save(step)
    finally:
        bar.close()  # an error message then starts on a clean line
    return rows[-1] if rows else None


# ----------------------------------------------------------------------------
# Sampling from a run: python train.py --sample out/gla2/seed1337 --prompt "The return value"


# How a run's prompt becomes token ids (encode: str -> list of int) and its ids become text (decode).
Codec = namedtuple("Codec", "name encode decode")


def _bytes_to_text(ids):
    # Nothing drawn is hidden: invalid UTF-8 (a half-learned character) shows as \xNN, ids past 255 as <id>.
    return b"".join(bytes([i]) if i < 256 else f"<{i}>".encode() for i in ids).decode(errors="backslashreplace")


def _parse_ids(prompt):
    try:
        return [int(t) for t in prompt.split()]
    except ValueError:
        raise UsageError("this run reads GPT-2 token ids and tiktoken is not installed: give --prompt as ids, "
                         "e.g. --prompt '464 2068 7586'") from None


def text_codec(config, source=None):
    """The Codec of a run from its data source (TokenData.source in config.json; None: 256 tokens mean bytes): bytes
    for the stdlib corpus and text files; GPT-2 ids for token files, as text through tiktoken if installed."""
    if config.vocab_size == 256 if source is None else not source.startswith("token files"):
        return Codec("bytes", lambda text: list(text.encode()), _bytes_to_text)
    try:
        import tiktoken
        enc = tiktoken.get_encoding("gpt2")
        return Codec("GPT-2 BPE (tiktoken)", enc.encode, enc.decode)
    except Exception:  # not installed, or its vocabulary file cannot be fetched (offline)
        return Codec("GPT-2 token ids", _parse_ids, lambda ids: " ".join(map(str, ids)))


def load_run(path):
    """(gla.GPTConfig, state dict, Codec) of a run, from its ckpt.pt or its folder; memory-mapped, so only the
    weights we load are read. Raises UsageError (one line) for a missing or unreadable checkpoint."""
    path = pathlib.Path(path)
    path = path / "ckpt.pt" if path.is_dir() else path
    if not path.is_file():
        raise UsageError(f"no checkpoint at {path}; pass a run's ckpt.pt or its folder (<out_dir>/<run>/seed<seed>)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        config, state = gla.GPTConfig(**ckpt["config"]["model"]), ckpt["model"]
    except Exception as e:  # truncated, not a checkpoint, or not train.py's
        first_line = (str(e).strip().splitlines() or [""])[0]
        raise UsageError(f"cannot read {path} as a train.py checkpoint ({type(e).__name__}: {first_line})") from None
    info = path.with_name("config.json")
    source = json.loads(info.read_text()).get("data", {}).get("source") if info.is_file() else None
    return config, state, text_codec(config, source)


def cache_report(model, full, rank, tp, length):
    """One line: what rank of tp holds of the full model (config `full`) and its KV cache at `length` tokens."""
    share = gla.tp_share(full, rank, tp)
    span = lambda noun, r: f"{noun}s {r.start}-{r.stop - 1}" if len(r) > 1 else f"{noun} {r.start}"  # noqa: E731
    caches = [block.attn.cache for block in model.blocks]
    nbytes = sum(c.k_cache[:, :, :length].nbytes + c.v_cache[:, :, :length].nbytes for c in caches)
    return (f"rank {rank}/{tp}: {span('query head', share.heads)} of {full.n_head}, "
            f"{span('KV head' if full.attn == 'gqa' else 'latent head', share.groups)} of {full.n_groups}, "
            f"{span('MLP column', share.ffn)} | KV cache: {model.config.kv_cache_elems_per_token_per_layer} elements "
            f"per token per layer (one process: {full.kv_cache_elems_per_token_per_layer}), {nbytes:,} bytes at "
            f"{length} tokens ({len(caches)} layers x batch {caches[0].k_cache.shape[0]}, {caches[0].k_cache.dtype})")


def sample_runs(args):
    """--sample: text and tokens/s from each run through GPT.generate (KV cache, decode path). With --tp N under
    torchrun each rank builds the full model, keeps its shard (gla.shard_for_tp) and generates; the all-reduces give
    all ranks the same logits, hence tokens, which we check. Bad input: UsageError on every rank alike."""
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
        config, state, codec = load_run(path)
        gla.tp_share(config, 0, args.tp)  # ConfigError for a --tp the model cannot split
        prompt, capacity = codec.encode(args.prompt), config.block_size  # positions past it were never trained
        new = capacity - len(prompt) if args.max_new_tokens is None else args.max_new_tokens
        if not prompt or len(prompt) >= capacity:
            raise UsageError(f"{path}: the prompt is {len(prompt)} tokens ({codec.name}); it needs 1 to "
                             f"{capacity - 1} to fit the cache of block_size={capacity} with a new token")
        if not 0 <= min(prompt) <= max(prompt) < config.vocab_size:
            raise UsageError(f"{path}: prompt token ids must lie in [0, vocab_size={config.vocab_size}), got "
                             f"{min(prompt)} to {max(prompt)}")
        if len(prompt) + new > capacity:
            raise UsageError(f"{path}: a {len(prompt)}-token prompt + --max_new_tokens {new} exceed the cache of "
                             f"block_size={capacity} tokens; lower --max_new_tokens or shorten the prompt")
        jobs.append((path, config, state, codec, prompt, new))
    ctx, finished = setup_context(args), False
    try:
        for path, config, state, codec, prompt, new in jobs:
            model = gla.GPT(config)
            load_state(model, state, path)
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
            ranks = [(cache_report(model, config, ctx.rank, world, len(tokens)), tokens)] * world
            if world > 1:
                dist.all_gather_object(ranks, ranks[0])  # replaces every entry with that rank's
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


# ----------------------------------------------------------------------------
# Pre-flight checks (memory: bench/memory.py) and the ablation


def check_out_dir(out_dir):
    """UsageError unless out_dir is (or can become) a writable folder."""
    try:
        pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out_dir).close()
    except OSError as e:
        raise UsageError(f"--out_dir {out_dir} is not a writable folder ({e.strerror}); choose another") from None


CKPT_SLACK = 2**20  # a checkpoint's bytes beyond 12 a parameter (the zip's headers, the spec), generously
METRICS_ROW_BYTES = 256  # a metrics.jsonl row takes about 200


def check_disk(args, configs, jobs):
    """UsageError unless --out_dir's disk has room: each run's checkpoint (12 bytes a parameter: float32 weights, two
    AdamW moments) less its ckpt.pt's size, one more per --jobs process (atomic_write's old + new), the metrics."""
    with torch.device("meta"):  # parameters counted without memory
        size = {model: 12 * gla.GPT(c).num_params() + CKPT_SLACK for model, c in zip(models_of(args), configs)}
    runs, free = runs_of(args), shutil.disk_usage(args.out_dir).free
    have = [(run_dir(args.out_dir, *run) / "ckpt.pt") for run in runs]
    need = sum(max(0, size[run[:2]] - (p.stat().st_size if p.exists() else 0)) for run, p in zip(runs, have))
    need += jobs * max(size.values()) + len(runs) * METRICS_ROW_BYTES * (args.max_iters // args.eval_interval + 1)
    if need > free:
        raise UsageError(f"--out_dir {args.out_dir}: {len(runs)} run(s) need {need / 2**20:,.1f} MiB of disk (their "
                         f"checkpoints, a copy while one is replaced, metrics) but {free / 2**20:,.1f} MiB are free; "
                         "free space or choose another --out_dir")


def lock_runs(stack, folders):
    """Hold each run folder until stack closes: an exclusive flock on <folder>/.lock, naming its holder, which the
    kernel drops with the process (no stale lock after a kill -9). UsageError for a folder another process holds."""
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
        print(f"process {os.getpid()} on {os.uname().nodename}", file=lock, flush=True)


def main(argv=None):
    """Train the requested runs, or sample (--sample); returns 0. Raises UsageError / ConfigError for bad input,
    RunError for a NaN loss or a failed write, Interrupted after a signal."""
    args = get_args(argv)
    if args.sample:
        return sample_runs(args)
    configs = [model_config(args, v, d) for v, d in models_of(args)]  # ConfigError before anything is written
    check_batch(args, int(os.environ.get("WORLD_SIZE", 1)))
    folders = [run_dir(args.out_dir, *run) for run in runs_of(args)]
    trained = [folder for folder in folders if (folder / "ckpt.pt").exists()]
    if trained and not (args.resume or args.overwrite):  # a forgotten --resume must not discard days of training
        raise UsageError(f"{trained[0]} already holds a trained run; "
                         "pass --resume to continue it, --overwrite to start over, or another --out_dir")
    ctx = setup_context(args)
    jobs = jobs_of(args, ctx)
    memory.check_memory(args, configs, ctx, jobs)  # refuses a run that would not fit, before building it
    log = tqdm.write if ctx.master else (lambda msg: None)
    block_size = configs[0].block_size  # one for every run: the preset's or --block_size
    data, passes = load_data(args, ctx, block_size, min(c.vocab_size for c in configs))
    check_out_dir(args.out_dir)
    with ExitStack() as locks, stop_on_signals():  # rank 0 holds the run folders (for any --jobs workers too)
        on_master(ctx, lambda: (check_disk(args, configs, jobs), lock_runs(locks, folders)))
        where = f"{jobs} processes of {ctx.threads // jobs} thread(s)" if jobs > 1 else f"{ctx.world_size} process(es)"
        log(f"data: {data.source}, {data.n_tokens['train']:,} train / {data.n_tokens['val']:,} val tokens, "
            f"sha256 {data.fingerprint}; {where} on {ctx.device}, {args.dtype or ctx.dtype}")
        log(f"training: {passes}, windows of {block_size} tokens drawn without replacement")
        seeds = list(range(args.seed, args.seed + args.seeds))
        results = train_seeds(args, seeds, data, ctx, log) if jobs == 1 else train_seeds_in_processes(
            args, seeds, dataclasses.replace(ctx, threads=ctx.threads // jobs, bars=False), jobs)
    for folder, last in results.items():
        if last:
            log(f"{folder}: final val loss {last['val_loss']:.4f} after {last['tokens']:,} tokens")
    leave_process_group(finished=True)
    return 0


def check_batch(args, world):
    """UsageError unless --batch_size splits into world processes x --grad_accum micro-batches."""
    if args.batch_size % (world * args.grad_accum):
        raise UsageError(f"--batch_size {args.batch_size} is not divisible by {world} process(es) x "
                         f"--grad_accum {args.grad_accum}; pick a multiple")


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
    """This process's TokenData and the check_passes line: rank 0 loads, scans and fingerprints the data (on_master);
    the others map the files with its fingerprint."""
    loaded = []
    def check():
        loaded.append(TokenData.load(args.data, args.out_dir))
        loaded[0].check(block_size, vocab_size)
        return loaded[0].fingerprint, check_passes(args, loaded[0], block_size)
    fingerprint, passes = on_master(ctx, check)
    return loaded[0] if ctx.master else TokenData.load(args.data, args.out_dir, fingerprint), passes


def check_passes(args, data, block_size):
    """'T tokens per run = P passes over N' (the training split's N). The paper reads FineWeb-Edu 100BT once: under
    --preset paper, a run that would read its data again is refused (UsageError) unless --allow_repeats."""
    tokens = args.max_iters * args.batch_size * block_size
    pass_tokens = int(data.windows("train", block_size).sum()) * block_size
    passes = tokens / pass_tokens
    if args.preset == "paper" and passes > 1 and not args.allow_repeats:
        raise UsageError(f"--preset paper reads its training data once, as the paper does, but {tokens:,} "
                         f"tokens per run are {passes:.2f} passes over the {pass_tokens:,} of {data.source}; "
                         "use more data (FineWeb-Edu sample-100BT, see README), fewer --max_iters, or --allow_repeats")
    return f"{tokens:,} tokens per run = {passes:.2f} passes over {pass_tokens:,}"


def jobs_of(args, ctx):
    """Processes training seeds side by side: --jobs, else as many as seeds and threads allow on CPU; 1 on GPUs and
    under torchrun. UsageError for more."""
    most = ctx.threads if ctx.device.type == "cpu" and ctx.world_size == 1 else 1
    if min(args.jobs or most, args.seeds) > most:
        raise UsageError(f"--jobs {args.jobs}: this run trains at most {most} seed(s) at once (one per CPU thread, "
                         f"torch has {ctx.threads}; one on GPUs and under torchrun); use --jobs {most} or fewer")
    return min(args.jobs or most, args.seeds)


def train_seeds(args, seeds, data, ctx, log):
    """Train every requested model for each seed in turn; {run folder: last evaluation}."""
    runs = [(v, d, s) for v, d, s in runs_of(args) if s in seeds]
    results = {}
    for v, d, seed in tqdm(runs, desc="ablation", disable=None if ctx.master and ctx.bars and len(runs) > 1 else True):
        run_args = argparse.Namespace(**{**vars(args), "seed": seed})  # the run's own seed, everything else shared
        results[run_dir(args.out_dir, v, d, seed)] = train_run(run_args, v, d, data, ctx, log)
    return results


def train_seeds_in_processes(args, seeds, ctx, jobs):
    """Train the seeds side by side in `jobs` spawned processes of ctx.threads threads (tiny models use few cores well);
    {run folder: last evaluation}. Workers ignore SIGINT (Ctrl-C reaches the process group) and read our STOP: each
    checkpoints and returns Interrupted (raised here); a second signal or a worker's error terminates them all."""
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
    tqdm.set_lock(threading.RLock())  # not tqdm's named semaphore, which the resource tracker reports as leaked
    torch.set_num_threads(ctx.threads)
    data = TokenData.load(args.data, args.out_dir)  # the checked data, read again (corpus: from its cache)
    try:
        return train_seeds(args, [seed], data, ctx, lambda msg: print(msg, flush=True))
    except Interrupted as e:  # returned: raised, Pool would end the other workers before they checkpoint
        return e


def cli(argv=None):
    """main(), errors as one line on stderr (each torchrun rank with its rank): exit status 2 for usage and data, 1
    for a diverged run or failed write, 128 + signal after a stop (KeyboardInterrupt: before training, or twice)."""
    STOP.value = 0
    rank = f"rank {os.environ['RANK']}: " if int(os.environ.get("WORLD_SIZE", 1)) > 1 else ""
    try:
        return main(argv)
    except (UsageError, gla.ConfigError, RunError) as e:
        print(f"train.py: error: {rank}{e}", file=sys.stderr)
        return 2 if isinstance(e, (UsageError, gla.ConfigError)) else 1
    except (Interrupted, KeyboardInterrupt) as e:
        stop = e if isinstance(e, Interrupted) else "stopped at once" if STOP.value else "interrupted"
        print(f"train.py: {rank}{stop}" + (": --resume continues" if STOP.value else ""), file=sys.stderr)
        return 128 + (STOP.value or signal.SIGINT)


if __name__ == "__main__":
    sys.exit(cli())

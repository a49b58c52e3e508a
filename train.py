"""
Train the double-heads ablation, one of its models or all six; sample text from a trained run.

    python train.py --attn gla2 --double_heads        # one model (two seeds on the tiny preset), CPU ok
    python train.py --attn all                        # the six models of the ablation
    torchrun --standalone --nproc_per_node=8 train.py --attn all --preset paper \\
        --data edu_fineweb100B/ --grad_accum 60 --compile
    python train.py --sample out/gla2/seed1337 --prompt "The return value"    # text from a trained run

The ablation (Liu et al., "Multi-Head Low-Rank Attention", ICLR 2026, arXiv 2603.02188) trains GQA, MLA and GLA-2
twice each: as they are (the baseline) and with their query heads doubled at equal parameters and KV cache
(gla.make_config). Each model trains for seeds --seed, --seed + 1, ...; the two runs of a seed see the same batches
and the same validation batches, so plot.py's seed-by-seed difference cancels the data's noise.

Read top to bottom: the flags, the data and its batches, where we compute, the schedule and the optimizer, one step
and evaluation, the run files, the loop of one run, sampling, and main. Each run writes <out_dir>/<run>/seed<seed>/:
config.json (what the run is), metrics.jsonl (one evaluation a line) and ckpt.pt (what an exact resume needs).
"""

import argparse
import ast
import dataclasses
import functools
import hashlib
import json
import math
import os
import pathlib
import platform
import random
import signal
import sys
import sysconfig
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import gla

# ----------------------------------------------------------------------------
# The flags

# Training defaults per preset. paper: the ablation as Liu et al.'s MLRA release trains it, ~98B tokens on 8 GPUs.
TRAIN_DEFAULTS = {
    "tiny": dict(max_iters=400, batch_size=16, learning_rate=2e-3, warmup_iters=200,
                 eval_interval=25, eval_iters=8, ckpt_interval=100, seeds=2),
    "small": dict(max_iters=10000, batch_size=64, learning_rate=6e-4, warmup_iters=500,
                  eval_interval=250, eval_iters=20, ckpt_interval=1000, seeds=1),
    "paper": dict(max_iters=100000, batch_size=480, learning_rate=1.6e-4, warmup_iters=2000,
                  eval_interval=1000, eval_iters=20, ckpt_interval=1000, seeds=1),
}
# Flags that override the preset's model; gla.make_config derives everything else from them.
MODEL_FLAGS = {
    "n_layer": "layers",
    "n_embd": "model width",
    "head_dim": "head dim; MLA/GLA derive theirs from it",
    "block_size": "sequence length",
    "vocab_size": "vocabulary size (bytes need 256)",
    "n_head": "baseline query heads (default: n_embd / head_dim)",
    "n_kv_head": "GQA KV heads (default: baseline n_head / 4)",
    "kv_lora_rank": "MLA/GLA latent, all latent heads together (default: 4 head_dim)",
}
# The flags that define a run besides its model: a resume under other values is refused.
TRAIN_SPEC = ("preset", "max_iters", "batch_size", "grad_accum", "learning_rate", "warmup_iters", "weight_decay",
              "grad_clip", "eval_interval", "eval_iters", "seed", "init")


class Error(Exception):
    """What the command line prints as one line before it exits with `status`: 2 for bad input (nothing written),
    1 for a run that cannot go on (its last checkpoint kept), 128 + N after signal N stopped training."""

    def __init__(self, message, status=2):
        super().__init__(message)
        self.status = status


class ArgumentParser(argparse.ArgumentParser):
    """argparse, whose errors are one Error line instead of its usage block."""

    def error(self, message):
        raise Error(message)


def get_args(argv=None):
    """Parse the training flags and fill in the preset's defaults. Raises Error for a flag out of its range."""
    p = ArgumentParser(prog="train.py", description=__doc__.split("\n\n")[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="Sampling has flags of its own: python train.py --sample RUN --help")
    p.add_argument("--attn", default="gqa", choices=[*gla.VARIANTS, "all"], help="variant, or all six models")
    p.add_argument("--double_heads", action="store_true", help="double the query heads (same KV cache)")
    p.add_argument("--preset", default="tiny", choices=list(gla.PRESETS))
    p.add_argument("--max_iters", type=int, help="optimizer steps (default: per preset)")
    p.add_argument("--batch_size", type=int, help="sequences per step, all processes together")
    p.add_argument("--grad_accum", type=int, default=1, help="micro-batches per process per step")
    for flag, text in MODEL_FLAGS.items():
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
    p.add_argument("--seeds", type=int, help="seeds per model: --seed, --seed + 1, ... (default: per preset)")
    once = p.add_mutually_exclusive_group()  # --resume and --overwrite contradict each other
    once.add_argument("--resume", action="store_true", help="continue each run from its checkpoint")
    once.add_argument("--overwrite", action="store_true", help="start runs over even if they have a checkpoint")
    args = p.parse_args(argv)
    for key, value in TRAIN_DEFAULTS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    positive = ["max_iters", "batch_size", "grad_accum", "eval_interval", "eval_iters", "ckpt_interval", "seeds",
                "learning_rate", "grad_clip", *MODEL_FLAGS]
    for name in positive:
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            p.error(f"--{name} must be a positive number, got {value}")
    for name in ("warmup_iters", "weight_decay"):
        if not (math.isfinite(getattr(args, name)) and getattr(args, name) >= 0):
            p.error(f"--{name} must be zero or more, got {getattr(args, name)}")
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if args.batch_size % (world_size * args.grad_accum):
        p.error(f"--batch_size {args.batch_size} does not split into {world_size} process(es) x --grad_accum "
                f"{args.grad_accum} micro-batches; pick a multiple")
    if args.attn == "all" and args.double_heads:
        p.error("--double_heads picks one arm of a variant, but --attn all trains both arms of all three")
    return args


# ----------------------------------------------------------------------------
# The runs of the ablation: a model (variant, double heads or not) and a seed


def models_of(args):
    """(variant, double_heads) of each model to train."""
    if args.attn == "all":
        return [(variant, double_heads) for variant in gla.VARIANTS for double_heads in (False, True)]
    return [(args.attn, args.double_heads)]


def runs_of(args):
    """(variant, double_heads, seed) of each run, seed by seed: an interrupted ablation has whole seeds to plot."""
    return [(v, d, seed) for seed in range(args.seed, args.seed + args.seeds) for v, d in models_of(args)]


def run_name(variant, double_heads):
    """Folder name of a model under --out_dir: gqa, gqa_double_heads, mla, ..."""
    return variant + ("_double_heads" if double_heads else "")


def run_dir(out_dir, variant, double_heads, seed):
    """Folder of one run: <out_dir>/<run name>/seed<seed>."""
    return pathlib.Path(out_dir, run_name(variant, double_heads), f"seed{seed}")


def model_config(args, variant, double_heads):
    """The GPTConfig of a model: the preset, the variant, and the model flags. Raises Error naming the model."""
    overrides = {flag: getattr(args, flag) for flag in MODEL_FLAGS if getattr(args, flag) is not None}
    try:
        return gla.make_config(args.preset, variant, double_heads, **overrides)
    except gla.ConfigError as e:
        raise Error(f"{run_name(variant, double_heads)}: {e}") from None


# ----------------------------------------------------------------------------
# The data: bytes of text, or token files, read in windows of block_size + 1 tokens

# llm.c's token shards, as its dev/data/fineweb.py writes FineWeb-Edu: a header of 256 int32, [SHARD_MAGIC,
# SHARD_VERSION, n_tokens, 0, ...], then n_tokens uint16 GPT-2 tokens.
SHARD_MAGIC = 20240520
SHARD_VERSION = 1
SHARD_HEADER_BYTES = 256 * 4


@functools.cache
def stdlib_corpus():
    """~2 MB of English that ships with every Python, so that the default run downloads nothing: pydoc_data.topics
    and the standard library's docstrings (read with ast, never imported), shuffled with a fixed seed so that the
    validation split (the last 10%) is not the alphabet's last modules. Bytes; another Python gives another corpus."""
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
    """The tokens of one llm.c shard, uint16, memory-mapped (a 100B-token corpus costs no RAM), its header checked."""
    header = np.fromfile(path, dtype=np.int32, count=3)
    size = os.path.getsize(path)
    n_tokens = int(header[2]) if len(header) == 3 else -1
    if header[:2].tolist() != [SHARD_MAGIC, SHARD_VERSION] or size != SHARD_HEADER_BYTES + 2 * n_tokens:
        raise Error(f"{path}: not a whole llm.c token shard (header {header.tolist()}, {size} bytes); regenerate "
                    "it with llm.c's dev/data/fineweb.py")
    return np.memmap(path, dtype=np.uint16, mode="r", offset=SHARD_HEADER_BYTES, shape=(n_tokens,))


def read_bin(path):
    """nanoGPT's train.bin / val.bin: raw uint16 tokens, memory-mapped."""
    if os.path.getsize(path) % 2:
        raise Error(f"{path}: {os.path.getsize(path)} bytes is not a whole number of uint16 tokens; it is truncated")
    return np.memmap(path, dtype=np.uint16, mode="r")


class TokenData:
    """A corpus's train and validation splits, each a list of 1-D token arrays (uint8 bytes, or uint16 tokens); a
    window never crosses two arrays. source: what the corpus is, for config.json and the log."""

    def __init__(self, train, val, source):
        self.splits = {"train": train, "val": val}
        self.source = source
        self.n_tokens = {name: sum(len(a) for a in arrays) for name, arrays in self.splits.items()}

    @classmethod
    def from_bytes(cls, raw, source):
        """Bytes as tokens (vocabulary 256): the first 90% train, the rest validation."""
        data = np.frombuffer(raw, dtype=np.uint8)
        n_train = int(0.9 * len(data))
        return cls([data[:n_train]], [data[n_train:]], source)

    def windows(self, split, block_size):
        """Per array of a split, its count of windows of block_size + 1 tokens: window w starts at token
        w * block_size, so its last token is the next one's first (as llm.c's loader reads)."""
        return np.array([max(len(a) - 1, 0) // block_size for a in self.splits[split]], dtype=np.int64)

    def read_rows(self, split, rows, block_size, seed):
        """The windows of rows `rows` (int64: row j of the run's whole sequence of batches), (len(rows), block_size + 1)
        int64. Row j reads window j mod N of pass j // N over the split's N windows, each pass in the order of a
        permutation keyed by (seed, split, pass)."""
        arrays = self.splits[split]
        counts = self.windows(split, block_size)
        n = int(counts.sum())
        passes, positions = np.divmod(rows, n)
        window = np.empty_like(positions)
        for p in np.unique(passes):  # a batch spans two passes only where it meets a pass's end
            here = passes == p
            window[here] = permute(positions[here], n, (seed, split == "val", int(p)))
        ends = np.cumsum(counts)
        which = np.searchsorted(ends, window, side="right")  # the array of each window
        offsets = (window - (ends - counts)[which]) * block_size
        tokens = [arrays[w][o:o + block_size + 1] for w, o in zip(which, offsets)]
        return np.stack(tokens).astype(np.int64)


def load_data(spec, block_size):
    """The corpus of --data: None, the stdlib corpus; a text file, its bytes; a folder, nanoGPT's train.bin /
    val.bin or llm.c's token shards (*_train_*.bin, *_val_*.bin). Raises Error naming --data."""
    if spec is None:
        data = TokenData.from_bytes(stdlib_corpus(), f"stdlib corpus of Python {platform.python_version()}")
    elif pathlib.Path(spec).is_file():
        if spec.endswith(".bin"):
            raise Error(f"--data {spec}: token files are read from their folder; pass --data {os.path.dirname(spec)}")
        data = TokenData.from_bytes(pathlib.Path(spec).read_bytes(), f"text file {spec}")
    else:
        path = pathlib.Path(spec)
        if (path / "train.bin").is_file() and (path / "val.bin").is_file():
            train = [read_bin(path / "train.bin")]
            val = [read_bin(path / "val.bin")]
        else:
            train = [read_shard(p) for p in sorted(path.glob("*_train_*.bin"))]
            val = [read_shard(p) for p in sorted(path.glob("*_val_*.bin"))]
        if not train or not val:
            raise Error(f"--data {spec}: neither a text file nor a folder with train.bin/val.bin or llm.c shards")
        data = TokenData(train, val, f"token files in {spec}")
    for split, arrays in data.splits.items():
        if max(len(a) for a in arrays) < block_size + 1:
            raise Error(f"{data.source}: the {split} split has no {block_size + 1} consecutive tokens (one block + 1); "
                        "use more data or a smaller --block_size")
    return data


def splitmix64(x):
    """splitmix64's finaliser (Steele, Lea, Flood 2014, "Fast splittable pseudorandom number generators"): a
    bijective scramble of uint64 values; products wrap around, as it intends."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def permute(i, n, key, rounds=4):
    """A pseudo-random permutation of [0, n) keyed by `key` (a tuple of ints and bools), at the int64 indices i, in
    O(len(i)) memory, so that no table of N entries is needed even at the paper's N = 48M windows: a balanced Feistel
    network (Luby, Rackoff 1988) on the fewest even bits that hold n - 1, cycle walking (Black, Rogaway 2002) the
    values that land past n (the domain is < 4n for n >= 2: under 4 tries on average)."""
    half = (max(2, int(n - 1).bit_length()) + 1) // 2
    mask = np.uint64((1 << half) - 1)
    subkeys = []
    for r in range(rounds):
        digest = hashlib.blake2b(repr((key, r)).encode(), digest_size=8).digest()
        subkeys.append(np.uint64(int.from_bytes(digest, "little")))
    x = np.asarray(i, dtype=np.uint64).copy()
    todo = np.ones(len(x), dtype=bool)
    with np.errstate(over="ignore"):  # uint64 products wrap, as splitmix64 intends
        while todo.any():
            left = x[todo] >> np.uint64(half)
            right = x[todo] & mask
            for subkey in subkeys:
                left, right = right, left ^ (splitmix64(right ^ subkey) & mask)
            x[todo] = (left << np.uint64(half)) | right
            todo[todo] = x[todo] >= n
    return x.astype(np.int64)


def get_batch(data, split, step, batch_size, block_size, seed, rank=0, world_size=1):
    """Inputs and next-token targets of one step, (batch_size // world_size, block_size) int64 each, on the CPU: this
    process's rows [rank B/W, (rank + 1) B/W) of the step's B = batch_size rows, rows step * B + row of the run's
    sequence of windows (TokenData.read_rows), each read once a pass, as the paper reads each token once. So every
    run of a seed sees the same batches, torchrun's processes read disjoint rows, and resuming at step s needs no
    state of the data: batch s is what it was."""
    per_process = batch_size // world_size
    rows = step * batch_size + np.arange(rank * per_process, (rank + 1) * per_process)
    windows = torch.from_numpy(data.read_rows(split, rows, block_size, seed))  # (per_process, block_size + 1)
    return windows[:, :-1], windows[:, 1:]


# ----------------------------------------------------------------------------
# Where we compute: the device, the autocast dtype, and torchrun's processes (nanoGPT's DDP set-up)


@dataclasses.dataclass
class Context:
    """device: where the model lives; dtype: autocast's (float32: none); rank, world_size: this process among
    torchrun's (rank 0 writes the files and the log)."""
    device: torch.device
    dtype: torch.dtype
    rank: int = 0
    world_size: int = 1

    @property
    def master(self):
        return self.rank == 0

    def autocast(self):
        if self.dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def all_sum(self, t):
        """The tensor t summed over every process (in place: one all-reduce); t itself in a process alone."""
        if self.world_size > 1:
            dist.all_reduce(t)
        return t


def setup(device=None, dtype=None):
    """The Context of this process from --device and --dtype (None: cuda when available; bfloat16 on cuda, float32
    on a CPU). Under torchrun (RANK set) it joins the process group: NCCL and a GPU per process, or gloo on CPUs."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise Error(f"--device {device} but CUDA is not available here; use --device cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise Error(f"--device {device}: use cpu or cuda")
    dtype = getattr(torch, dtype or ("bfloat16" if device.startswith("cuda") else "float32"))
    if "RANK" not in os.environ:
        return Context(torch.device(device), dtype)
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if device.startswith("cuda"):
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        return Context(torch.device("cuda", local_rank), dtype, rank, world_size)
    dist.init_process_group("gloo")
    return Context(torch.device("cpu"), dtype, rank, world_size)


def log(ctx, message):
    """Print a line from rank 0, which speaks for every process, above the progress bar."""
    if ctx.master:
        tqdm.write(message)


# ----------------------------------------------------------------------------
# The schedule and the optimizer, as the MLRA release trains (Liu et al. 2026)


def lr_at(step, args):
    """Linear warmup to the peak, then cosine decay to 0.1 x the peak at max_iters."""
    peak = args.learning_rate
    if step < args.warmup_iters:
        return peak * (step + 1) / args.warmup_iters
    done = min(1.0, (step - args.warmup_iters) / max(1, args.max_iters - args.warmup_iters))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))


def make_optimizer(model, args):
    """AdamW, betas (0.9, 0.95), eps 1e-8, weight decay on every parameter (the RMSNorm gains too, where nanoGPT
    decays matrices only), fused (one kernel for all parameters)."""
    return torch.optim.AdamW(model.parameters(), lr=args.learning_rate, betas=(0.9, 0.95),
                             weight_decay=args.weight_decay, fused=True)


# ----------------------------------------------------------------------------
# One step, and evaluation


def micro_batches(x, y, n, device):
    """The n equal micro-batches of (x, y), this process's share of a batch, on `device`: no forward sees more."""
    return [(xb.to(device), yb.to(device)) for xb, yb in zip(x.chunk(n), y.chunk(n))]


def train_step(model, x, y, args, ctx):
    """Forward and backward of this process's share (x, y) of a step's batch, in grad_accum micro-batches whose
    gradients add up (DDP averages them over the processes on the last one); this process's mean loss of the step,
    a float64 tensor on the device, read by the caller (no wait for the device here). The optimizer step is the
    caller's."""
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for m, (xb, yb) in enumerate(micro_batches(x, y, args.grad_accum, ctx.device)):
        last = m == args.grad_accum - 1
        # Under DDP, only the last micro-batch's backward all-reduces the gradients.
        sync = nullcontext() if last or ctx.world_size == 1 else model.no_sync()
        with ctx.autocast(), sync:
            _, loss = model(xb, yb)
            (loss / args.grad_accum).backward()
        total += loss.detach().double() / args.grad_accum  # float64: no float32 rounding in the step's sum
    return total


@torch.no_grad()
def evaluate(model, data, args, ctx, block_size):
    """Mean loss on the validation batches 0 .. eval_iters - 1 (every run of the seed evaluates on the same ones), in
    the training step's micro-batches, summed on the device: one wait for it, at the end."""
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for k in range(args.eval_iters):
        x, y = get_batch(data, "val", k, args.batch_size, block_size, args.seed, ctx.rank, ctx.world_size)
        for xb, yb in micro_batches(x, y, args.grad_accum, ctx.device):
            with ctx.autocast():
                _, loss = model(xb, yb)
            total += loss.double()
    model.train()
    return ctx.all_sum(total / (args.eval_iters * args.grad_accum)).item() / ctx.world_size


# ----------------------------------------------------------------------------
# The run files: config.json, metrics.jsonl, ckpt.pt


def run_spec(args, config, data, ctx):
    """What a run is, saved in config.json and in every checkpoint: its model (a gla.GPTConfig), its training flags
    (TRAIN_SPEC) and autocast dtype, and its data. A resume under another spec is refused."""
    train = {key: getattr(args, key) for key in TRAIN_SPEC}
    train["dtype"] = str(ctx.dtype).removeprefix("torch.")
    data_spec = {"source": data.source, "train_tokens": data.n_tokens["train"], "val_tokens": data.n_tokens["val"]}
    return {"model": dataclasses.asdict(config), "train": train, "data": data_spec}


def write_file(path, content):
    """Write bytes, or torch.save a checkpoint, to path through a temporary beside it that os.replace swaps in whole:
    a kill leaves the old file or the new one, never half of either. A full disk or a lost permission is one Error
    line (status 1), and every file saved before stays as it was."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as f:
            if isinstance(content, bytes):
                f.write(content)
            else:
                torch.save(content, f)
        os.replace(temporary, path)
    except (OSError, RuntimeError) as e:
        error = e if isinstance(e, OSError) else e.__context__  # torch.save wraps a failed write in a RuntimeError
        if not isinstance(error, OSError):
            raise
        if temporary.exists():  # a full disk's room back
            temporary.unlink()
        raise Error(f"cannot write {path} ({error.strerror}); what the run saved before is kept: free space or make "
                    "it writable, then --resume", status=1) from None


def write_metrics(path, rows):
    """Write a run's evaluations (dicts) as metrics.jsonl, one JSON line each, whole (write_file)."""
    write_file(path, "".join(json.dumps(row) + "\n" for row in rows).encode())


def read_metrics(path, up_to_iter=math.inf):
    """The evaluations in a run's metrics.jsonl (a list of dicts) up to iteration up_to_iter."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [row for row in rows if row["iter"] <= up_to_iter]


def check_run_folder(folder, args):
    """Refuse (Error) to start a run whose folder holds saved work, unless told what to do with it: --resume
    continues its checkpoint, --overwrite starts it over. Evaluations past the first checkpoint's step without a
    ckpt.pt (deleted to save disk, say) cannot be resumed: --resume would erase them, so only --overwrite may."""
    if args.overwrite:
        return
    has_checkpoint = (folder / "ckpt.pt").exists()
    rows = read_metrics(folder / "metrics.jsonl")
    if not args.resume and (has_checkpoint or rows):
        raise Error(f"{folder} holds a run; pass --resume to continue it, --overwrite to start it over, or another "
                    "--out_dir")
    if args.resume and not has_checkpoint and rows and rows[-1]["iter"] > min(args.ckpt_interval, args.max_iters):
        raise Error(f"{folder} holds evaluations up to iteration {rows[-1]['iter']} but no ckpt.pt to resume from; "
                    "pass --overwrite to start it over (its metrics are lost), or another --out_dir")


def load_checkpoint(path, spec):
    """The checkpoint at path (weights_only: loading it runs no code), if it was saved under `spec`. Raises Error."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        saved = ckpt["config"]
    except Exception as e:  # a truncated or foreign file: unpickling fails in many ways, all meaning the same here
        raise Error(f"cannot resume {path}: not a checkpoint of train.py ({type(e).__name__}); --overwrite starts "
                    "it over") from None
    differences = [f"{part}.{key}: {saved.get(part, {}).get(key)!r} -> {value!r}"
                   for part, values in spec.items() for key, value in values.items()
                   if saved.get(part, {}).get(key) != value]
    if differences:
        raise Error(f"cannot resume {path}: it was trained with another setup ({', '.join(differences)}); "
                    "--overwrite starts it over, or use another --out_dir")
    return ckpt


# ----------------------------------------------------------------------------
# The loop of one run, with its checkpoints and an exact resume


class StopSignal:
    """Ctrl-C (SIGINT) or SIGTERM (what `timeout` and job schedulers send) asks training to stop: the loop saves a
    checkpoint after the step it is in, and ends the command. A second signal stops at once."""

    def __init__(self):
        self.signum = 0

    def __call__(self, signum, frame):
        if self.signum:
            raise KeyboardInterrupt
        self.signum = signum


def train_run(args, variant, double_heads, data, ctx, stop, bar):
    """Train the run of seed args.seed (or resume it, or skip it if finished), advancing the job's progress bar.
    Raises Error for a loss that is not finite, a file it cannot write, a checkpoint that does not match, and after
    a signal (with a checkpoint saved)."""
    name = f"{run_name(variant, double_heads)} seed {args.seed}"
    config = model_config(args, variant, double_heads)
    spec = run_spec(args, config, data, ctx)
    folder = run_dir(args.out_dir, variant, double_heads, args.seed)
    ckpt_path = folder / "ckpt.pt"

    # The model: the same init in every process and at every resume, from the seed alone.
    torch.manual_seed(args.seed)
    model = gla.GPT(config)
    if args.init == "coupled":  # common random numbers with the other arm of the pair
        model.couple_init(args.seed, model_config(args, variant, not double_heads))
    model.to(ctx.device)
    optimizer = make_optimizer(model, args)

    # Resume: weights, AdamW's state, the step, the time and the running train loss. The data needs nothing: batch s
    # is a function of (seed, s).
    step = 0
    elapsed = 0.0  # seconds trained before this process
    loss_sum = 0.0  # the train losses since the last evaluation, which reports their mean
    loss_count = 0
    if args.resume and ckpt_path.exists():
        ckpt = load_checkpoint(ckpt_path, spec)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        step = ckpt["iter"]
        elapsed = ckpt["elapsed_s"]
        loss_sum = ckpt["train_loss_sum"]
        loss_count = ckpt["train_loss_count"]
        del ckpt  # the model and the optimizer hold copies now: no second set of weights for the whole run
        bar.total -= step  # the job's bar counts the steps left to train
        bar.refresh()
        if step >= args.max_iters:
            log(ctx, f"{name}: finished at iteration {step}, skipped")
            return
        log(ctx, f"{name}: resuming at iteration {step}")
    rows = read_metrics(folder / "metrics.jsonl", step)  # the evaluations up to the checkpoint: none lost or repeated
    if ctx.master:
        if step == 0 and ckpt_path.exists():
            ckpt_path.unlink()  # started over: an old checkpoint must never be resumed later
        write_file(folder / "config.json", json.dumps(spec, indent=2).encode())
        write_metrics(folder / "metrics.jsonl", rows)
    log(ctx, f"{name}: {model.num_params():,} parameters, n_head {config.n_head}, ffn_hidden {config.ffn_hidden}, "
             f"KV cache {config.kv_cache_elems_per_token_per_layer} elements/token/layer")

    train_model = torch.compile(model) if args.compile else model
    if ctx.world_size > 1:  # gradient_as_bucket_view: the gradients live in DDP's buckets, not in a second copy
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        train_model = DDP(train_model, device_ids=device_ids, gradient_as_bucket_view=True)
    tokens_per_step = args.batch_size * config.block_size
    started = time.time() - elapsed
    while step < args.max_iters:
        lr = lr_at(step, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(data, "train", step, args.batch_size, config.block_size, args.seed, ctx.rank, ctx.world_size)
        loss = train_step(train_model, x, y, args, ctx)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        # The step's one wait for the device: its loss, its gradient norm and whether a signal asks us to stop, in
        # one tensor summed over the processes, so that all of them agree.
        stopping = torch.full((), float(stop.signum != 0), dtype=torch.float64, device=ctx.device)
        step_stats = torch.stack([loss, grad_norm.double(), stopping])
        loss, grad_norm, stopping = ctx.all_sum(step_stats).tolist()
        step_loss = loss / ctx.world_size
        grad_norm /= ctx.world_size
        if not math.isfinite(step_loss) or not math.isfinite(grad_norm):
            raise Error(f"{name}: loss {step_loss}, gradient norm {grad_norm} at iteration {step}; stopped, its last "
                        "checkpoint kept", status=1)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        loss_sum += step_loss
        loss_count += 1
        bar.update()

        if step % args.eval_interval == 0 or step == args.max_iters:
            val_loss = evaluate(model, data, args, ctx, config.block_size)
            elapsed = time.time() - started
            rows.append(dict(iter=step, tokens=step * tokens_per_step, train_loss=loss_sum / loss_count,
                             val_loss=val_loss, lr=lr, elapsed_s=round(elapsed, 3),
                             tokens_per_s=round(step * tokens_per_step / elapsed, 1)))
            loss_sum = 0.0
            loss_count = 0
            if ctx.master:
                write_metrics(folder / "metrics.jsonl", rows)
            log(ctx, f"{name} iter {step}: train {rows[-1]['train_loss']:.4f} val {val_loss:.4f}")
        if step % args.ckpt_interval == 0 or step == args.max_iters or stopping:
            # Weights that went non-finite (a finite loss, then an overflowing update) are never saved.
            if not all(torch.isfinite(p).all() for p in model.parameters()):
                raise Error(f"{name}: non-finite weights at iteration {step}; stopped, its last checkpoint kept",
                            status=1)
            if ctx.master:
                write_file(ckpt_path, dict(model=model.state_dict(), optimizer=optimizer.state_dict(), iter=step,
                                           tokens=step * tokens_per_step, elapsed_s=time.time() - started,
                                           train_loss_sum=loss_sum, train_loss_count=loss_count, config=spec))
        if stopping:  # a signal stops us between two steps, with a whole state saved
            raise Error(f"{name}: interrupted at iteration {step}: --resume continues",
                        status=128 + (stop.signum or signal.SIGINT))  # 0: a torchrun peer got it


class LogLines:
    """The progress bar's file off a terminal (a log): each redraw, a carriage return and the bar's text, becomes a
    line of its own, where tqdm would write one endless line of carriage returns."""

    def write(self, text):
        text = text.strip("\r ")
        if text:
            print(text, flush=True)

    def flush(self):
        pass


def train_job(args, ctx):
    """Train every run, seed by seed, in this process, under one progress bar for the whole job. A step of any of the
    six models costs about the same (the width rule gives them equal parameters), so the bar counts steps."""
    runs = runs_of(args)
    block_size = model_config(args, *runs[0][:2]).block_size  # one for every run: the preset's or --block_size
    data = load_data(args.data, block_size)
    pass_tokens = int(data.windows("train", block_size).sum()) * block_size
    log(ctx, f"data: {data.source}, {data.n_tokens['train']:,} train / {data.n_tokens['val']:,} val tokens; "
             f"{ctx.world_size} process(es) on {ctx.device}, {ctx.dtype}")
    log(ctx, f"training: {args.max_iters * args.batch_size * block_size:,} tokens per run = "
             f"{args.max_iters * args.batch_size * block_size / pass_tokens:.2f} passes over {pass_tokens:,}")
    on_terminal = sys.stderr.isatty()
    bar = tqdm(total=len(runs) * args.max_iters, desc="the job", unit="step", disable=not ctx.master,
               file=sys.stderr if on_terminal else LogLines(), mininterval=0.1 if on_terminal else 60,
               dynamic_ncols=on_terminal)
    stop = StopSignal()
    handlers = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for variant, double_heads, seed in runs:
            run_args = argparse.Namespace(**vars(args))
            run_args.seed = seed  # the run's own seed; every other flag is the job's
            train_run(run_args, variant, double_heads, data, ctx, stop, bar)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        bar.close()


# ----------------------------------------------------------------------------
# Sampling: text from trained runs through GPT.generate (the KV cache and the decode path), on one process or
# tensor-parallel: under torchrun each of N processes keeps 1/N of the model (gla.shard_for_tp) and its cache.


def cache_report(model, full, rank, tp, length):
    """One line: what rank of tp holds of the full model (config `full`) and its KV cache at `length` tokens."""
    share = gla.tp_share(full, rank, tp)
    caches = [block.attn.cache for block in model.blocks]
    nbytes = sum(c.k_cache[:, :, :length].nbytes + c.v_cache[:, :, :length].nbytes for c in caches)
    group = "KV head" if full.attn == "gqa" else "latent head"
    return (f"rank {rank}/{tp}: query heads {share.heads.start}-{share.heads.stop - 1} of {full.n_head}, "
            f"{group}s {share.groups.start}-{share.groups.stop - 1} of {full.n_groups} | KV cache: "
            f"{model.config.kv_cache_elems_per_token_per_layer} elements per token per layer (one process: "
            f"{full.kv_cache_elems_per_token_per_layer}), {nbytes:,} bytes at {length} tokens")


def load_model(path, dtype):
    """A trained model on the CPU in dtype: a run of train.py (its ckpt.pt or its folder, memory-mapped: only what we
    load is read), or a folder of the MLRA release (config.json and pytorch_model*.bin: gla.GPT.from_pretrained).
    Raises Error."""
    path = pathlib.Path(path)
    try:
        if path.is_dir() and not (path / "ckpt.pt").exists() and (path / "config.json").exists():
            return gla.GPT.from_pretrained(path, dtype)
        ckpt = torch.load(path / "ckpt.pt" if path.is_dir() else path, map_location="cpu", weights_only=True, mmap=True)
        model = gla.GPT(gla.GPTConfig(**ckpt["config"]["model"]))
        model.load_state_dict(ckpt["model"])
        return model.to(dtype)
    except gla.ConfigError as e:
        raise Error(str(e)) from None
    except Exception as e:  # missing, truncated, or neither train.py's nor the release's
        raise Error(f"cannot read {path} ({type(e).__name__}): pass a run of train.py, <out_dir>/<run>/seed<seed>, "
                    "or a folder of the MLRA release") from None


def get_sample_args(argv):
    """The flags of train.py --sample (training's are refused here, as these are by get_args)."""
    p = ArgumentParser(prog="train.py --sample", description="Sample text from trained models, and measure their loss.")
    p.add_argument("--sample", nargs="+", metavar="MODEL", required=True,
                   help="runs of train.py (<out_dir>/<run>/seed<seed> or a ckpt.pt) or folders of the MLRA release")
    p.add_argument("--prompt", default="\n")
    p.add_argument("--max_new_tokens", type=int, default=100, help="at most the model's block_size, prompt included")
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top_k", type=int, default=200, help="sample among the k likeliest tokens (0: all)")
    p.add_argument("--seed", type=int, default=1337, help="torch seed of the draws, and of the validation windows")
    p.add_argument("--data", help="also print the loss on this data's validation split (as --data of training)")
    p.add_argument("--eval_iters", type=int, default=10, help="validation windows of block_size tokens for --data")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the weights' dtype")
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step")
    args = p.parse_args(argv)
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        p.error(f"--temperature must be >= 0 (0: greedy), got {args.temperature}")
    if args.top_k < 0 or args.max_new_tokens < 1 or args.eval_iters < 1:
        p.error("--top_k must be >= 0 (0: every token), --max_new_tokens and --eval_iters >= 1")
    return args


def sample(argv):
    """train.py --sample MODEL [MODEL ...]: print each model's text, its speed, what each process's cache holds and,
    with --data, its validation loss."""
    args = get_sample_args(argv)
    ctx = setup(args.device, args.dtype)
    for path in args.sample:
        model = load_model(path, ctx.dtype)
        config = model.config
        model.to(ctx.device).eval()
        if ctx.world_size > 1:
            try:
                gla.shard_for_tp(model, ctx.rank, ctx.world_size)
            except gla.ConfigError as e:
                raise Error(f"{path}: {e}") from None
        if config.vocab_size == 256:  # bytes are tokens (the stdlib corpus, text files)
            prompt = list(args.prompt.encode("utf-8", errors="surrogateescape"))  # argv's non-UTF-8 bytes back
        else:  # GPT-2 tokens (token files, the release)
            try:
                import tiktoken
            except ImportError:
                raise Error(f"{path} reads GPT-2 tokens: pip install tiktoken") from None
            encoding = tiktoken.get_encoding("gpt2")
            prompt = encoding.encode(args.prompt)
        if not prompt or len(prompt) + args.max_new_tokens > config.block_size:
            raise Error(f"{path}: a prompt of {len(prompt)} tokens and --max_new_tokens {args.max_new_tokens} must "
                        f"fit the model's block_size of {config.block_size} tokens")
        torch.manual_seed(args.seed)
        started = time.perf_counter()
        idx = torch.tensor([prompt], device=ctx.device)
        tokens = model.generate(idx, args.max_new_tokens, args.temperature, args.top_k, compile=args.compile)
        tokens = tokens[0].tolist()  # .tolist() waits for the GPU
        seconds = time.perf_counter() - started
        reports = [cache_report(model, config, ctx.rank, ctx.world_size, len(tokens))] * ctx.world_size
        if ctx.world_size > 1:
            dist.all_gather_object(reports, reports[0])  # every rank's line, for rank 0 to print
        if config.vocab_size == 256:
            text = bytes(tokens).decode("utf-8", errors="backslashreplace")  # a half-learned character shows as \xNN
        else:
            text = encoding.decode(tokens)
        log(ctx, f"== {path}: {config.attn}, {config.n_head} query heads, temperature {args.temperature}\n{text}\n"
                 f"-- {args.max_new_tokens} new tokens in {seconds:.3f} s (batch 1, prefill included)")
        for report in reports:
            log(ctx, report)
        if args.data:  # the loss on validation windows 0 .. eval_iters - 1, one at a time, as training reads them
            data = load_data(args.data, config.block_size)
            total = 0.0
            for k in range(args.eval_iters):
                x, y = get_batch(data, "val", k, 1, config.block_size, args.seed)
                with torch.no_grad():
                    total += model(x.to(ctx.device), y.to(ctx.device))[1].item()
            log(ctx, f"-- validation loss {total / args.eval_iters:.4f} nats a token over {args.eval_iters} windows of "
                     f"{config.block_size} tokens of {data.source}")


# ----------------------------------------------------------------------------
# main


def main(argv=None):
    """Check the input, then train the requested runs. Raises Error."""
    args = get_args(argv)
    # Everything that needs neither a device nor data is checked before anything is written: every model builds (and
    # its twin, which --init coupled draws against), and no run folder holds what this command would erase.
    for variant, double_heads in models_of(args):
        model_config(args, variant, double_heads)
        if args.init == "coupled":
            model_config(args, variant, not double_heads)
    for run in runs_of(args):
        check_run_folder(run_dir(args.out_dir, *run), args)
    ctx = setup(args.device, args.dtype)
    train_job(args, ctx)


def cli(argv=None):
    """The command line: `train.py --sample ...` samples; anything else trains. An error is one line on stderr
    (under torchrun, with the rank); returns the exit status (Error's)."""
    argv = sys.argv[1:] if argv is None else argv
    rank = f"rank {os.environ['RANK']}: " if int(os.environ.get("WORLD_SIZE", 1)) > 1 else ""
    try:
        if "--sample" in argv:
            sample(argv)
        else:
            main(argv)
        if dist.is_initialized():  # under torchrun: every process waits for rank 0's last writes, then leaves
            dist.barrier()
            dist.destroy_process_group()
        return 0
    except Error as e:
        print(f"train.py: {'error: ' if e.status < 128 else ''}{rank}{e}", file=sys.stderr)
        return e.status
    except KeyboardInterrupt:  # a second signal, or one before training began
        print(f"train.py: {rank}interrupted: --resume continues from each run's last checkpoint", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(cli())

"""
Train the double-heads ablation, one of its models or all six; sample text from a trained model.

    python train.py --attn gla2 --double_heads        # one model (two seeds on the tiny preset), CPU ok
    python train.py --attn all                        # the six models of the ablation
    python train.py --sample out/gla2/seed1337 --prompt "The return value"    # text from a trained run

The ablation (Liu et al., "Multi-Head Low-Rank Attention", ICLR 2026, arXiv 2603.02188) trains GQA, MLA and GLA-2
as they are and with their query heads doubled at equal parameters and KV cache, for seeds --seed, --seed + 1, ...
Each run writes <out_dir>/<run>/seed<seed>/: config.json, metrics.jsonl (an evaluation a line) and ckpt.pt.
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

# ---- The flags
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
MODEL_FLAGS = ("n_layer", "n_embd", "head_dim", "block_size", "vocab_size", "n_head", "n_kv_head", "kv_lora_rank")
# The flags that define a run besides its model: a resume under other values is refused.
TRAIN_SPEC = ("preset", "max_iters", "batch_size", "grad_accum", "learning_rate", "warmup_iters", "weight_decay",
              "grad_clip", "eval_interval", "eval_iters", "seed", "init")


def positive(text):
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"expected an integer above zero, got {text!r}")
    return int(text)


def positive_float(text):
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number above zero, got {text!r}")
    return value


def get_args(argv=None):
    """Parse the flags of training and of sampling (--sample) and fill in the preset's training defaults."""
    p = argparse.ArgumentParser(prog="train.py", usage="python train.py [flags] (--help lists them)")
    p.add_argument("--attn", default="gqa", choices=[*gla.VARIANTS, "all"], help="variant, or all six models")
    p.add_argument("--double_heads", action="store_true", help="double the query heads (same KV cache)")
    p.add_argument("--preset", default="tiny", choices=list(gla.PRESETS))
    p.add_argument("--max_iters", type=positive)  # None: the preset's (TRAIN_DEFAULTS), here and below
    p.add_argument("--batch_size", type=positive, help="sequences per step, all processes together")
    p.add_argument("--grad_accum", type=positive, default=1, help="micro-batches per process per step")
    for flag in MODEL_FLAGS:
        p.add_argument(f"--{flag}", type=positive)
    p.add_argument("--learning_rate", type=positive_float)
    p.add_argument("--warmup_iters", type=int)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--init", default="coupled", choices=["coupled", "independent"],
                   help="coupled: a seed's two arms share their common draws (gla.GPT.couple_init)")
    p.add_argument("--grad_clip", type=positive_float, default=1.0)
    p.add_argument("--eval_interval", type=positive)
    p.add_argument("--eval_iters", type=positive)
    p.add_argument("--ckpt_interval", type=positive)
    p.add_argument("--out_dir", default="out")
    p.add_argument("--data", help="a text file (bytes), or a folder of llm.c token shards (default: stdlib corpus)")
    p.add_argument("--device", choices=["cuda", "cpu"])  # None: cuda when available
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="autocast's, or a sampled model's")
    p.add_argument("--compile", action="store_true", help="torch.compile the model for training")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--seeds", type=positive, help="seeds per model: --seed, --seed + 1, ...")
    once = p.add_mutually_exclusive_group()
    once.add_argument("--resume", action="store_true", help="continue each run from its checkpoint")
    once.add_argument("--overwrite", action="store_true", help="start each run over")
    sampling = p.add_argument_group("sampling", "--sample samples instead of training")
    sampling.add_argument("--sample", nargs="+", metavar="RUN", help="<out_dir>/<run>/seed<seed>, or its ckpt.pt")
    sampling.add_argument("--prompt", default="\n")
    sampling.add_argument("--max_new_tokens", type=positive, default=100)
    sampling.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    sampling.add_argument("--top_k", type=int, default=200, help="0: all")
    args = p.parse_args(argv)
    for key, value in TRAIN_DEFAULTS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if args.batch_size % (world_size * args.grad_accum):
        p.error(f"--batch_size {args.batch_size} does not split into {world_size} process(es) x --grad_accum")
    if args.attn == "all" and args.double_heads:
        p.error("--attn all trains both arms: no --double_heads")
    if args.warmup_iters < 0 or not 0 <= args.weight_decay < math.inf:
        p.error("--warmup_iters and --weight_decay must be 0 or more")
    return args


# ---- The runs of the ablation: a model (variant, double heads or not) and a seed
def models_of(args):
    if args.attn == "all":
        return [(variant, double_heads) for variant in gla.VARIANTS for double_heads in (False, True)]
    return [(args.attn, args.double_heads)]


def runs_of(args):
    """(variant, double_heads, seed) of each run, seed by seed: an interrupted ablation has whole seeds to plot."""
    return [(v, d, seed) for seed in range(args.seed, args.seed + args.seeds) for v, d in models_of(args)]


def run_name(variant, double_heads):
    return variant + ("_double_heads" if double_heads else "")


def run_dir(out_dir, variant, double_heads, seed):
    return pathlib.Path(out_dir, run_name(variant, double_heads), f"seed{seed}")


def model_config(args, variant, double_heads):
    """The GPTConfig of a model from the preset, the variant and the model flags; what gla.py asserts, one line."""
    overrides = {flag: getattr(args, flag) for flag in MODEL_FLAGS if getattr(args, flag) is not None}
    try:
        return gla.make_config(args.preset, variant, double_heads, **overrides)
    except AssertionError as e:
        raise SystemExit(f"train.py: {run_name(variant, double_heads)}: {e}") from None


# ---- The data: bytes of text, or llm.c's token shards, read in windows of block_size + 1 tokens
# llm.c's token shards, as its dev/data/fineweb.py writes FineWeb-Edu: a header of 256 int32, [SHARD_MAGIC,
# SHARD_VERSION, n_tokens, 0, ...], then n_tokens uint16 GPT-2 tokens.
SHARD_MAGIC = 20240520
SHARD_VERSION = 1
SHARD_HEADER_BYTES = 256 * 4


@functools.cache
def stdlib_corpus():
    """~2 MB of English that ships with every Python, so that the default run downloads nothing: pydoc_data.topics
    and the standard library's docstrings (read with ast, never imported), shuffled with a fixed seed so that the
    validation split (the last 10%) mixes all modules."""
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
    """The tokens of one llm.c shard, uint16, memory-mapped (100B tokens cost no RAM), its header checked."""
    header = np.fromfile(path, dtype=np.int32, count=3)
    size = os.path.getsize(path)
    n_tokens = int(header[2]) if len(header) == 3 else -1
    if header[:2].tolist() != [SHARD_MAGIC, SHARD_VERSION] or size != SHARD_HEADER_BYTES + 2 * n_tokens:
        raise SystemExit(f"train.py: {path}: not a whole llm.c shard (header {header.tolist()}, {size} bytes): "
                         "regenerate it with llm.c's dev/data/fineweb.py")
    return np.memmap(path, dtype=np.uint16, mode="r", offset=SHARD_HEADER_BYTES, shape=(n_tokens,))


class TokenData:
    """A corpus's train and validation splits, each a list of 1-D token arrays (uint8 bytes, or uint16 tokens); a
    window never crosses two arrays. source: what the corpus is; tokenizer: "bytes" or "gpt2"."""

    def __init__(self, train, val, source, tokenizer):
        self.splits = {"train": train, "val": val}
        self.source = source
        self.tokenizer = tokenizer
        self.n_tokens = {name: sum(len(a) for a in arrays) for name, arrays in self.splits.items()}

    @classmethod
    def from_bytes(cls, raw, source):
        """Bytes as tokens (vocabulary 256): the first 90% train, the rest validation."""
        data = np.frombuffer(raw, dtype=np.uint8)
        n_train = int(0.9 * len(data))
        return cls([data[:n_train]], [data[n_train:]], source, "bytes")

    def windows(self, split, block_size):
        """Per array of a split, its count of windows of block_size + 1 tokens, each starting at the last token of the
        one before (as llm.c's loader reads)."""
        return np.array([max(len(a) - 1, 0) // block_size for a in self.splits[split]], dtype=np.int64)

    def read_rows(self, split, rows, block_size, seed):
        """The windows (len(rows), block_size + 1) int64 of rows `rows` of the run: row j reads window j mod N of pass
        j // N over the split's N windows, each pass permuted by (seed, split, pass)."""
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


# The vocabulary each tokenizer's ids need (GPT-2's 50,257; the presets pad it to 50,304).
TOKENIZER_VOCAB = {"bytes": 256, "gpt2": 50257}


def load_data(spec, block_size, vocab_size):
    """The corpus of --data: None, the stdlib corpus; a text file, its bytes; a folder, llm.c's GPT-2 token shards
    (*_train_*.bin, *_val_*.bin). The model's vocab_size must hold the data's token ids."""
    if spec is None:
        data = TokenData.from_bytes(stdlib_corpus(), f"stdlib corpus of Python {platform.python_version()}")
    elif os.path.isfile(spec):
        data = TokenData.from_bytes(pathlib.Path(spec).read_bytes(), f"text file {spec}")
    else:
        train = [read_shard(p) for p in sorted(pathlib.Path(spec).glob("*_train_*.bin"))]
        val = [read_shard(p) for p in sorted(pathlib.Path(spec).glob("*_val_*.bin"))]
        if not train or not val:
            raise SystemExit(f"train.py: --data {spec}: neither a text file nor a folder of llm.c token shards")
        data = TokenData(train, val, f"token files in {spec}", "gpt2")
    for split, arrays in data.splits.items():
        if max(len(a) for a in arrays) < block_size + 1:
            raise SystemExit(f"train.py: {data.source}: its {split} split has no {block_size + 1} tokens in a row")
    if vocab_size < TOKENIZER_VOCAB[data.tokenizer]:
        raise SystemExit(f"train.py: {data.tokenizer} tokens need a --vocab_size of {TOKENIZER_VOCAB[data.tokenizer]}")
    return data


def permute(i, n, key, rounds=4):
    """A pseudo-random permutation of [0, n) keyed by `key` (a tuple), at the int64 indices i, with no table of n
    entries: a balanced Feistel network (Luby, Rackoff 1988) on the fewest even bits that hold n - 1, its round
    function splitmix64's finaliser; values past n walk the cycle on (Black, Rogaway 2002), under 4 tries on average."""
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
                z = right ^ subkey
                z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
                z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
                left, right = right, left ^ ((z ^ (z >> np.uint64(31))) & mask)
            x[todo] = (left << np.uint64(half)) | right
            todo[todo] = x[todo] >= n
    return x.astype(np.int64)


def get_batch(data, split, step, batch_size, block_size, seed, rank=0, world_size=1):
    """Inputs and next-token targets of one step, (batch_size // world_size, block_size) int64 each, on the CPU: this
    process's share of rows step * B .. step * B + B - 1 of the run's windows. A function of (seed, step) alone: the
    two arms of a seed see the same batches, and a resume needs no state of the data."""
    per_process = batch_size // world_size
    rows = step * batch_size + np.arange(rank * per_process, (rank + 1) * per_process)
    windows = torch.from_numpy(data.read_rows(split, rows, block_size, seed))  # (per_process, block_size + 1)
    return windows[:, :-1], windows[:, 1:]


# ---- Where we compute: the device, the autocast dtype, and torchrun's processes (nanoGPT's DDP set-up)
@dataclasses.dataclass
class Context:
    """device: where the model lives; dtype: autocast's (float32: none), and a sampled model's; rank, world_size:
    this process among torchrun's (rank 0 writes the files and the log)."""
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
        if self.world_size > 1:
            dist.all_reduce(t)
        return t


def setup(device=None, dtype=None):
    """The Context of this process from --device and --dtype (None: cuda if available; bfloat16 on cuda, else
    float32). Under torchrun it joins the process group (NCCL, or gloo on CPUs)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train.py: --device cuda, but CUDA is not available")
    dtype = getattr(torch, dtype or ("bfloat16" if device == "cuda" else "float32"))
    if "RANK" not in os.environ:
        return Context(torch.device(device), dtype)
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if device == "cpu":
        dist.init_process_group("gloo")
        return Context(torch.device("cpu"), dtype, rank, world_size)
    local_rank = int(os.environ["LOCAL_RANK"])
    if local_rank >= torch.cuda.device_count():
        raise SystemExit(f"train.py: --nproc_per_node exceeds the {torch.cuda.device_count()} GPUs")
    gpu = torch.device("cuda", local_rank)
    torch.cuda.set_device(gpu)
    dist.init_process_group("nccl", device_id=gpu)
    return Context(gpu, dtype, rank, world_size)


def log(ctx, message):
    """Print a line from rank 0, which speaks for every process, above the progress bar."""
    if ctx.master:
        tqdm.write(message)


# ---- The schedule and the optimizer, as the MLRA release trains (Liu et al. 2026)
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


# ---- One step, and evaluation
def micro_batches(x, y, n, device):
    return [(xb.to(device), yb.to(device)) for xb, yb in zip(x.chunk(n), y.chunk(n))]


def train_step(model, x, y, args, ctx):
    """Forward and backward of this process's share (x, y) of a step's batch in grad_accum micro-batches (DDP
    all-reduces on the last one). Returns the mean loss as a float64 tensor on the device: no wait for it here."""
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for m, (xb, yb) in enumerate(micro_batches(x, y, args.grad_accum, ctx.device)):
        last = m == args.grad_accum - 1
        sync = nullcontext() if last or ctx.world_size == 1 else model.no_sync()
        with sync:
            with ctx.autocast():  # the forward only: backward runs in the dtypes the forward chose
                _, loss = model(xb, yb)
            (loss / args.grad_accum).backward()
        total += loss.detach().double() / args.grad_accum  # float64: no float32 rounding in the step's sum
    return total


@torch.no_grad()
def evaluate(model, data, args, ctx, block_size):
    """Mean loss on the validation batches 0 .. eval_iters - 1 (the same for every run of the seed), in the training
    step's micro-batches."""
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


# ---- The run files: config.json, metrics.jsonl, ckpt.pt
def run_spec(args, config, data, ctx):
    """What a run is, saved in config.json and in every checkpoint: its model (a gla.GPTConfig), its training flags
    (TRAIN_SPEC) and autocast dtype, and its data."""
    train = {key: getattr(args, key) for key in TRAIN_SPEC}
    train["dtype"] = str(ctx.dtype).removeprefix("torch.")
    data_spec = {"source": data.source, "tokenizer": data.tokenizer, "train_tokens": data.n_tokens["train"],
                 "val_tokens": data.n_tokens["val"]}
    return {"model": dataclasses.asdict(config), "train": train, "data": data_spec}


def write_file(path, content):
    """Write bytes, or torch.save a checkpoint, to path through a temporary beside it that os.replace swaps in whole:
    a kill or a full disk leaves the old file or the new one, never half of either."""
    temporary = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(temporary, "wb") as f:
            if isinstance(content, bytes):
                f.write(content)
            else:
                torch.save(content, f)
    except (OSError, RuntimeError) as e:
        error = e if isinstance(e, OSError) else e.__context__  # torch.save wraps a failed write in a RuntimeError
        if not isinstance(error, OSError):
            raise
        raise OSError(error.errno, error.strerror, str(path)) from None  # the file we could not write, named
    os.replace(temporary, path)


def write_metrics(path, rows):
    write_file(path, "".join(json.dumps(row) + "\n" for row in rows).encode())


def read_metrics(path, up_to_iter=math.inf):
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [row for row in rows if row["iter"] <= up_to_iter]


def check_run_folder(folder, args, spec):
    """Refuse a folder that holds a run unless --overwrite, or --resume under the same spec from a checkpoint."""
    if args.overwrite or not (folder / "config.json").exists():
        return
    if not args.resume:
        raise SystemExit(f"train.py: {folder} holds a run: --resume or --overwrite")
    saved = json.loads((folder / "config.json").read_text())
    differences = [f"{part}.{key}: {saved.get(part, {}).get(key)!r} -> {value!r}"
                   for part, values in spec.items() for key, value in values.items()
                   if saved.get(part, {}).get(key) != value]
    if differences:
        raise SystemExit(f"train.py: cannot resume {folder}, started with another setup ({', '.join(differences)}); "
                         "--overwrite starts it over")
    rows = read_metrics(folder / "metrics.jsonl")
    if not (folder / "ckpt.pt").exists() and rows and rows[-1]["iter"] > min(args.ckpt_interval, args.max_iters):
        raise SystemExit(f"train.py: {folder} has evaluations but no ckpt.pt to resume: --overwrite")


# ---- The loop of one run, with its checkpoints and an exact resume
def train_run(args, variant, double_heads, spec, data, ctx, bar):
    """Train the run of seed args.seed (or resume it, or skip it if finished), advancing the job's progress bar.
    A kill costs the steps since the last checkpoint: --resume from it gives the uninterrupted run's numbers."""
    name = f"{run_name(variant, double_heads)} seed {args.seed}"
    config = gla.GPTConfig(**spec["model"])
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
        try:  # mmap: a process reads what it loads, not a whole copy of the file first
            ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            step = ckpt["iter"]
            elapsed = ckpt["elapsed_s"]
            loss_sum = ckpt["train_loss_sum"]
            loss_count = ckpt["train_loss_count"]
        except Exception as e:  # a truncated or foreign file
            raise SystemExit(f"train.py: cannot resume {ckpt_path} ({type(e).__name__})") from None
        del ckpt  # no second copy of the weights for the whole run
        bar.total -= step
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
    saved = step  # the step of the last checkpoint
    try:
        while step < args.max_iters:
            lr = lr_at(step, args)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = get_batch(data, "train", step, args.batch_size, config.block_size, args.seed, ctx.rank,
                             ctx.world_size)
            loss = train_step(train_model, x, y, args, ctx)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            # The step's one wait for the device: its loss and its gradient norm, summed over the processes.
            loss, grad_norm = ctx.all_sum(torch.stack([loss, grad_norm.double()])).tolist()
            step_loss = loss / ctx.world_size
            grad_norm /= ctx.world_size
            if not math.isfinite(step_loss) or not math.isfinite(grad_norm):
                raise SystemExit(f"train.py: {name}: loss {step_loss} at iteration {step}; try a lower --learning_rate")
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
            if step % args.ckpt_interval == 0 or step == args.max_iters:
                if ctx.master:
                    write_file(ckpt_path, dict(model=model.state_dict(), optimizer=optimizer.state_dict(), iter=step,
                                               elapsed_s=time.time() - started,
                                               train_loss_sum=loss_sum, train_loss_count=loss_count, config=spec))
                saved = step
    except KeyboardInterrupt:  # main says it in one line
        raise KeyboardInterrupt(f"{name} stopped at iteration {step}; --resume continues from {saved}") from None


def train_job(args):
    """Train every run of the job, seed by seed, under one progress bar. Nothing is written before every model builds,
    the data reads, and no run folder holds what the job would erase."""
    configs = {}
    for variant, double_heads in models_of(args):
        configs[variant, double_heads] = model_config(args, variant, double_heads)
        if args.init == "coupled":
            model_config(args, variant, not double_heads)  # the twin couple_init draws against builds too
    config = configs[models_of(args)[0]]  # block_size and vocab_size: the same for every model
    data = load_data(args.data, config.block_size, config.vocab_size)
    ctx = setup(args.device, args.dtype)
    runs = []
    for variant, double_heads, seed in runs_of(args):
        run_args = argparse.Namespace(**{**vars(args), "seed": seed})  # the run's own seed; the rest the job's
        spec = run_spec(run_args, configs[variant, double_heads], data, ctx)
        check_run_folder(run_dir(args.out_dir, variant, double_heads, seed), run_args, spec)
        runs.append((run_args, variant, double_heads, spec))

    pass_tokens = int(data.windows("train", config.block_size).sum()) * config.block_size
    run_tokens = args.max_iters * args.batch_size * config.block_size
    log(ctx, f"data: {data.source}, {data.n_tokens['train']:,} train / {data.n_tokens['val']:,} val tokens; "
             f"{ctx.world_size} process(es) on {ctx.device}, {ctx.dtype}")
    log(ctx, f"training: {run_tokens:,} tokens per run = {run_tokens / pass_tokens:.2f} passes over {pass_tokens:,}")
    # Off a terminal (a log file) the bar prints a line a minute, not one every tenth of a second.
    with tqdm(total=len(runs) * args.max_iters, desc="the job", unit="step", disable=not ctx.master,
              mininterval=0.1 if sys.stderr.isatty() else 60) as bar:
        for run_args, variant, double_heads, spec in runs:
            train_run(run_args, variant, double_heads, spec, data, ctx, bar)


# ---- Sampling through GPT.generate, on one process or tensor-parallel under torchrun (gla.shard_for_tp)
def load_model(path, dtype):
    """(model on the CPU in dtype, its tokenizer) of a run of train.py: its folder or its ckpt.pt."""
    path = pathlib.Path(path)
    try:
        ckpt = torch.load(path / "ckpt.pt" if path.is_dir() else path, map_location="cpu", weights_only=True, mmap=True)
        model = gla.GPT(gla.GPTConfig(**ckpt["config"]["model"]))
        model.load_state_dict(ckpt["model"])
        return model.to(dtype), ckpt["config"]["data"]["tokenizer"]
    except Exception as e:  # missing, truncated, or foreign
        reason = " ".join(str(e).split())  # torch's messages span lines
        raise SystemExit(f"train.py: cannot load {path} ({type(e).__name__}: {reason}); --sample takes a run's "
                         "folder, <out_dir>/<run>/seed<seed>, or its ckpt.pt") from None


def sample(args):
    """Print each model's text from --prompt and the time it took."""
    ctx = setup(args.device, args.dtype)
    for path in args.sample:
        model, tokenizer = load_model(path, ctx.dtype)
        config = model.config
        model.to(ctx.device).eval()
        if ctx.world_size > 1:
            gla.shard_for_tp(model, ctx.rank, ctx.world_size)
        if tokenizer == "bytes":  # the stdlib corpus, text files
            prompt = args.prompt.encode("utf-8", errors="surrogateescape")  # argv's non-UTF-8 bytes back
        else:
            try:
                import tiktoken
            except ImportError:
                raise SystemExit("train.py: GPT-2 tokens need tiktoken: pip install tiktoken") from None
            encoding = tiktoken.get_encoding("gpt2")
            prompt = encoding.encode(args.prompt)
        torch.manual_seed(args.seed)
        started = time.perf_counter()
        idx = torch.tensor([list(prompt)], device=ctx.device)
        tokens = model.generate(idx, args.max_new_tokens, args.temperature, args.top_k)[0].tolist()
        seconds = time.perf_counter() - started
        if tokenizer == "bytes":
            text = bytes(tokens).decode("utf-8", errors="backslashreplace")  # a half-learned character shows as \xNN
        else:
            text = encoding.decode(tokens)
        dtype = str(ctx.dtype).removeprefix("torch.")
        log(ctx, f"== {path}: {config.attn}, {config.n_head} query heads, {dtype}, temperature {args.temperature}, "
                 f"{ctx.world_size} process(es)\n{text}\n-- {args.max_new_tokens} new tokens in {seconds:.3f} s")


# ---- main: the one place where an error becomes a line
def main(argv=None):
    """Train, or with --sample, sample."""
    args = get_args(argv)
    try:
        if args.sample:
            sample(args)
        else:
            train_job(args)
        if dist.is_initialized():  # under torchrun: every process waits for rank 0's last writes, then leaves
            dist.barrier()
            dist.destroy_process_group()
    except OSError as e:  # a full disk, a folder under a file, a missing path
        then = "" if args.sample else "; the files saved before are whole: mend it, then --resume"
        raise SystemExit(f"train.py: {e}{then}") from None
    except AssertionError as e:  # gla.py's asserts: a model that cannot be built or run as asked
        raise SystemExit(f"train.py: {e}") from None
    except torch.OutOfMemoryError:
        raise SystemExit("train.py: out of memory; python bench/memory.py names the --grad_accum that fits") from None
    except KeyboardInterrupt as e:
        print(f"train.py: {str(e) or 'stopped'}", file=sys.stderr)  # outside the loop, a KeyboardInterrupt says nothing
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()

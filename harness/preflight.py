"""Checks before anything is written: the flags, the batch split, the data, the passes over it, disk room, and the
lock that gives each run folder to one process. Each raises UsageError, one line that names what the user set and
what to do."""
import fcntl
import math
import os
import shutil

import torch
import torch.distributed as dist

import gla
from harness.data import TokenData
from harness.stops import UsageError

POSITIVE_FLAGS = ("max_iters", "batch_size", "grad_accum", "eval_interval", "eval_iters", "ckpt_interval", "seeds")
CKPT_SLACK = 2**20  # a checkpoint's bytes beyond 12 a parameter (the zip's headers, the spec), generously
METRICS_ROW_BYTES = 256  # a metrics.jsonl row takes about 200


def check_args(args, model_flags):
    """UsageError for the first flag out of its range (the order of the checks below)."""
    for name in POSITIVE_FLAGS + model_flags:
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name} must be positive, got {value}")
    if args.warmup_iters < 0:
        raise UsageError(f"--warmup_iters must be zero or more, got {args.warmup_iters}")
    for name in ("learning_rate", "grad_clip"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f"--{name} must be a positive finite number, got {value}")
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        raise UsageError(f"--weight_decay must be a finite number >= 0, got {args.weight_decay}")
    if not (0 <= args.seed and args.seed + args.seeds <= 2**32):
        raise UsageError(f"--seed must be in [0, 2**32 - seeds] = [0, {2**32 - args.seeds}], got {args.seed}")
    if not args.out_dir:
        raise UsageError("--out_dir is empty; give a folder, e.g. --out_dir out")
    if args.attn == "all" and args.double_heads:
        raise UsageError("--double_heads picks one arm of a variant, but --attn all trains both arms of all three; "
                         "drop --double_heads, or name one variant")
    if args.attn == "gqa" and args.kv_lora_rank is not None:
        raise UsageError("--kv_lora_rank sizes MLA's and GLA's latent; GQA has none: drop it or use --attn mla/gla2")


def check_batch(args, world_size):
    """UsageError unless --batch_size splits into world_size processes x --grad_accum micro-batches."""
    if args.batch_size % (world_size * args.grad_accum):
        raise UsageError(f"--batch_size {args.batch_size} is not divisible by {world_size} process(es) x "
                         f"--grad_accum {args.grad_accum}; pick a multiple")


def on_master(ctx, check):
    """check() on rank 0 alone, its result given to every rank; its UsageError too, so a refusal stops all alike."""
    error = None
    result = None
    if ctx.master:
        try:
            result = check()
        except UsageError as e:
            error = str(e)
    if ctx.world_size > 1:
        shared = [error, result]
        dist.broadcast_object_list(shared, src=0)
        error, result = shared
    if error:
        raise UsageError(error)
    return result


def check_passes(args, data, block_size):
    """'T tokens per run = P passes over N' (N: the training split's tokens). The paper reads FineWeb-Edu 100BT once:
    under --preset paper, a run that would read its data again is refused (UsageError) unless --allow_repeats."""
    tokens = args.max_iters * args.batch_size * block_size
    pass_tokens = int(data.windows("train", block_size).sum()) * block_size
    passes = tokens / pass_tokens
    if args.preset == "paper" and passes > 1 and not args.allow_repeats:
        raise UsageError(f"--preset paper reads its training data once, as the paper does, but {tokens:,} "
                         f"tokens per run are {passes:.2f} passes over the {pass_tokens:,} of {data.source}; "
                         "use more data (FineWeb-Edu sample-100BT, see README), fewer --max_iters, or --allow_repeats")
    return f"{tokens:,} tokens per run = {passes:.2f} passes over {pass_tokens:,}"


def load_data(args, ctx, block_size, vocab_size):
    """This process's TokenData and the check_passes line. Rank 0 loads, scans and fingerprints the data; the others
    map the files with its fingerprint, so that 8 ranks do not read 20 GB each."""
    loaded = {}

    def load_and_check():
        data = TokenData.load(args.data, args.out_dir)
        data.check(block_size, vocab_size)
        loaded["data"] = data
        return data.fingerprint, check_passes(args, data, block_size)

    fingerprint, passes = on_master(ctx, load_and_check)
    if ctx.master:
        return loaded["data"], passes
    return TokenData.load(args.data, args.out_dir, fingerprint), passes


def check_disk(out_dir, runs, eval_points):
    """UsageError unless out_dir's disk has room for every run (a list of (run folder, GPTConfig)): its checkpoint
    (12 bytes a parameter: float32 weights and AdamW's two moments) less the ckpt.pt it may have already, one more
    (atomic_write keeps the old file while it writes the new), and eval_points metrics rows a run."""
    sizes = []
    with torch.device("meta"):  # parameters counted without memory
        for folder, config in runs:
            sizes.append(12 * gla.GPT(config).num_params() + CKPT_SLACK)
    need = max(sizes) + len(runs) * METRICS_ROW_BYTES * eval_points
    for (folder, _), size in zip(runs, sizes):
        have = os.path.join(folder, "ckpt.pt")
        need += max(0, size - (os.path.getsize(have) if os.path.exists(have) else 0))
    free = shutil.disk_usage(out_dir).free
    if need > free:
        raise UsageError(f"--out_dir {out_dir}: {len(runs)} run(s) need {need / 2**20:,.1f} MiB of disk (their "
                         f"checkpoints, a copy while one is replaced, metrics) but {free / 2**20:,.1f} MiB are free; "
                         "free space or choose another --out_dir")


def claim_folders(stack, out_dir, runs, eval_points):
    """check_disk, then lock_runs: what rank 0 checks and takes before the first step."""
    check_disk(out_dir, runs, eval_points)
    lock_runs(stack, [folder for folder, _ in runs])


def lock_runs(stack, folders):
    """Hold each run folder until `stack` (an ExitStack) closes: an exclusive flock on <folder>/.lock naming its
    holder, which the kernel drops with the process (no stale lock after a kill -9). UsageError for a folder another
    process holds, before anything is written in it."""
    for folder in folders:
        os.makedirs(folder, exist_ok=True)
        lock = stack.enter_context(open(os.path.join(folder, ".lock"), "a+"))
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise UsageError(f"{folder} is being trained by {holder}; wait for it to finish, stop it, or choose "
                             "another --out_dir") from None
        lock.truncate(0)
        print(f"process {os.getpid()} on {os.uname().nodename}", file=lock, flush=True)


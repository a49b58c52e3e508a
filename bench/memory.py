"""The memory plan of a launch, for GPUs this machine lacks: each run's peak bytes per process, measured on fake
tensors (shapes without memory: a CPU measures what a GPU will hold in eager mode), and with --device_memory the
largest micro-batch that fits a device of that many GiB, and its --grad_accum. Run it before a big run: train.py does
not check memory itself.

    python bench/memory.py --attn all --preset small --device_memory 22
    python bench/memory.py --attn all --preset paper --world_size 8 --grad_accum 60 --device_memory 79

Takes train.py's model and batch flags and prints one JSON line per run. Plans bf16 unless --device cpu or --dtype.

peak_bytes runs one training step (forward, backward, clipping, an AdamW step whose state exists) and one evaluation
forward under PyTorch's MemTracker on fake tensors. MemTracker and FakeTensorMode are PyTorch internals
(torch.distributed._tools, torch._subclasses) that a torch release may move.
"""
import argparse
import dataclasses
import functools
import json
import os
import pathlib
import sys
import warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import torch  # noqa: E402

import gla  # noqa: E402
import train  # noqa: E402
from bench.common import InputError, train_call  # noqa: E402

# Kept free for what fake tensors cannot see: allocator fragmentation, cuBLAS / NCCL / torch.compile workspaces.
MEMORY_MARGIN = 0.10


def peak_bytes(config, micro_batch, dtype, train=True, grads_held=False):
    """Peak bytes of one process's training micro-batch of micro_batch sequences of config.block_size tokens (forward,
    backward, clipping, fused AdamW with its state) or, train=False, of an evaluation forward; dtype: autocast's
    (float32: none). grads_held: the step's float32 gradients exist already (later micro-batches of --grad_accum; all
    of them under DDP). Raises ImportError where this torch lacks the tracker."""
    if config.n_layer <= 2:
        return _tracked_peak(tuple(dataclasses.asdict(config).items()), micro_batch, dtype, train, grads_held)
    # Every layer adds the same bytes, and the tracker slows down with depth: we measure 1 and 2 layers.
    one = peak_bytes(dataclasses.replace(config, n_layer=1), micro_batch, dtype, train, grads_held)
    two = peak_bytes(dataclasses.replace(config, n_layer=2), micro_batch, dtype, train, grads_held)
    return one + (config.n_layer - 1) * (two - one)


@functools.lru_cache(maxsize=None)
def _tracked_peak(fields, micro_batch, dtype, train, grads_held):
    # Imported here: the tracker pulls in torch._inductor, about 2 s at the start of a process.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    config = gla.GPTConfig(**dict(fields))
    with FakeTensorMode(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Mismatch dtype between input and weight")  # RMSNorm under bf16 autocast
        model = gla.GPT(config)
        x = torch.zeros(micro_batch, config.block_size, dtype=torch.int64)
        optimizer = torch.optim.AdamW(model.parameters(), fused=True)
        if train:  # AdamW's state as after the first step
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            optimizer.step()
            if not grads_held:
                optimizer.zero_grad(set_to_none=True)
        tracker = MemTracker()
        tracker.track_external(model, optimizer, x)
        with tracker, torch.autocast("cpu", dtype, enabled=dtype != torch.float32), torch.set_grad_enabled(train):
            _, loss = model(x, x)
            if train:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        return tracker.get_tracker_snapshot("peak")[x.device]["Total"]


def train_peak(config, micro_batch, per_process, dtype, ddp):
    """peak_bytes of a step's largest micro-batch: with the gradients held if a step of per_process sequences is split
    (--grad_accum), and always under DDP (gradient_as_bucket_view: they live in its buckets)."""
    return peak_bytes(config, micro_batch, dtype, grads_held=ddp or micro_batch < per_process)


def largest_micro_batch(config, per_process, dtype, ddp, budget):
    """The largest micro-batch dividing per_process whose step and evaluation peak within `budget` bytes (0: none).
    Peaks grow linearly with the micro-batch: the line through 1 and 2 sequences gives the first candidate."""
    one = train_peak(config, 1, per_process, dtype, ddp)
    two = train_peak(config, 2, per_process, dtype, ddp)
    guess = 1 + int((budget - one) // max(two - one, 1))
    for m in range(min(per_process, max(guess, 1)), 0, -1):
        if per_process % m:
            continue
        step = train_peak(config, m, per_process, dtype, ddp)
        evaluation = peak_bytes(config, m, dtype, train=False)
        if max(step, evaluation) <= budget:
            return m
    return 0


def plan(args, world, device_gib=None):
    """A dict per run: its shapes (n_kv_head: KV or latent heads a decode step reads), the peak bytes of a training
    step's largest micro-batch (train_peak) and of an evaluation micro-batch for `world` processes; with
    device_gib (GiB of device memory), the largest micro-batch that fits it less MEMORY_MARGIN, and its --grad_accum."""
    per_process = args.batch_size // world
    micro = per_process // args.grad_accum
    if args.dtype:
        dtype = getattr(torch, args.dtype)
    elif args.device == "cpu":
        dtype = torch.float32
    else:
        dtype = torch.bfloat16
    for variant, double_heads in train.models_of(args):
        config = train_call(train.model_config, args, variant, double_heads)
        with torch.device("meta"):  # parameters counted without memory
            n_params = gla.GPT(config).num_params()
        line = dict(run=train.run_name(variant, double_heads), attn=variant, double_heads=double_heads,
                    preset=args.preset, n_params=n_params, ffn_hidden=config.ffn_hidden, n_head=config.n_head,
                    n_kv_head=config.n_groups,
                    kv_cache_elems_per_token_per_layer=config.kv_cache_elems_per_token_per_layer, world_size=world,
                    micro_batch=micro, dtype=str(dtype).removeprefix("torch."),
                    peak_train_bytes=train_peak(config, micro, per_process, dtype, world > 1),
                    peak_eval_bytes=peak_bytes(config, micro, dtype, train=False))
        if device_gib:
            budget = (1 - MEMORY_MARGIN) * device_gib * 2**30
            fit = largest_micro_batch(config, per_process, dtype, world > 1, budget)
            grad_accum = per_process // fit if fit else None
            line.update(device_memory_gib=device_gib, max_micro_batch=fit, grad_accum=grad_accum)
        yield line


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors raise InputError (one line) instead of printing its usage block."""

    def error(self, message):
        raise InputError(message)


def main(argv=None):
    p = ArgumentParser(prog="bench/memory.py", description=__doc__.split("\n\n")[0], allow_abbrev=False,
                       epilog="Other flags are train.py's: --attn, --preset, --batch_size, --grad_accum, ...")
    p.add_argument("--world_size", type=int, default=int(os.environ.get("WORLD_SIZE", 1)),
                   help="processes (GPUs) to plan for (default: WORLD_SIZE, or 1)")
    p.add_argument("--device_memory", type=float, metavar="GIB", help="report the largest micro-batch for GIB GiB")
    try:
        own, rest = p.parse_known_args(argv)
        args = train_call(train.get_args, rest)
        if own.world_size <= 0 or (own.device_memory is not None and own.device_memory <= 0):
            raise InputError("--world_size and --device_memory must be positive")
        if args.batch_size % (own.world_size * args.grad_accum):
            raise InputError(f"--batch_size {args.batch_size} does not split into {own.world_size} process(es) x "
                             f"--grad_accum {args.grad_accum} micro-batches; pick a multiple")
        for line in plan(args, own.world_size, own.device_memory):
            print(json.dumps(line), flush=True)
    except InputError as e:
        print(f"bench/memory.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

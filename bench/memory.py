"""Print the memory plan of a launch: train.py's pre-flight (harness/memory.py), for GPUs this machine lacks.

Each run's peak bytes per process, measured on fake tensors (shapes without memory: a CPU measures a GPU's eager
peak), and with --device_memory the largest micro-batch that fits a device of that many GiB, and its --grad_accum:

    python bench/memory.py --attn all --preset small --device_memory 22
    python bench/memory.py --attn all --preset paper --world_size 8 --grad_accum 60 --device_memory 79

Takes train.py's model and batch flags and prints one JSON line per run. Plans bf16 unless --device cpu or --dtype.
"""
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import torch  # noqa: E402

import gla  # noqa: E402
import train  # noqa: E402
from harness import preflight  # noqa: E402
from harness.memory import MEMORY_MARGIN, largest_micro_batch, peak_bytes, train_peak  # noqa: E402
from harness.stops import ArgumentParser, UsageError  # noqa: E402


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
        config = train.model_config(args, variant, double_heads)
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


def main(argv=None):
    p = ArgumentParser(prog="bench/memory.py", description=__doc__.split("\n\n")[0], allow_abbrev=False,
                       epilog="Other flags are train.py's: --attn, --preset, --batch_size, --grad_accum, ...")
    p.add_argument("--world_size", type=int, default=int(os.environ.get("WORLD_SIZE", 1)),
                   help="processes (GPUs) to plan for (default: WORLD_SIZE, or 1)")
    p.add_argument("--device_memory", type=float, metavar="GIB", help="report the largest micro-batch for GIB GiB")
    try:
        own, rest = p.parse_known_args(argv)
        args = train.get_args(rest)
        if own.world_size <= 0 or (own.device_memory is not None and own.device_memory <= 0):
            raise UsageError("--world_size and --device_memory must be positive")
        preflight.check_batch(args, own.world_size)
        for line in plan(args, own.world_size, own.device_memory):
            print(json.dumps(line), flush=True)
    except UsageError as e:
        print(f"bench/memory.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Peak memory per GPU of each run, measured on this CPU, and the largest micro-batch that fits a device: the plan
for a launch on GPUs we do not have, and the table of docs/results.md's *Memory at paper scale*.

train.peak_bytes runs one training step (forward, backward, clipping, an AdamW step whose state exists) and one
evaluation forward under PyTorch's MemTracker on fake tensors: shapes and dtypes without memory, so a CPU measures what
a GPU will hold (eager mode). train.py's pre-flight refuses a run by the same measurement; this prints it.

    python bench/memory.py --attn all --preset paper --world_size 8 --grad_accum 60 --device_memory 79

Takes train.py's model and batch flags and prints one JSON line per run. Plans bf16 unless --device cpu or --dtype.
"""
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import torch  # noqa: E402

import train  # noqa: E402


def plan(args, world, device_memory=None):
    """A dict per run: its shapes (n_kv_head: KV or latent heads a decode step reads), the peak bytes of a training
    step's largest micro-batch (train.train_peak) and of an evaluation micro-batch for `world` processes; with
    device_memory (GiB), the largest micro-batch that fits it less train.MEMORY_MARGIN, and its --grad_accum."""
    per_process = args.batch_size // world
    micro = per_process // args.grad_accum
    dtype = getattr(torch, args.dtype or ("float32" if args.device == "cpu" else "bfloat16"))
    for v, d in train.models_of(args):
        c = train.model_config(args, v, d)
        line = dict(run=train.run_name(v, d), attn=v, double_heads=d, preset=args.preset, n_params=train.n_params(c),
                    ffn_hidden=c.ffn_hidden, n_head=c.n_head, n_kv_head=c.n_groups,
                    kv_cache_elems_per_token_per_layer=c.kv_cache_elems_per_token_per_layer, world_size=world,
                    micro_batch=micro, dtype=str(dtype).removeprefix("torch."),
                    peak_train_bytes=train.train_peak(c, micro, per_process, dtype, world > 1),
                    peak_eval_bytes=train.peak_bytes(c, micro, dtype, train=False))
        if device_memory:
            budget = (1 - train.MEMORY_MARGIN) * device_memory * 2**30
            fit = train.largest_micro_batch(c, per_process, dtype, world > 1, budget)
            line.update(device_memory_gib=device_memory, max_micro_batch=fit,
                        grad_accum=per_process // fit if fit else None)
        yield line


def main(argv=None):
    p = train.Parser(prog="bench/memory.py", description=__doc__.split("\n\n")[0], allow_abbrev=False,
                     epilog="Other flags are train.py's: --attn, --preset, --batch_size, --grad_accum, ...")
    p.add_argument("--world_size", type=int, default=int(os.environ.get("WORLD_SIZE", 1)),
                   help="processes (GPUs) to plan for (default: WORLD_SIZE, or 1)")
    p.add_argument("--device_memory", type=float, metavar="GIB", help="report the largest micro-batch for GIB GiB")
    try:
        own, rest = p.parse_known_args(argv)
        args = train.get_args(rest)
        if own.world_size <= 0 or (own.device_memory is not None and own.device_memory <= 0):
            raise train.UsageError("--world_size and --device_memory must be positive")
        train.check_batch(args, own.world_size)
        for line in plan(args, own.world_size, own.device_memory):
            print(json.dumps(line), flush=True)
    except (train.UsageError, train.gla.ConfigError) as e:
        print(f"bench/memory.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

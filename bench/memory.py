"""Peak memory per process of each run, measured on this CPU: train.py's pre-flight (check_memory, before anything is
built), and the plan for a launch on GPUs we do not have (docs/results.md's *Memory at paper scale*).

peak_bytes runs one training step (forward, backward, clipping, an AdamW step whose state exists) and one evaluation
forward under PyTorch's MemTracker on fake tensors: shapes and dtypes without memory, so a CPU measures what a GPU will
hold (eager mode). The command prints it, and the largest micro-batch that fits a device:

    python bench/memory.py --attn all --preset paper --world_size 8 --grad_accum 60 --device_memory 79

Takes train.py's model and batch flags and prints one JSON line per run. Plans bf16 unless --device cpu or --dtype.
"""
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

# Kept free for what fake tensors cannot see: allocator fragmentation, cuBLAS / NCCL / torch.compile workspaces.
MEMORY_MARGIN = 0.10


def peak_bytes(config, micro_batch, dtype, train=True, grads_held=False):
    """Peak bytes of one process's training micro-batch of micro_batch sequences (forward, backward, clipping, fused
    AdamW with its state) or, train=False, evaluation forward; dtype: autocast's (float32: none). grads_held: the
    step's gradients exist already (later micro-batches of --grad_accum; all under DDP). Measured by MemTracker on
    fake tensors (real shapes, nothing allocated): a CPU measures a GPU's eager peak."""
    if config.n_layer <= 2:
        return _tracked_peak(tuple(dataclasses.asdict(config).items()), micro_batch, dtype, train, grads_held)
    # Every layer adds the same bytes, and the tracker slows down with depth: measure 1 and 2 layers.
    one, two = (peak_bytes(dataclasses.replace(config, n_layer=n), micro_batch, dtype, train, grads_held)
                for n in (1, 2))
    return one + (config.n_layer - 1) * (two - one)


@functools.lru_cache(maxsize=None)
def _tracked_peak(fields, micro_batch, dtype, train, grads_held):
    # Imported here: the tracker pulls in torch._inductor, about 2 s at the start of every process that imports us.
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
    """The largest micro-batch dividing per_process whose step and evaluation peak within budget bytes (0: none);
    peaks grow linearly: the line through 1 and 2 sequences gives the first candidate."""
    one, two = (train_peak(config, m, per_process, dtype, ddp) for m in (1, 2))
    guess = 1 + (budget - one) // max(two - one, 1)
    for m in (d for d in range(per_process, 0, -1) if per_process % d == 0 and d <= max(guess, 1)):
        if max(train_peak(config, m, per_process, dtype, ddp), peak_bytes(config, m, dtype, train=False)) <= budget:
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
    """train.py's pre-flight, before any model is built: gla.ConfigError (one line) if the largest run's training
    peak, times the processes sharing the device (CPU: --jobs workers x this host's torchrun processes), exceeds its
    free memory less MEMORY_MARGIN. args: train.py's flags; ctx: its train.Context."""
    per_process, ddp = args.batch_size // ctx.world_size, ctx.world_size > 1
    micro = per_process // args.grad_accum
    sharing = jobs * int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if ctx.device.type == "cpu" else 1
    worst = max(configs, key=lambda c: train_peak(c, micro, per_process, ctx.dtype, ddp))
    need, have = sharing * train_peak(worst, micro, per_process, ctx.dtype, ddp), device_memory(ctx.device)
    budget = (1 - MEMORY_MARGIN) * have
    if need > budget:
        fit = largest_micro_batch(worst, per_process, ctx.dtype, ddp, budget / sharing)
        advice = (f"--grad_accum {per_process // fit} ({fit} sequences per micro-batch) would fit" if fit else
                  "not even one sequence per micro-batch fits: use GPUs with more memory or a smaller model")
        fewer = " (or fewer --jobs)" if ctx.device.type == "cpu" else ""
        raise gla.ConfigError(f"this run needs {need / 2**30:.1f} GiB on {ctx.device} (measured: {sharing} "
                              f"process(es), micro-batches of {micro} sequences) but {have / 2**30:.1f} GiB are free, "
                              f"{MEMORY_MARGIN:.0%} kept in reserve; {advice}{fewer}; bench/memory.py plans a launch")


def plan(args, world, device_gib=None):
    """A dict per run: its shapes (n_kv_head: KV or latent heads a decode step reads), the peak bytes of a training
    step's largest micro-batch (train_peak) and of an evaluation micro-batch for `world` processes; with
    device_gib (GiB of device memory), the largest micro-batch that fits it less MEMORY_MARGIN, and its --grad_accum."""
    import train  # here, not above: train.py imports this module for its pre-flight
    per_process = args.batch_size // world
    micro = per_process // args.grad_accum
    dtype = getattr(torch, args.dtype or ("float32" if args.device == "cpu" else "bfloat16"))
    for v, d in train.models_of(args):
        c = train.model_config(args, v, d)
        with torch.device("meta"):  # parameters counted without memory
            n_params = gla.GPT(c).num_params()
        line = dict(run=train.run_name(v, d), attn=v, double_heads=d, preset=args.preset, n_params=n_params,
                    ffn_hidden=c.ffn_hidden, n_head=c.n_head, n_kv_head=c.n_groups,
                    kv_cache_elems_per_token_per_layer=c.kv_cache_elems_per_token_per_layer, world_size=world,
                    micro_batch=micro, dtype=str(dtype).removeprefix("torch."),
                    peak_train_bytes=train_peak(c, micro, per_process, dtype, world > 1),
                    peak_eval_bytes=peak_bytes(c, micro, dtype, train=False))
        if device_gib:
            budget = (1 - MEMORY_MARGIN) * device_gib * 2**30
            fit = largest_micro_batch(c, per_process, dtype, world > 1, budget)
            line.update(device_memory_gib=device_gib, max_micro_batch=fit,
                        grad_accum=per_process // fit if fit else None)
        yield line


def main(argv=None):
    import train
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

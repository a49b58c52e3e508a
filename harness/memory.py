"""The memory pre-flight: before it builds a model, train.py measures the peak memory of each run's largest
micro-batch and refuses a run that would not fit, in one line with the --grad_accum that would. It does so where
memory can run out: on a GPU, or a preset past tiny (train.check_memory).

peak_bytes runs one training step (forward, backward, clipping, an AdamW step whose state exists) and one evaluation
forward under PyTorch's MemTracker on fake tensors: shapes and dtypes without memory, so a CPU measures what a GPU
will hold in eager mode. `python bench/memory.py` prints the same measurement for a launch on GPUs we do not have.

MemTracker and FakeTensorMode are PyTorch internals (torch.distributed._tools, torch._subclasses): where a torch
release moves them, the check says so in one line and training goes on unchecked.
"""
import dataclasses
import functools
import os
import sys
import warnings

import torch

import gla
from harness.stops import UsageError

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


def device_memory(device):
    """Free bytes on a CUDA device, or the memory available to new processes on this host."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(configs, per_process, micro_batch, dtype, device, ddp, sharing):
    """Refuse (UsageError, one line) a job whose largest run's training peak, times the `sharing` processes that
    share the device (CPU: this host's torchrun processes), exceeds its free memory less MEMORY_MARGIN; the line
    gives the --grad_accum that would fit. configs: the job's GPTConfigs; per_process sequences a step, in
    micro-batches of micro_batch; dtype: autocast's."""
    try:
        peaks = [train_peak(c, micro_batch, per_process, dtype, ddp) for c in configs]
    except (ImportError, AttributeError) as e:
        print(f"train.py: warning: memory not checked: this torch lacks the tracker ({e})", file=sys.stderr)
        return
    worst = configs[peaks.index(max(peaks))]
    need = sharing * max(peaks)
    have = device_memory(device)
    budget = (1 - MEMORY_MARGIN) * have
    if need <= budget:
        return
    fit = largest_micro_batch(worst, per_process, dtype, ddp, budget / sharing)
    if fit:
        advice = f"--grad_accum {per_process // fit} ({fit} sequences per micro-batch) would fit"
    else:
        advice = "not even one sequence per micro-batch fits: use GPUs with more memory or a smaller model"
    raise UsageError(f"this run needs {need / 2**30:.1f} GiB on {device} (measured: {sharing} process(es), "
                     f"micro-batches of {micro_batch} sequences) but {have / 2**30:.1f} GiB are free, "
                     f"{MEMORY_MARGIN:.0%} kept in reserve; {advice}; bench/memory.py plans a launch")

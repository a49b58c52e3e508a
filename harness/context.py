"""Where and how we compute: the device, the autocast dtype, and torchrun's process group."""
import dataclasses
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist

from harness.stops import UsageError


@dataclasses.dataclass
class Context:
    """device: where the model lives; dtype: autocast's (float32: none); rank, world_size: this process among
    torchrun's."""
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
        """The tensor t summed over every process (in place: one all-reduce), t itself in a process alone."""
        if self.world_size > 1:
            dist.all_reduce(t)
        return t


def device_type(device):
    """"cuda" or "cpu" from a --device value (None: cuda when available). Raises UsageError."""
    if device not in (None, "cpu", "cuda") and not device.startswith("cuda:"):
        raise UsageError(f"--device {device}: use cpu or cuda")
    if device and device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device} but CUDA is not available here; use --device cpu")
    if device:
        return device.split(":")[0]
    return "cuda" if torch.cuda.is_available() else "cpu"


def setup_context(device=None, dtype=None):
    """The Context of this process: --device and --dtype (None: bfloat16 on CUDA, float32 on CPU); under torchrun
    (RANK and WORLD_SIZE set) it joins the process group: NCCL on GPUs, gloo on CPUs, one GPU per local rank."""
    kind = device_type(device)
    dtype = getattr(torch, dtype or ("bfloat16" if kind == "cuda" else "float32"))
    if "RANK" not in os.environ:
        return Context(torch.device(device or kind), dtype)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        return Context(torch.device(f"cuda:{local_rank}"), dtype, rank, world_size)
    dist.init_process_group("gloo")
    return Context(torch.device("cpu"), dtype, rank, world_size)


def leave_process_group(finished):
    """Leave torchrun's process group, if any. A rank that finished waits for the others at a barrier first (a gloo
    rank that left while rank 0 still wrote its checkpoint aborted at exit); after an error none does: the others
    may never reach the barrier."""
    if dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()

"""Memory and time measurements shared by the benchmarks: transient peak memory and timed steps.

``step_peak_bytes`` measures how much memory a function allocates beyond what existed when it
started, at its worst moment: on CUDA from the caching allocator's peak counter, on a CPU from the
profiler's allocation events (each op's allocations and frees, summed in time order). It counts
tensors only, not the Python interpreter or the backend's own buffers.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile


def step_peak_bytes(fn, device: torch.device) -> int:
    """Peak bytes of tensors allocated by ``fn()`` above the memory in use when it started."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live = peak = 0
    for event in sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def slowest_rank_seconds(comm, fn, group: str = "world") -> float:
    """Start ``fn()`` on every rank of ``group`` together and return the slowest rank's seconds."""
    device = comm.grid.device
    comm.all_reduce(torch.zeros(1, device=device), group, "sync")
    t = torch.tensor([timed(fn, device)], dtype=torch.float64, device=device)
    return comm.all_reduce(t, group, "timing", op=dist.ReduceOp.MAX).item()


def timed(fn, device: torch.device) -> float:
    """Wall-clock seconds of ``fn()``, waiting for the GPU where there is one."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start

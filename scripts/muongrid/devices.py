"""Which device a rank uses, and how to read a clock on it: the one place that knows CUDA is asynchronous.

* ``rank_device(backend)``: NCCL ranks use ``cuda:{LOCAL_RANK % device_count()}``. Under torchrun with
  every GPU visible, LOCAL_RANK picks one; under a scheduler that shows each process only its own GPU
  (``CUDA_VISIBLE_DEVICES`` per task, so ``device_count() == 1``) every rank uses ``cuda:0``, which is
  then its own GPU. gloo ranks use the CPU.
* ``synchronize(device)``: wait for the GPU (nothing on a CPU or on ``meta``).
* ``clock(device)``: seconds, read after a synchronize, so an interval covers the GPU work launched in it.
* ``Span``: one timed interval without stalling the host: CUDA events on a GPU (read when the figure
  is needed, in ``seconds()``), ``perf_counter`` elsewhere. ``comm.Comm`` times collectives with it: an
  NCCL collective returns as soon as it is queued, so a host clock around it reads about zero.

    python -c "from muongrid.devices import rank_device; print(rank_device('nccl'))"   # under torchrun
"""
from __future__ import annotations

import os
import time

import torch


def rank_device(backend: str) -> torch.device:
    """This process's device for ``backend``: ``cuda:{LOCAL_RANK % visible GPUs}`` for NCCL, else the CPU."""
    if backend != "nccl":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("--backend nccl needs a CUDA GPU, and torch.cuda.is_available() is False here: "
                           "use --backend gloo (or auto) on a machine without one")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())


def synchronize(device: torch.device) -> None:
    """Wait until ``device`` has finished the work queued on it (a no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device) -> float:
    """``time.perf_counter()`` after the device has caught up: differences are device-inclusive times."""
    synchronize(device)
    return time.perf_counter()


class Span:
    """One interval on ``device``: ``Span(device)`` starts it, ``stop()`` ends it, ``seconds()`` reads it.

    On CUDA two events are recorded on the current stream and read lazily (``seconds()`` waits for the
    second one only), so timing a step costs no host sync while it runs. Elsewhere the host clock.
    """

    __slots__ = ("_start", "_end", "_cuda")

    def __init__(self, device: torch.device):
        self._cuda = device.type == "cuda"
        if self._cuda:
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start, self._end = time.perf_counter(), None

    def stop(self) -> "Span":
        if self._cuda:
            self._end.record()
        else:
            self._end = time.perf_counter()
        return self

    def seconds(self) -> float:
        if self._cuda:
            self._end.synchronize()
            return self._start.elapsed_time(self._end) / 1000.0
        return self._end - self._start

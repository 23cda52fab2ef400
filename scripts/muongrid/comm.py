"""Every collective the optimizers run goes through ``Comm``, which records it in the communication ledger.

* **Counting.** Each call is one ``Record`` (op, group, dtype, elements, phase, step) with the bytes one rank
  sends and receives as a ring algorithm moves them (``ring_bytes``); ``Ledger.count_ns`` adds each
  Newton-Schulz run. Reading the ledger (``summary``, ``table``, ``peers``) is ``ledger.py``, never the step.
* **Errors that say which collective.** A failure is re-raised as ``CollectiveError`` naming the op, group,
  dtype, size, phase, step and rank; a watchdog thread ends a rank whose host blocks in one past its timeout
  (on NCCL, ProcessGroupNCCL's own watchdog does it, hence ``Grid.build``'s ``--timeout``).
* **Time and traces.** Host time on a CPU; on CUDA only with ``time_device=True`` (CUDA events, read when a
  summary asks), so a GPU step records no events by default. While a profiler records, a call runs in a
  range ``comm:<phase>`` (its wait in ``comm_wait:<phase>``, ``lab/traces.py``).
* A group of one rank moves nothing and records zero bytes: its collectives hand back their input.
* **A reduce-scatter on gloo** is an all-to-all and a local sum in rank order (``_sum_arrived``): gloo has no
  reduce-scatter of its own and runs one as an all-reduce of the whole input, twice the ring's bytes
  (``python scripts/measure_links.py --dp 2`` times both on this machine: its "gloo's own" column). Each rank sends
  and receives the elements a ring reduce-scatter does, so the ledger's bytes are unchanged, and a sum of the ranks'
  rows in rank order is what a one-process sum of the gradients does. The receive buffer is the size of the
  input: one per gradient buffer, kept (``_arrival``; on gloo the step's gradients take twice their memory).
  NCCL's reduce-scatter is used as it is.

The step's decisions ride one device all-reduce (``contract.vote``), never a host collective. Chapters 2 and 6
count the ring bytes (chapter 6 times gloo's own reduce-scatter beside this one), chapter 10 shows the watchdog.
To see every collective run: ``python scripts/collectives.py --dp 4`` prints what each rank had, got and counted.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.profiler import record_function

from .devices import Span
from .ledger import CommOutsideStep, LedgerReports

# torch 2.13 renamed these (``*_single``); Colab may run an older torch with only the old names.
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def is_gloo(pg) -> bool:
    """Whether ``pg`` (None: the default group) runs CPU tensors on gloo ("gloo", or "cpu:gloo,cuda:nccl")."""
    try:
        return "gloo" in str(dist.get_backend(pg))
    except (RuntimeError, ValueError):   # a fake or custom group without a backend name
        return False


def _sum_arrived(arrived: torch.Tensor, shard: torch.Tensor, size: int) -> torch.Tensor:
    """The reduce-scatter's sum, from what an all-to-all brought: ``arrived`` holds ``size`` rows of
    ``shard.numel()`` values, one per rank of the group in rank order; ``shard`` becomes their sum, added in
    that order, in ``shard``'s dtype, as a sum of ``size`` tensors would be."""
    rows = arrived.view(size, -1)
    torch.add(rows[0], rows[1], out=shard)
    for q in range(2, size):
        shard.add_(rows[q])
    return shard


class Phase:
    """The phases of a ZeRO-1 step, named once (the bucket layout's: chapter 5; the owner and group layouts':
    chapters 8 and 15). The presence and NaN/Inf ballot's small all-reduce is phase "contract" (``contract.vote``),
    outside these: summaries and the closed-form byte count (``lab/costmodel.py``) leave it out alike."""

    GRAD_REDUCE_SCATTER = "grad_reduce_scatter"
    NS_GATHER_DP = "ns_gather_dp"
    NS_GATHER_TP = "ns_gather_tp"
    NS_TO_OWNER = "ns_to_owner"
    NS_FROM_OWNER = "ns_from_owner"
    NS_GROUP_GRAM = "ns_group_gram"
    PARAM_ALL_GATHER = "param_all_gather"
    QK_CLIP = "qk_clip"   # MuonClip: every head's largest logit, one MAX all-reduce for the whole model


# In step order, as a summary lists them (ledger.py).
PHASES = (Phase.GRAD_REDUCE_SCATTER, Phase.NS_GATHER_DP, Phase.NS_GATHER_TP, Phase.NS_TO_OWNER,
          Phase.NS_GROUP_GRAM, Phase.NS_FROM_OWNER, Phase.QK_CLIP, Phase.PARAM_ALL_GATHER)


def report_fatal(text: str) -> None:
    """Leave ``text`` where ``launch.py`` looks for a rank's failure (``MUONGRID_ERROR_FILE``; unset under
    torchrun, which ends the job itself), written whole or not at all."""
    path = os.environ.get("MUONGRID_ERROR_FILE")
    if path:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{time.time()!r}\n{text}\n")
        os.replace(tmp, path)  # atomic: the launcher never reads half a file


class CollectiveError(RuntimeError):
    """A collective failed or timed out; the message says which one."""


class Pending:
    """A collective in flight: ``wait()`` returns its output (at once, if it ran synchronously)."""

    def __init__(self, out: torch.Tensor, finish=None):
        self._out, self._finish = out, finish

    def wait(self) -> torch.Tensor:
        if self._finish is not None:
            self._finish()
            self._finish = None
        return self._out


@dataclass
class Record:
    step: int
    phase: str
    op: str
    group: str
    group_size: int
    dtype: str
    numel: int        # elements of this rank's shard (all-gather input, reduce-scatter output; all-to-all: sent to others)
    bytes_sent: int
    bytes_recv: int
    seconds: float = 0.0  # wall time this rank spent in the call (and in waiting for it, if asynchronous)
    counts: list | None = field(default=None, repr=False)  # all-to-all: elements sent to each rank of the group
    spans: list = field(default_factory=list, repr=False)  # on CUDA: event pairs, read by ledger.seconds


def ring_bytes(op: str, group_size: int, shard_numel: int, element_size: int) -> int:
    """Bytes one rank sends (and receives) in a ring ``op`` over ``group_size`` ranks."""
    hops = group_size - 1
    if op in ("all_gather", "reduce_scatter"):
        return hops * shard_numel * element_size
    if op == "all_reduce":
        return 2 * hops * shard_numel * element_size
    if op == "broadcast":  # a pipelined ring: every rank but the last forwards the whole tensor
        return (1 if hops else 0) * shard_numel * element_size
    if op == "all_to_all":  # point to point: shard_numel is what this rank sends to the others
        return shard_numel * element_size
    raise ValueError(f"no ring model for {op!r}")


class Ledger(LedgerReports):
    """The collectives one rank ran in its last ``keep_steps`` optimizer steps (older ones are dropped, so a
    long run does not grow it); its reports are ``ledger.LedgerReports``."""

    phases = PHASES   # the order its reports list them in

    def __init__(self, keep_steps: int = 16):
        self.records: list[Record] = []
        self.ns: dict[int, list[int]] = {}  # step -> [Newton-Schulz calls, their FLOPs] on this rank
        self.step = 0
        self.keep_steps = keep_steps
        self._pruned = 0   # the step at which older records were last dropped

    def begin_step(self, step: int) -> None:
        """Record what follows under ``step``; forget steps more than ``keep_steps`` ago. The records are
        looked over once every ``keep_steps`` steps, not every step, so at most twice that many are kept."""
        self.step = step
        if step - self._pruned >= self.keep_steps or step < self._pruned:
            self._pruned = step
            self.records = [r for r in self.records if r.step == 0 or r.step > step - self.keep_steps]
            self.ns = {s: v for s, v in self.ns.items() if s > step - self.keep_steps}

    def count_ns(self, flops: int) -> None:
        """One Newton-Schulz run of ``flops`` FLOPs, in the current step."""
        calls = self.ns.setdefault(self.step, [0, 0])
        calls[0] += 1
        calls[1] += flops


def subgroup_name(ranks) -> str:
    """The ledger's name of the process group of world ranks ``ranks``: "g0-1-2"."""
    return "g" + "-".join(str(r) for r in ranks)


class Comm(CommOutsideStep):
    """Collectives over a grid's "dp" and "tp" groups (and the subgroups ``add_subgroups`` made), recorded
    in ``self.ledger``. What no step calls (setup, reports, checks) is ``ledger.CommOutsideStep``."""

    subgroup_name = staticmethod(subgroup_name)   # for add_subgroups (ledger.py)

    def __init__(self, grid, timeout_s: float | None = None, ledger: Ledger | None = None,
                 time_device: bool = False):
        self.grid = grid
        self.time_device = time_device   # CUDA events around every collective (see the module docstring)
        self.ledger = ledger or Ledger()
        self.timeout_s = timeout_s
        self._inflight: tuple[float, str] | None = None
        self.naive_async = False
        self.subgroups: dict[str, tuple] = {}   # subgroup_name(ranks) -> (process group, ranks)
        self._arrivals: dict[tuple, torch.Tensor] = {}   # gloo: each gradient buffer's all-to-all receive buffer
        self._stop = threading.Event()
        self._thread = None
        if timeout_s and grid.dp * grid.tp > 1:
            # A weak reference: the thread must not keep the process groups alive into shutdown (abort at exit).
            self._thread = threading.Thread(target=Comm._watchdog, args=(weakref.ref(self), self._stop, timeout_s),
                                            daemon=True, name="muongrid-watchdog")
            self._thread.start()

    def close(self) -> None:
        """Stop the watchdog thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _group(self, name: str):
        if name in self.subgroups:
            pg, ranks = self.subgroups[name]
            return pg, len(ranks)
        if name == "world":
            return getattr(self.grid, "world_group", None), self.grid.dp * self.grid.tp
        if name == "job":   # every rank of the job: an expert grid's slices together (the default group)
            ep = getattr(self.grid, "ep", 1)
            return (getattr(self.grid, "world_group", None) if ep == 1 else None), self.grid.dp * self.grid.tp * ep
        if name == "dp":
            return self.grid.dp_group, self.grid.dp
        if name == "tp":
            return self.grid.tp_group, self.grid.tp
        raise ValueError(f"unknown group {name!r} (use 'dp', 'tp', 'world' or a subgroup from add_subgroups)")

    def all_gather(self, shard: torch.Tensor, group: str, phase: str) -> torch.Tensor:
        """Gather equal flat shards from every rank of ``group``: returns ``size * shard.numel()`` elements."""
        return self.all_gather_async(shard, group, phase, wait_now=True).wait()

    def all_gather_async(self, shard: torch.Tensor, group: str, phase: str, wait_now: bool = False,
                         out: torch.Tensor | None = None) -> Pending:
        """Start an all-gather (``wait_now``: finish it) into ``out`` (a flat buffer kept between steps of
        ``size * shard.numel()`` elements) or a new tensor; ``.wait()`` on the result blocks until it is done."""
        pg, size = self._group(group)
        shard = shard.contiguous().view(-1)
        rec = self._record("all_gather", group, size, shard.numel(), shard.dtype, phase)
        if size == 1:
            return Pending(shard)
        if out is None:
            out = torch.empty(size * shard.numel(), dtype=shard.dtype, device=shard.device)
        work = self._collective(rec, lambda a: all_gather_flat(out, shard, group=pg, async_op=a), wait=wait_now)
        return Pending(out, None if work is None else lambda: self._run(rec, work.wait, name="comm_wait"))

    def all_to_all(self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int], group: str,
                   phase: str, wait_now: bool = True, out: torch.Tensor | None = None) -> Pending:
        """Send ``send_counts[q]`` consecutive elements of flat ``send`` to rank ``q`` of ``group`` and receive
        ``recv_counts[q]`` from each: uneven sizes are fine. Returns a ``Pending`` whose ``wait()`` gives the
        received elements, rank by rank, in ``out`` if given (kept between steps). Only what crosses to another
        rank is counted."""
        pg, size = self._group(group)
        me = self.grid.rank if group == "world" else self.grid.dp_rank if group == "dp" else self.grid.tp_rank
        sent = sum(send_counts) - send_counts[me]
        rec = self._record("all_to_all", group, size, sent, send.dtype, phase)
        rec.bytes_recv = (sum(recv_counts) - recv_counts[me]) * send.dtype.itemsize
        rec.counts = send_counts   # the caller's list, kept (not copied): who gets what, for ``peers``
        if size == 1:
            return Pending(send)
        if out is None:
            out = torch.empty(sum(recv_counts), dtype=send.dtype, device=send.device)
        work = self._collective(rec, lambda a: dist.all_to_all_single(out, send, recv_counts, send_counts, group=pg,
                                                                        async_op=a), wait=wait_now)
        return Pending(out, None if work is None else lambda: self._run(rec, work.wait, name="comm_wait"))

    def reduce_scatter_into(self, shard: torch.Tensor, full: torch.Tensor, group: str, phase: str) -> torch.Tensor:
        """Sum flat ``full`` over ``group`` into this rank's ``shard`` (``full.numel() / size`` elements); ``full``
        is left as it was. With one rank, ``full`` is copied into ``shard``."""
        return self.reduce_scatter_into_async(shard, full, group, phase, wait_now=True).wait()

    def reduce_scatter_into_async(self, shard: torch.Tensor, full: torch.Tensor, group: str, phase: str,
                                  wait_now: bool = False) -> Pending:
        """``reduce_scatter_into``, started (``grad_reduce="backward"``: from the gradient-landing hook, ``reducer.py``):
        ``.wait()`` on the result blocks until it is done and returns ``shard``; ``full`` must stay as it is till then."""
        pg, size = self._group(group)
        rec = self._record("reduce_scatter", group, size, shard.numel(), shard.dtype, phase)
        if size == 1:
            return Pending(shard.copy_(full))
        if full.device.type == "cpu" and is_gloo(pg):   # gloo: an all-to-all, then the sum here (docstring)
            arrived = self._arrival(full, phase)   # row q: rank q's values for this rank's shard
            work = self._collective(rec, lambda a: dist.all_to_all_single(arrived, full, group=pg, async_op=a),
                                    wait=wait_now)

            def arrive_and_sum():
                if work is not None:
                    work.wait()
                _sum_arrived(arrived, shard, size)
            return Pending(shard, lambda: self._run(rec, arrive_and_sum, name="comm_wait"))
        work = self._collective(rec, lambda a: reduce_scatter_flat(shard, full, op=dist.ReduceOp.SUM, group=pg,
                                                                    async_op=a), wait=wait_now)
        return Pending(shard, None if work is None else lambda: self._run(rec, work.wait, name="comm_wait"))

    def _arrival(self, full: torch.Tensor, phase: str) -> torch.Tensor:
        """Where a gloo reduce-scatter's all-to-all of ``full`` lands: for the step's gradient buffers (phase
        grad_reduce_scatter: the store's, the same tensors every step) one buffer each, made at its first call and
        kept, so a steady-state step allocates none; for any other caller a new one."""
        if phase != Phase.GRAD_REDUCE_SCATTER:
            return torch.empty_like(full)
        key = (full.data_ptr(), full.numel(), full.dtype)
        if key not in self._arrivals:
            self._arrivals[key] = torch.empty_like(full)
        return self._arrivals[key]

    def all_gather_into(self, full: torch.Tensor, rank_in_group: int, group: str, phase: str) -> torch.Tensor:
        """All-gather in place: every rank's shard already sits in ``full`` (flat) at its own offset, and after
        the call every rank's ``full`` holds every shard (the input is a slice of the output: nothing is copied)."""
        return self.all_gather_into_async(full, rank_in_group, group, phase, wait_now=True).wait()

    def all_gather_into_async(self, full: torch.Tensor, rank_in_group: int, group: str, phase: str,
                              wait_now: bool = False) -> Pending:
        """``all_gather_into``, started: ``.wait()`` on the result blocks until it is done and returns ``full``."""
        pg, size = self._group(group)
        n = full.numel() // size
        shard = full[rank_in_group * n: (rank_in_group + 1) * n]
        rec = self._record("all_gather", group, size, n, full.dtype, phase)
        if size == 1:
            return Pending(full)
        work = self._collective(rec, lambda a: all_gather_flat(full, shard, group=pg, async_op=a), wait=wait_now)
        return Pending(full, None if work is None else lambda: self._run(rec, work.wait, name="comm_wait"))

    def all_reduce(self, tensor: torch.Tensor, group: str, phase: str, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """All-reduce in place (checks, and the group layout's Gram matrices over a subgroup)."""
        pg, size = self._group(group)
        rec = self._record("all_reduce", group, size, -(-tensor.numel() // size), tensor.dtype, phase)
        if size > 1:
            self._collective(rec, lambda a: dist.all_reduce(tensor, op=op, group=pg, async_op=a))
        return tensor

    def _record(self, op, group, size, shard_numel, dtype, phase) -> Record:
        sent = ring_bytes(op, size, shard_numel, dtype.itemsize)
        rec = Record(self.ledger.step, phase, op, group, size, str(dtype).replace("torch.", ""), shard_numel, sent, sent)
        self.ledger.records.append(rec)
        return rec

    def _describe(self, rec: Record) -> str:
        return (f"{rec.op} over the {rec.group} group ({rec.dtype}, {rec.numel} elements per rank, phase {rec.phase}, "
                f"step {rec.step}) on rank {self.grid.rank} (dp {self.grid.dp_rank}, tp {self.grid.tp_rank})")

    def _collective(self, rec: Record, launch, wait: bool = True):
        """Run ``launch(async_op)``. With ``wait``, return once it is done (None); else return its Work.
        ``naive_async``: the community report's experiment, ``async_op=True`` waited for at once (only overhead)."""
        if wait and not self.naive_async:
            self._run(rec, lambda: launch(False))
            return None
        work = self._run(rec, lambda: launch(True), waiting=False)
        if wait:
            self._run(rec, work.wait, name="comm_wait")
            return None
        return work

    def _run(self, rec: Record, call, waiting: bool = True, name: str = "comm"):
        """Run ``call`` (inside a profiler range ``<name>:<phase>`` while a profiler records), timing it into
        ``rec`` and turning failures into CollectiveError."""
        if waiting:
            self._inflight = (time.monotonic(), rec)
        start = time.perf_counter()
        cuda = self.grid.device.type == "cuda"
        span = Span(self.grid.device) if cuda and self.time_device else None
        try:
            if getattr(torch.autograd.profiler, "_is_profiler_enabled", True):   # a private flag: absent, range
                with record_function(f"{name}:{rec.phase}"):
                    return call()
            return call()
        except Exception as e:  # gloo raises on timeouts and on dead peers
            kind = "timed out" if any(w in str(e) for w in ("imeout", "imed out", "timing out")) else "failed"
            raise CollectiveError(f"{self._describe(rec)} {kind}: "
                                  f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
        finally:
            if span is not None:  # NCCL returns once the collective is queued: the events time it on the GPU
                rec.spans.append(span.stop())
            elif not cuda:
                rec.seconds += time.perf_counter() - start
            if waiting:
                self._inflight = None

    @staticmethod
    def _watchdog(ref, stop: threading.Event, timeout_s: float) -> None:
        grace = 5.0
        while not stop.wait(0.5):
            comm = ref()
            if comm is None:
                return
            inflight = comm._inflight
            what = "" if not inflight else inflight[1] if isinstance(inflight[1], str) else comm._describe(inflight[1])
            del comm
            if inflight and time.monotonic() - inflight[0] > timeout_s + grace:
                message = (f"[muongrid watchdog] {what} has not finished after {timeout_s:.0f} s "
                           f"(timeout) + {grace:.0f} s; ending this rank")
                print(message, file=sys.stderr, flush=True)
                report_fatal(message)
                os._exit(3)

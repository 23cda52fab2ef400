"""Every collective the optimizers run goes through ``Comm``, which also keeps the communication ledger.

Why one wrapper:

* **Counting.** Each call is recorded (op, group, dtype, elements, phase, step) with the bytes
  one rank sends and receives *as a ring algorithm moves them*: an all-gather or a
  reduce-scatter over ``n`` ranks of a shard of ``s`` elements sends and receives
  ``(n-1)*s`` elements per rank; an all-reduce twice that; an all-to-all what the rank sends to
  (and receives from) the others, its own part excluded. Gloo has no reduce-scatter and
  runs an all-reduce of the whole input instead (so it really moves about twice the bytes);
  the ledger counts the algorithm NCCL would run, which is what the paper's (1, 1.25] claim is
  about, and ``Ledger.summary`` says so.
* **Errors that say which collective.** A failure or a timeout is re-raised as
  ``CollectiveError`` naming the op, group, dtype, size, phase, step and rank. A watchdog thread
  also ends the process with that message if a call blocks the host past its timeout by more than a
  few seconds without the backend raising. On NCCL a collective returns once it is queued, so the
  host rarely blocks in one: there ProcessGroupNCCL's own watchdog ends a collective that outlives
  the group's timeout ("Watchdog caught collective operation timeout: WorkNCCL(...) ran for N
  milliseconds before timing out"), which is why ``Grid.build`` gives every group ``--timeout``.
* **Time.** ``Record.seconds`` is host time on a CPU; on CUDA, with ``time_device=True`` (``launch.py``'s
  entry points and ``bench.py`` ask for it), each call is bracketed by CUDA events (``devices.Span``), read
  only when a summary is asked for, so the ledger times what the GPU spent without a host sync per
  collective. By default a GPU step records no events (two per collective otherwise, and nothing a CUDA
  graph could capture).
* **Work.** ``Ledger.count_ns`` records every Newton-Schulz run (calls and FLOPs), so a step
  reports how often each matrix was orthogonalised, beside what it moved.
* **Profiling.** While a profiler records, every collective runs inside a range named ``comm:<phase>``
  (and the wait of an asynchronous one in ``comm_wait:<phase>``), so a trace can be split into
  communication and compute (``traces.py``); without one, no range is opened.
* **Cheap.** What a collective costs the host beyond the call is one ``Record`` (the ledger's bytes); the
  sentence that names it in an error is written only when an error or the watchdog needs it.
* **Torch versions.** torch 2.13 renamed ``all_gather_into_tensor``/``reduce_scatter_tensor`` to
  ``all_gather_single``/``reduce_scatter_single``; Colab may run an older torch with only the old names.

A group of one rank moves nothing and records zero bytes, so a 1 x 1 grid needs no process group; its
collectives hand back their input (no copy: a one-GPU step pays for no traffic it does not need).

**No host collective in a step.** What every rank must decide alike (which parameters have a gradient on
some rank, whether a NaN/Inf stops the step) rides one small device all-reduce (``contract.vote``), so the
optimizers keep no gloo group beside NCCL and a steady-state step reads nothing back to the host.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.profiler import record_function

from .devices import Span

_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor



class Phase:
    """The phases of a ZeRO-1 step, named once. The bucket layout gathers for Newton-Schulz over DP
    then TP; the owner and aligned layouts send a matrix's pieces to its owner and back; the group
    layout also all-reduces, inside each matrix's group, the norm and the Gram matrices."""

    GRAD_REDUCE_SCATTER = "grad_reduce_scatter"
    NS_GATHER_DP = "ns_gather_dp"
    NS_GATHER_TP = "ns_gather_tp"
    NS_TO_OWNER = "ns_to_owner"
    NS_FROM_OWNER = "ns_from_owner"
    NS_GROUP_GRAM = "ns_group_gram"
    PARAM_ALL_GATHER = "param_all_gather"
    QK_CLIP = "qk_clip"   # MuonClip: every head's largest logit, one MAX all-reduce for the whole model


# In step order; a summary lists them in this order.
PHASES = (Phase.GRAD_REDUCE_SCATTER, Phase.NS_GATHER_DP, Phase.NS_GATHER_TP, Phase.NS_TO_OWNER,
          Phase.NS_GROUP_GRAM, Phase.NS_FROM_OWNER, Phase.QK_CLIP, Phase.PARAM_ALL_GATHER)
RING_NOTE = ("bytes are per rank as a ring algorithm moves them; gloo runs reduce-scatter as an "
             "all-reduce of the whole input, which really moves about twice that")


def report_fatal(text: str) -> None:
    """Leave ``text`` where the local launcher looks for a rank's failure (``MUONGRID_ERROR_FILE``, set
    by ``launch.py`` for each rank it spawns), written whole or not at all. Under torchrun it is unset:
    torchrun itself ends the job when a rank exits non-zero."""
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
    spans: list = field(default_factory=list, repr=False)  # on CUDA: event pairs, read into seconds when asked

    def total_seconds(self) -> float:
        """``seconds``, with any CUDA event spans read (and folded in) now."""
        if self.spans:
            self.seconds += sum(s.seconds() for s in self.spans)
            self.spans.clear()
        return self.seconds


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


class Ledger:
    """The collectives one rank ran in its last ``keep_steps`` optimizer steps, with per-step summaries.

    Older steps are dropped as new ones begin, so a long training run does not grow it without bound.
    """

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

    def summary(self, step: int | None = None) -> dict:
        """Calls, elements and bytes per phase for one step (default: the last recorded step)."""
        steps = sorted({r.step for r in self.records if r.phase in PHASES})
        step = step if step is not None else (steps[-1] if steps else 0)
        phases: dict = {}
        for r in self.records:
            if r.step != step or r.phase not in PHASES:
                continue
            p = phases.setdefault(r.phase, dict(calls=0, numel=0, bytes_sent=0, bytes_recv=0, seconds=0.0,
                                                 group=r.group, dtype=r.dtype))
            for key in ("group", "dtype"):   # a rank in two groups, or the Gram form's fp32 beside bf16
                if getattr(r, key) not in p[key].split("+"):
                    p[key] += "+" + getattr(r, key)
            p["calls"] += 1
            p["seconds"] += r.total_seconds()
            p["numel"] += r.numel
            p["bytes_sent"] += r.bytes_sent
            p["bytes_recv"] += r.bytes_recv
        ordered = {k: phases[k] for k in PHASES if k in phases}
        ns_calls, ns_flops = self.ns.get(step, (0, 0))
        return dict(step=step, phases=ordered, ns_calls=ns_calls, ns_flops=ns_flops,
                    bytes_sent=sum(p["bytes_sent"] for p in ordered.values()),
                    bytes_recv=sum(p["bytes_recv"] for p in ordered.values()),
                    seconds=sum(p["seconds"] for p in ordered.values()), note=RING_NOTE)

    def table(self, step: int | None = None) -> str:
        s = self.summary(step)
        g = max([6] + [len(p["group"]) + 1 for p in s["phases"].values()])     # a rank in two groups: g0-1+g0-3
        d = max([10] + [len(p["dtype"]) + 1 for p in s["phases"].values()])
        lines = [f"{'phase':<22}{'group':>{g}}{'dtype':>{d}}{'calls':>7}{'elements':>12}{'bytes sent':>14}"]
        for name, p in s["phases"].items():
            lines.append(f"{name:<22}{p['group']:>{g}}{p['dtype']:>{d}}{p['calls']:>7}{p['numel']:>12}"
                         f"{p['bytes_sent']:>14}")
        lines.append(f"{'total per rank per step':<{41 + g + d}}{s['bytes_sent']:>14}")
        return "\n".join(lines)


def subgroup_name(ranks) -> str:
    """The ledger's name of the process group of world ranks ``ranks``: "g0-1-2"."""
    return "g" + "-".join(str(r) for r in ranks)


class Comm:
    """Collectives over a grid's "dp" and "tp" groups (and the subgroups ``add_subgroups`` made), recorded
    in ``self.ledger``."""

    def __init__(self, grid, timeout_s: float | None = None, ledger: Ledger | None = None,
                 time_device: bool = False):
        self.grid = grid
        self.time_device = time_device   # CUDA events around every collective (see the module docstring)
        self.ledger = ledger or Ledger()
        self.timeout_s = timeout_s
        self._inflight: tuple[float, str] | None = None
        self.naive_async = False
        self.subgroups: dict[str, tuple] = {}   # subgroup_name(ranks) -> (process group, ranks)
        self._stop = threading.Event()
        self._thread = None
        if timeout_s and grid.dp * grid.tp > 1:
            # The thread holds only a weak reference: it must never keep this object, and through it the
            # process groups, alive into interpreter shutdown (that aborts the process at exit).
            self._thread = threading.Thread(target=Comm._watchdog, args=(weakref.ref(self), self._stop, timeout_s),
                                            daemon=True, name="muongrid-watchdog")
            self._thread.start()

    def close(self) -> None:
        """Stop the watchdog thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def add_subgroups(self, member_lists) -> list[str]:
        """Make a process group for every distinct list of world ranks (the group layout's Newton-Schulz
        groups) that this Comm lacks, and return their names. ``dist.new_group`` is collective: every
        rank must call this with the same lists (the plan's, the same on every rank); they are made in
        sorted order, so the calls line up whatever order the caller gives."""
        names = []
        todo = sorted({tuple(sorted(m)) for m in member_lists})
        for ranks in todo:
            name = subgroup_name(ranks)
            names.append(name)
            if name in self.subgroups:
                continue
            self.subgroups[name] = (dist.new_group(list(ranks), **self._timeout()), ranks)
        return names

    def _timeout(self) -> dict:
        """``new_group``'s timeout for a group made here: this Comm's, else the grid's (``Grid.build``'s)."""
        if self.timeout_s:
            return dict(timeout=datetime.timedelta(seconds=self.timeout_s))
        timeout = getattr(self.grid, "timeout", None)
        return {} if timeout is None else dict(timeout=timeout)

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

    def members(self, group: str) -> list[int]:
        """The grid ranks of ``group``, in the group's own order (ranks are TP-fastest, ``grid.py``)."""
        g = self.grid
        if group in self.subgroups:
            return list(self.subgroups[group][1])
        if group == "dp":
            return [d * g.tp + g.tp_rank for d in range(g.dp)]
        if group == "tp":
            return [g.dp_rank * g.tp + t for t in range(g.tp)]
        return list(range(self._group(group)[1]))

    def peers(self, rec: Record) -> dict[int, int]:
        """Bytes of this rank's data that a recorded call delivers to each other rank (grid rank -> bytes):
        for an all-to-all what it sent to each; for a ring collective its share for each peer, the same for
        all (an all-gather: its shard to every peer; a reduce-scatter: its part of each peer's shard). A
        ring relays these through neighbours, so a link carries other totals; per rank they sum to
        ``bytes_sent``. (Asked for by reports, such as ``lab/step_explorer.py``; never by a step.)"""
        ranks = self.members(rec.group)
        others = [r for r in ranks if r != self.grid.rank]
        if rec.counts is not None:
            size = getattr(torch, rec.dtype).itemsize
            return {r: n * size for r, n in zip(ranks, rec.counts) if r != self.grid.rank and n}
        return {r: rec.bytes_sent // len(others) for r in others} if others and rec.bytes_sent else {}

    def all_gather(self, shard: torch.Tensor, group: str, phase: str) -> torch.Tensor:
        """Gather equal flat shards from every rank of ``group``: returns ``size * shard.numel()`` elements."""
        return self.all_gather_async(shard, group, phase, wait_now=True).wait()

    def all_gather_async(self, shard: torch.Tensor, group: str, phase: str, wait_now: bool = False,
                         out: torch.Tensor | None = None) -> Pending:
        """Start an all-gather and return at once; ``.wait()`` on the result blocks until it is done.

        With ``wait_now`` the collective completes before this returns (the normal path). ``out``: a flat
        tensor of ``size * shard.numel()`` elements to gather into (a buffer kept between steps), else a new one.
        """
        pg, size = self._group(group)
        shard = shard.contiguous().view(-1)
        rec = self._record("all_gather", group, size, shard.numel(), shard.dtype, phase)
        if size == 1:
            return Pending(shard)
        if out is None:
            out = torch.empty(size * shard.numel(), dtype=shard.dtype, device=shard.device)
        work = self._collective(rec, lambda a: _all_gather_flat(out, shard, group=pg, async_op=a), wait=wait_now)
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

    def reduce_scatter_sum(self, full: torch.Tensor, group: str, phase: str) -> torch.Tensor:
        """Sum ``full`` over ``group`` and return this rank's 1/size of the sum (flat)."""
        pg, size = self._group(group)
        full = full.contiguous().view(-1)
        if full.numel() % size:
            raise ValueError(f"reduce-scatter of {full.numel()} elements over {size} ranks: pad to a multiple")
        shard = torch.empty(full.numel() // size, dtype=full.dtype, device=full.device)
        rec = self._record("reduce_scatter", group, size, shard.numel(), shard.dtype, phase)
        if size == 1:
            return full
        self._collective(rec, lambda a: _reduce_scatter_flat(shard, full, op=dist.ReduceOp.SUM, group=pg,
                                                                    async_op=a))
        return shard

    def reduce_scatter_into(self, shard: torch.Tensor, full: torch.Tensor, group: str, phase: str) -> torch.Tensor:
        """``reduce_scatter_sum`` into a given ``shard`` (flat, ``full.numel() / size`` elements); ``full`` is
        left as it was. With one rank, ``full`` is copied into ``shard``."""
        pg, size = self._group(group)
        rec = self._record("reduce_scatter", group, size, shard.numel(), shard.dtype, phase)
        if size == 1:
            return shard.copy_(full)
        self._collective(rec, lambda a: _reduce_scatter_flat(shard, full, op=dist.ReduceOp.SUM, group=pg,
                                                                    async_op=a))
        return shard

    def all_gather_into(self, full: torch.Tensor, rank_in_group: int, group: str, phase: str) -> torch.Tensor:
        """All-gather in place: every rank's shard already sits in ``full`` (flat) at its own offset, and
        after the call every rank's ``full`` holds every shard (NCCL and gloo both take an input that is a
        slice of the output; nothing is copied in or out)."""
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
        work = self._collective(rec, lambda a: _all_gather_flat(full, shard, group=pg, async_op=a), wait=wait_now)
        return Pending(full, None if work is None else lambda: self._run(rec, work.wait, name="comm_wait"))

    def all_reduce(self, tensor: torch.Tensor, group: str, phase: str, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """All-reduce in place (checks, and the group layout's Gram matrices over a subgroup)."""
        pg, size = self._group(group)
        rec = self._record("all_reduce", group, size, -(-tensor.numel() // size), tensor.dtype, phase)
        if size > 1:
            self._collective(rec, lambda a: dist.all_reduce(tensor, op=op, group=pg, async_op=a))
        return tensor

    def broadcast(self, tensor: torch.Tensor, group: str, phase: str, src: int = 0) -> torch.Tensor:
        """Broadcast ``tensor`` in place from global rank ``src`` (used for checks, not by the optimizer)."""
        pg, size = self._group(group)
        rec = self._record("broadcast", group, size, tensor.numel(), tensor.dtype, phase)
        if size > 1:
            self._collective(rec, lambda a: dist.broadcast(tensor, src, group=pg, async_op=a))
        return tensor

    def gather_objects(self, obj, phase: str) -> list:
        """Every rank's picklable ``obj``, in rank order, on every rank (for reports, not the optimizer)."""
        world = self.grid.dp * self.grid.tp
        size = len(pickle.dumps(obj))
        rec = self._record("all_gather", "world", world, size, torch.uint8, phase)
        if world == 1:
            return [obj]
        out = [None] * world
        self._run(rec, lambda: dist.all_gather_object(out, obj, group=getattr(self.grid, "world_group", None)))
        return out

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

        ``naive_async`` reproduces the community report's experiment: every collective is issued
        with ``async_op=True`` and waited for at once, which can only add overhead.
        """
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

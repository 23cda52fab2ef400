"""Reading the communication ledger, and the collectives of ``Comm`` that no optimizer step runs.

``comm.py`` records each collective of a step (``Record``); what reads the records back, and the calls made only
when an optimizer is built, for a report or for a check, live here, off the step path (chapter 6 reads a ledger):

    summary = opt.comm.ledger.summary()       # calls, elements and bytes per phase of the last step
    print(opt.comm.ledger.table())            # the same, as the table bench.py and verify.py print
    everyone = opt.comm.gather_objects(mine, "report")

``Ledger`` and ``Comm`` (``comm.py``) inherit these classes, so every name is used as before.
"""
from __future__ import annotations

import datetime
import pickle

import torch
import torch.distributed as dist

RING_NOTE = ("bytes are per rank as a ring algorithm moves them (on gloo a reduce-scatter is an all-to-all "
             "and a local sum, which moves the same; gloo's own would all-reduce, twice that)")


def seconds(rec) -> float:
    """A record's ``seconds``, with any CUDA event spans read (and folded in) now."""
    if rec.spans:
        rec.seconds += sum(s.seconds() for s in rec.spans)
        rec.spans.clear()
    return rec.seconds


class LedgerReports:
    """``comm.Ledger``'s summaries: per phase of one step, as a dict or as a table."""

    def summary(self, step: int | None = None) -> dict:
        """Calls, elements and bytes per phase for one step (default: the last recorded step)."""
        order = self.phases
        steps = sorted({r.step for r in self.records if r.phase in order})
        step = step if step is not None else (steps[-1] if steps else 0)
        phases: dict = {}
        for r in self.records:
            if r.step != step or r.phase not in order:
                continue
            p = phases.setdefault(r.phase, dict(calls=0, numel=0, bytes_sent=0, bytes_recv=0, seconds=0.0,
                                                 group=r.group, dtype=r.dtype))
            for key in ("group", "dtype"):   # a rank in two groups, or the Gram form's fp32 beside bf16
                if getattr(r, key) not in p[key].split("+"):
                    p[key] += "+" + getattr(r, key)
            p["calls"] += 1
            p["seconds"] += seconds(r)
            p["numel"] += r.numel
            p["bytes_sent"] += r.bytes_sent
            p["bytes_recv"] += r.bytes_recv
        ordered = {k: phases[k] for k in order if k in phases}
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


class CommOutsideStep:
    """``comm.Comm``'s calls outside ``step()``: making the group layout's subgroups when an optimizer is built,
    gathering objects for setup and reports, a reduce-scatter and a broadcast for demos and checks, and who
    received what (``peers``)."""

    def add_subgroups(self, member_lists) -> list[str]:
        """Make a process group for every distinct list of world ranks (the group layout's Newton-Schulz
        groups) that this Comm lacks, and return their names. ``dist.new_group`` is collective: every
        rank must call this with the same lists (the plan's, the same on every rank); they are made in
        sorted order, so the calls line up whatever order the caller gives."""
        names = []
        todo = sorted({tuple(sorted(m)) for m in member_lists})
        for ranks in todo:
            name = self.subgroup_name(ranks)
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

    def peers(self, rec) -> dict[int, int]:
        """Bytes of this rank's data that a recorded call delivers to each other rank (grid rank -> bytes):
        for an all-to-all what it sent to each; for a ring collective its share for each peer, the same for
        all (an all-gather: its shard to every peer; a reduce-scatter: its part of each peer's shard). A
        ring relays these through neighbours, so a link carries other totals; per rank they sum to
        ``bytes_sent``. (Asked for by reports, such as ``lab/step_explorer.py``.)"""
        ranks = self.members(rec.group)
        others = [r for r in ranks if r != self.grid.rank]
        if rec.counts is not None:
            size = getattr(torch, rec.dtype).itemsize
            return {r: n * size for r, n in zip(ranks, rec.counts) if r != self.grid.rank and n}
        return {r: rec.bytes_sent // len(others) for r in others} if others and rec.bytes_sent else {}

    def reduce_scatter_sum(self, full: torch.Tensor, group: str, phase: str) -> torch.Tensor:
        """Sum ``full`` over ``group`` and return this rank's 1/size of the sum (flat; one rank: ``full``)."""
        size = self._group(group)[1]
        full = full.contiguous().view(-1)
        if full.numel() % size:
            raise ValueError(f"reduce-scatter of {full.numel()} elements over {size} ranks: pad to a multiple")
        if size == 1:
            self._record("reduce_scatter", group, size, full.numel(), full.dtype, phase)
            return full
        shard = torch.empty(full.numel() // size, dtype=full.dtype, device=full.device)
        return self.reduce_scatter_into(shard, full, group, phase)

    def broadcast(self, tensor: torch.Tensor, group: str, phase: str, src: int = 0) -> torch.Tensor:
        """Broadcast ``tensor`` in place from global rank ``src`` (used for checks, not by the optimizer)."""
        pg, size = self._group(group)
        rec = self._record("broadcast", group, size, tensor.numel(), tensor.dtype, phase)
        if size > 1:
            self._collective(rec, lambda a: dist.broadcast(tensor, src, group=pg, async_op=a))
        return tensor

    def gather_objects(self, obj, phase: str) -> list:
        """Every rank's picklable ``obj``, in rank order, on every rank (for setup and reports)."""
        world = self.grid.dp * self.grid.tp
        size = len(pickle.dumps(obj))
        rec = self._record("all_gather", "world", world, size, torch.uint8, phase)
        if world == 1:
            return [obj]
        out = [None] * world
        self._run(rec, lambda: dist.all_gather_object(out, obj, group=getattr(self.grid, "world_group", None)))
        return out

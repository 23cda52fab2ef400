"""``grad_reduce="backward"``: each bucket's gradient reduce-scatter launched from backward, when its last gradient
lands, as DDP's all-reduce, Megatron-LM's overlapped gradient reduction and FSDP2's reduce-scatter are.

Under ``grad_reduce="step"`` (the default) ``step()`` reduce-scatters every bucket after backward has finished, in
the plan's order. Here the store's gradient-landing hook (``store._Landing``) tells a ``Reducer`` which parameter
landed; the reducer launches a bucket's reduce-scatter (``Comm.reduce_scatter_into_async``) once all its gradients
are in its buffer, and ``step()`` (or ``clip_grad_norm_``) takes the reduced shard, dividing it by dp as before. The
reduction itself is the step's, on the same buffer and group, so the result is the same bit for bit.

What could break the collectives' order, and the rules that keep it the same on every rank of the DP group:

* **One fixed launch order.** Buckets launch in ``launch_order``: the Muon groups' buckets last to first (backward
  lands a model's last layers first), then the other groups' buckets last to first, then any bucket holding a
  parameter that cannot land from backward (``requires_grad=False``). A bucket launches only when it is complete
  *and* every bucket before it has launched, so each rank issues a prefix of the same list; the reductions are
  asynchronous, so a rank that is behind issues the same ones later, in the same order.
* **A parameter with no gradient on some rank** (a branch one rank's batch skips). Its bucket never completes on
  that rank, so that rank's chain stops there during backward. When backward ends (an autograd callback queued by
  the first landing) the reducer launches every bucket not yet launched, in the same order, with zeros where a
  gradient is missing (``Store.fill``): what ``step()`` reduces under "step". The vote on which parameters have a
  gradient anywhere still runs inside ``step()``, as before: it decides what the reduced shards are used for, not
  what is reduced, so it can come after them. Before the vote ``step()`` launches whatever is left (nothing, when a
  backward ran), so every rank has issued the same reduce-scatters, in the same order, before its ballot.
* **Gradient accumulation.** Run every backward but the step's last under ``with opt.no_sync():`` (DDP's rule):
  gradients land in the buffers and nothing launches. Without it each backward launches a whole round (correct:
  the last round reduces the summed buffer; the earlier rounds are wasted bytes, as under DDP without ``no_sync``).
  At the end of each backward the reducer waits for its round, so the next backward never writes into a buffer a
  reduction still reads; in a loop that calls ``step()`` next that wait is the one ``step()`` would make.
* **check_finite="raise".** The ballot runs in ``step()`` before anything changes, as under "step": the reductions
  write only each bucket's reduced-gradient scratch shard, never a parameter or its state. A NaN on one rank
  raises on every rank, after each has waited for its reductions (so none is left in flight); the next step starts
  a fresh round.
* **Where it does not apply**, it is refused when the optimizer is built, saying why: ``grad_reduce="ddp"`` (DDP
  reduces; the two are one option's values), ``capturable=True`` (a captured step replays fixed kernels; a launch
  from a backward hook is outside it), ``FSDPMuon`` (FSDP2 reduce-scatters in backward already). One DP rank has
  nothing to reduce: the option is accepted and does nothing.

Not the default. Measured at dp=2 on the 2-core CPU with gloo, Llama 4 layers, 3 runs of 10 interleaved
iterations, the machine shared (load 11 to 24), its whole iteration against DDP + ZeroRedundancyOptimizer's, median
(min-max) of the runs: hidden 256, 1.11 (0.95-1.47), the default "step" 1.11 (1.01-1.21); hidden 512, 1.04
(0.85-1.08), "step" 0.96 (0.82-1.13): a tie inside the noise. At hidden 256 its backward grew by 634 ms over
the same backward under ``no_sync()`` where "step" spent 101 ms reducing after it (at 512 that difference was
inside the noise, -1,028 ms): on two cores already shared, gloo's reduction most likely runs on the cores backward
needs rather than beside it. A default must pay, and this one also asks an accumulating loop for ``no_sync()``;
on GPUs with NCCL it has not been measured yet (``scripts/iteration_bench.py --variants zero,owner,backward``).

    python -m pytest -q tests/test_backward_reduce.py
"""
from __future__ import annotations

import contextlib

import torch

from .comm import Phase


def launch_order(buckets: list[list], muon: list[bool], whole: set) -> list[tuple[int, int]]:
    """Every bucket's (group, bucket index), in the order they are launched, the same on every rank (see the module
    docstring): Muon groups' buckets last to first, then the others', then the buckets not in ``whole``."""
    keys = [(g, b.bucket_idx) for g in sorted(range(len(buckets)), key=lambda g: not muon[g])
            for b in reversed(buckets[g])]
    return [k for k in keys if k in whole] + [k for k in keys if k not in whole]


class Reducer:
    """One rank's launches of its buckets' gradient reduce-scatters for the coming step. Built by the store
    (``Store(reduce="backward")``); ``landed`` is called by the store's gradient-landing hook, ``take`` by the step."""

    def __init__(self, store, expect: dict, step_number):
        self.store, self.expect, self.step_number = store, expect, step_number   # expect: key -> hooked params
        self.buckets = {(g, b.bucket_idx): b for g, row in enumerate(store.plan.buckets) for b in row}
        whole = {key for key, bucket in self.buckets.items() if len(expect[key]) == len(bucket.param_indices)}
        self.order = launch_order(store.plan.buckets, store.muon, whole)
        self.chain = sum(1 for key in self.order if key in whole)   # the buckets backward can launch
        self.nbytes = {key: self._buffers(key).grads.numel() * self._buffers(key).grads.element_size()
                       for key in self.order}
        self.syncing = True
        self.pending: dict = {}
        self._new_step()

    def _buffers(self, key):
        return self.store.buffers[key[0]][key[1]]

    def _new_step(self) -> None:
        self.issued = {"landing": 0, "backward_end": 0, "step": 0}   # bytes launched this step, by where
        self.rounds = 0   # backwards this step that launched a round
        self._new_round()

    def _new_round(self) -> None:
        self.wait_all()
        self.pending = {}
        self.landed = {key: set() for key in self.order}
        self.next = 0          # the place in ``order`` of the next bucket to launch
        self.open = False      # a backward of this round has landed a gradient (its end callback is queued)

    # ---- from backward ----------------------------------------------------------------------------

    def landed_in(self, key: tuple[int, int], param_idx: int) -> None:
        """Parameter ``param_idx`` of bucket ``key`` has its gradient in the bucket's buffer."""
        if not self.syncing:   # no_sync(): the gradients stay in the buffers, summed, till a backward outside it
            if self.next:      # after a round was launched: that round is stale, the step launches a new one
                self._new_round()
            return
        if not self.open:
            if self.next:   # an earlier backward of this step launched a round: this one is a new round
                self._new_round()
            self.open = True
            self.rounds += 1
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_ended)
        self.landed[key].add(param_idx)
        while self.next < self.chain and len(self.landed[self.order[self.next]]) == len(self.expect[self.order[self.next]]):
            self._launch(self.order[self.next], "landing", fill=False)

    def _backward_ended(self) -> None:
        """End of a backward that landed a gradient: launch the rest (zeros where one is missing), and wait."""
        self.launch_rest("backward_end")
        self.wait_all()
        self.open = False

    @contextlib.contextmanager
    def no_sync(self):
        before, self.syncing = self.syncing, False
        try:
            yield
        finally:
            self.syncing = before

    # ---- from the step ----------------------------------------------------------------------------

    def launch_rest(self, where: str = "step") -> None:
        """Launch every bucket of this round not launched yet, in order (``step()``: before the ballot)."""
        while self.next < len(self.order):
            self._launch(self.order[self.next], where, fill=True)

    def take(self, g: int, bucket) -> torch.Tensor:
        """This rank's DP-mean gradient shard of the bucket (once per step)."""
        key = (g, bucket.bucket_idx)
        if key not in self.pending:
            self.launch_rest()
        return self.pending.pop(key).wait().div_(self.store.grid.dp)

    def end_step(self) -> None:
        """After ``step()`` (or its failure): nothing left in flight, a fresh round for the next backward."""
        self._new_step()

    def wait_all(self) -> None:
        for pending in self.pending.values():
            pending.wait()

    def _launch(self, key: tuple[int, int], where: str, fill: bool) -> None:
        g, bucket = key[0], self.buckets[key]
        if fill:
            self.store.fill(g, bucket)
        buffers, comm = self._buffers(key), self.store.comm
        comm.ledger.begin_step(self.step_number())   # the step these reductions belong to
        self.pending[key] = comm.reduce_scatter_into_async(buffers.grad_shard, buffers.grads, "dp",
                                                           Phase.GRAD_REDUCE_SCATTER)
        self.issued[where] += self.nbytes[key]
        self.next += 1

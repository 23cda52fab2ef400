"""The rows each rank trains on: a torch DataLoader keyed by the DP rank, resumable.

    from muongrid.data import ResumableLoader, TokenWindows
    loader = ResumableLoader(TokenWindows(ids, context=32), global_batch=16,
                             dp=grid.dp, dp_rank=grid.dp_rank, seed=0)
    x, y = next(loader)            # this DP rank's rows of step 1's global batch
    state = loader.state_dict()    # saved with the checkpoint (muongrid.resume does it)
    loader.load_state_dict(state)  # a resumed run reads on from there, on any grid

Three rules make the data of a DP x TP run right, and each is a line here:

* The sampler is keyed by the **DP rank only**. The TP ranks of one replica compute one
  forward and backward together, each on its shard of the weights, so they must read the
  same rows; the replicas read disjoint rows. (Keyed by the global rank, the TP ranks
  would each train a different batch against shards of one model: a silent error.)
* Each step reads one **global batch**: ``global_batch`` rows of a seeded permutation of
  the dataset (a new one each epoch, the last partial batch dropped), and DP rank ``r``
  takes rows ``r*n .. (r+1)*n`` of it (``n = global_batch / dp``). So every grid trains
  on the same rows, step by step.
* The **position** is the number of global batches taken, which does not depend on the
  grid: a run saved on 2 x 2 resumes on 4 x 1 with the next global batch. It counts what
  the loop took, not what worker processes prefetched: ``num_workers`` cannot move it.

Put your own ``torch.utils.data.Dataset`` (tokenised documents, a memory-mapped token
file) in place of ``TokenWindows``; the sampler and the loader stay. The loops in
``scripts/`` use them; ``tests/test_loops.py`` records the rows each rank read on 2 x 2.
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class TokenWindows(Dataset):
    """A token sequence cut into windows of ``context`` tokens: row ``i`` is ``(x, y)``,
    ``y`` the same window shifted by one token (the next-token targets)."""

    def __init__(self, ids: torch.Tensor, context: int):
        self.ids, self.context = ids, context
        self.n = (len(ids) - 1) // context

    def __len__(self) -> int:
        return self.n

    def window(self, i: int):
        s = i * self.context
        return self.ids[s: s + self.context], self.ids[s + 1: s + self.context + 1]

    def __getitem__(self, i: int):
        return self.window(i)


class DPBatchSampler(Sampler):
    """This DP rank's rows of each step's global batch, step after step, from global
    batch ``start`` on, endlessly (epoch ``e``: a permutation seeded by ``seed+e``)."""

    def __init__(self, n_rows: int, global_batch: int, dp: int, dp_rank: int,
                 seed: int = 0, start: int = 0):
        if global_batch % dp:
            raise ValueError(f"global_batch={global_batch} must split into dp={dp} "
                             "equal parts")
        if not 0 <= dp_rank < dp:
            raise ValueError(f"dp_rank={dp_rank} is not a rank of dp={dp}")
        if n_rows < global_batch:
            raise ValueError(f"the dataset has {n_rows} rows, fewer than one global "
                             f"batch of {global_batch}")
        self.n_rows, self.global_batch, self.dp = n_rows, global_batch, dp
        self.dp_rank, self.seed, self.start = dp_rank, seed, start
        self.per_epoch = n_rows // global_batch

    def __iter__(self):
        n = self.global_batch // self.dp          # rows of one DP rank
        k, perm, perm_epoch = self.start, None, None
        while True:
            epoch, b = divmod(k, self.per_epoch)
            if epoch != perm_epoch:               # a new order each epoch
                gen = torch.Generator().manual_seed(self.seed + epoch)
                perm = torch.randperm(self.n_rows, generator=gen)
                perm_epoch = epoch
            rows = perm[b * self.global_batch: (b + 1) * self.global_batch]
            yield rows[self.dp_rank * n: (self.dp_rank + 1) * n].tolist()
            k += 1


class ResumableLoader:
    """An endless iterator of this DP rank's batches: a ``DataLoader`` over
    ``DPBatchSampler`` that counts the global batches the loop took and can start again
    from any count (``loader_kw`` go to the ``DataLoader``: ``num_workers``...)."""

    def __init__(self, dataset, global_batch: int, dp: int, dp_rank: int, seed: int = 0,
                 **loader_kw):
        self.dataset, self.seed, self.loader_kw = dataset, seed, loader_kw
        self.sampler = DPBatchSampler(len(dataset), global_batch, dp, dp_rank, seed)
        self.batches, self._it = 0, None

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:                      # (re)start where the count stands
            self.sampler.start = self.batches
            self._it = iter(DataLoader(self.dataset, batch_sampler=self.sampler,
                                       **self.loader_kw))
        out = next(self._it)
        self.batches += 1
        return out

    def state_dict(self) -> dict:
        """The position and what it counts in: the same on every rank and grid."""
        return dict(batches=self.batches, seed=self.seed,
                    global_batch=self.sampler.global_batch, rows=self.sampler.n_rows)

    def check_state(self, state: dict) -> None:
        """Refuse a position in other data (seed, global batch, size), naming it."""
        here = self.state_dict()
        differ = [f"{k} saved {state.get(k)!r}, here {here[k]!r}"
                  for k in ("seed", "global_batch", "rows") if state.get(k) != here[k]]
        if differ:
            raise ValueError("the saved data position is in other data: "
                             + ", ".join(differ))

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.batches, self._it = int(state["batches"]), None

"""The rows each rank trains on: a torch DataLoader keyed by the DP rank, with a position to save and resume.

    from muongrid.data import ResumableLoader, TokenWindows
    loader = ResumableLoader(TokenWindows(ids, context=32), global_batch=16,
                             dp=grid.dp, dp_rank=grid.dp_rank, seed=0)
    x, y = next(loader)                   # this DP rank's 16 / dp rows of step 1's global batch
    state = loader.state_dict()           # save it with the checkpoint (muongrid.resume does)
    loader.load_state_dict(state)         # a resumed run reads on from there, on any grid

Three rules make the data of a DP x TP run right, and each is a line here:

* The sampler is keyed by the **DP rank only**. The TP ranks of one replica compute one forward and
  backward together, each on its shard of the weights, so they must read the same rows; the replicas
  read disjoint rows. (Keyed by the global rank, the TP ranks would each train a different batch
  against shards of one model: a silent error, not a crash.)
* Each step reads one **global batch**: ``global_batch`` rows of a seeded permutation of the dataset
  (a new one each epoch, the last partial batch dropped), and DP rank ``r`` takes rows ``r*n .. (r+1)*n``
  of it (``n = global_batch / dp``). So every grid trains on the same rows step by step.
* The **position** is the number of global batches consumed, which does not depend on the grid: a run
  saved on 2 x 2 resumes on 4 x 1 with the next global batch. It counts what the loop took, not what a
  worker process prefetched, so ``num_workers`` does not move it.

Replace ``TokenWindows`` by your own ``torch.utils.data.Dataset`` (tokenised documents, a memory-mapped
token file); the sampler and the loader do not change. ``scripts/loop_zero1_tp.py`` uses them and
``tests/test_loops.py`` records the rows each rank read on a 2 x 2 grid.
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class TokenWindows(Dataset):
    """A token sequence cut into windows of ``context`` tokens: row ``i`` is ``(x, y)``, ``y`` the same
    window shifted by one token (next-token targets)."""

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
    """Yields this DP rank's row indices of each step's global batch, step after step, from global batch
    ``start`` on (endless: epoch ``e`` is the permutation seeded by ``seed + e``)."""

    def __init__(self, n_rows: int, global_batch: int, dp: int, dp_rank: int, seed: int = 0, start: int = 0):
        if global_batch % dp:
            raise ValueError(f"global_batch={global_batch} must split into dp={dp} equal parts")
        if not 0 <= dp_rank < dp:
            raise ValueError(f"dp_rank={dp_rank} is not a rank of dp={dp}")
        if n_rows < global_batch:
            raise ValueError(f"the dataset has {n_rows} rows, fewer than one global batch of {global_batch}")
        self.n_rows, self.global_batch, self.dp, self.dp_rank = n_rows, global_batch, dp, dp_rank
        self.seed, self.start = seed, start
        self.per_epoch = n_rows // global_batch

    def __iter__(self):
        n = self.global_batch // self.dp
        k, perm, perm_epoch = self.start, None, None
        while True:
            epoch, b = divmod(k, self.per_epoch)
            if epoch != perm_epoch:
                gen = torch.Generator().manual_seed(self.seed + epoch)
                perm, perm_epoch = torch.randperm(self.n_rows, generator=gen), epoch
            rows = perm[b * self.global_batch: (b + 1) * self.global_batch]
            yield rows[self.dp_rank * n: (self.dp_rank + 1) * n].tolist()
            k += 1


class ResumableLoader:
    """An endless iterator of this DP rank's batches: a ``DataLoader`` over ``DPBatchSampler``, which counts
    the global batches the loop has taken and can start again from any count (``loader_kw`` go to the
    ``DataLoader``: ``num_workers``, ``pin_memory``...)."""

    def __init__(self, dataset, global_batch: int, dp: int, dp_rank: int, seed: int = 0, **loader_kw):
        self.dataset, self.seed = dataset, seed
        self.sampler = DPBatchSampler(len(dataset), global_batch, dp, dp_rank, seed)
        self.loader_kw, self.batches, self._it = loader_kw, 0, None

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:   # (re)start where the count stands
            self.sampler.start = self.batches
            self._it = iter(DataLoader(self.dataset, batch_sampler=self.sampler, **self.loader_kw))
        out = next(self._it)
        self.batches += 1
        return out

    def state_dict(self) -> dict:
        """The position, and what it is a position in (the same on every rank and grid)."""
        return dict(batches=self.batches, seed=self.seed, global_batch=self.sampler.global_batch,
                    rows=self.sampler.n_rows)

    def check_state(self, state: dict) -> None:
        """Refuse a position in other data (another seed, global batch or dataset size), naming what differs."""
        here = self.state_dict()
        differ = [f"{k} saved {state.get(k)!r}, here {here[k]!r}" for k in ("seed", "global_batch", "rows")
                  if state.get(k) != here[k]]
        if differ:
            raise ValueError("the saved data position is in other data: " + ", ".join(differ))

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.batches, self._it = int(state["batches"]), None

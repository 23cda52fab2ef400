"""The proof of concept's two bugs, put back into this engine one method at a time, to watch them fail.

Moonshot's proof of concept had two bugs that the community tutorial found (its bug table):

1. **Stale ``params``.** Its second loop over parameter groups never ran
   ``params = group["params"]``, so it worked on the list the first loop left behind: the last
   group's. With one group nothing shows; with several, some groups are never written back
   (and if shapes differ, it crashes). ``StaleParams`` does the same to this engine's second
   pass (``_gather_params``).
2. **Flat view.** After the DP gather it took each matrix out of the flat bucket with
   ``.view(-1)`` instead of ``.view(dist_meta.shape)``, so Newton-Schulz got a 1-D tensor.
   ``FlatView`` does the same in the bucket flow's ``unpack_ns_input``. A matrix split over TP hides the bug,
   because the TP gather rebuilds the shape; a matrix that is not split meets NS flat and fails.

``python scripts/verify.py --dp 2 --poc-bug stale-params`` runs the check with a bug put back;
the regression tests assert that the check catches both.
"""
from __future__ import annotations

from ..distributed import DistributedMuon
from ..flows import BucketFlow


class StaleParams(DistributedMuon):
    """Bug #1: pass 2 reuses the parameter list that pass 1's loop left bound (the last group's).

    The proof of concept unpacked each gathered bucket into the parameters, and so does this engine where the
    parameters are not views of its buffers (``store.py``): that is where the bug is put back, so this class
    keeps every bucket unbound (``param_buffers=False``). With bound buffers the all-gather writes into the
    parameters where they are, and a stale list would have nothing to write into."""

    def __init__(self, params, grid, **kwargs):
        super().__init__(params, grid, param_buffers=False, **kwargs)

    def _gather_params(self) -> None:
        params = self.param_groups[-1]["params"]  # what the previous loop left in `params`
        for g in range(len(self.param_groups)):
            for bucket in self.plan.buckets[g]:
                self.store.gather(g, bucket, params)


class FlatViewFlow(BucketFlow):
    def unpack_ns_input(self, bucket_update, bucket, meta):
        lo = meta.global_range[0] - bucket.start
        return bucket_update[lo: lo + meta.numel].view(-1)


class FlatView(DistributedMuon):
    """Bug #2: the matrix leaves the gathered bucket as a flat vector (a bug of the bucket layout's flow)."""

    def __init__(self, params, grid, **kwargs):
        super().__init__(params, grid, **kwargs)
        if self.layout == "bucket":   # the engine's flow, swapped for the buggy one before any step
            self.flow = FlatViewFlow(self.plan, self.grid, self.comm, self.muon_groups, self.options)


POC_BUGS = {"stale-params": StaleParams, "flat-view": FlatView}

"""One optimizer step as a value: what it decided and what it made, from the first gradient to the last gather.

A ``Step`` begins when the optimizer is first asked for this step's work (``clip_grad_norm_``, ``step()``; a
reduction launched from backward will begin it when the first gradient lands) and ends after the parameters are
gathered. The store, the flows, ``Applier``, clipping, ``prepare_together`` and QK-clip take it as an argument;
nothing keeps it in a dict keyed by strings. ``FSDPMuon`` builds the same type.

``StepCounts`` holds every parameter's step count, one tensor per group (``opt.state[p]["step"]`` is a view of
it): on the host, counted for the parameters that have a gradient somewhere; ``capture.DeviceStepCounts`` keeps
them on the device, masked by the step's verdict, for ``capturable=True``.

    python -m pytest -q tests/test_step_vote.py tests/test_capturable.py
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class Step:
    """One step of a ZeRO-1 (or FSDP2) optimizer. ``present``, ``keep`` and ``agreed`` are its decision, the same on
    every rank (``contract.vote``), set once by ``decide``; the rest fills as the step runs."""

    number: int                                    # the step this is (1 for the first)
    present: list | None = None                    # per group, per parameter: a gradient on some rank
    keep: torch.Tensor | None = None               # check_finite="defer": the device verdict (False: all masked)
    agreed: torch.Tensor | None = None             # check_finite="defer": the agreed vote, a code per parameter
    late: list | None = None                       # one rank under "defer": (place, max-abs norm) of Muon updates
    grads: dict = field(default_factory=dict)      # (g, bucket_idx) -> this rank's gradient pieces, made once
    ran: set = field(default_factory=set)          # (g, param_idx) of every matrix this rank orthogonalised

    @property
    def decided(self) -> bool:
        return self.present is not None

    def decide(self, present: list, keep: torch.Tensor | None, agreed: torch.Tensor | None,
               checks_late: bool = False) -> None:
        """The vote's outcome; ``checks_late``: the step finds some NaN/Inf itself (``finite.late_codes``)."""
        self.present, self.keep, self.agreed = present, keep, agreed
        self.late = [] if checks_late and agreed is not None else None

    def note_late(self, places: list[int], norms: list[torch.Tensor]) -> None:
        """Max-abs norms of the updates of the parameters at ``places`` (one rank, "defer": ``Applier.flush``)."""
        if self.late is not None:
            self.late += zip(places, norms)


class StepCounts:
    """Every parameter's step count, one float32 tensor per group on the host; ``view(g, i)`` is parameter i's."""

    def __init__(self, counts: list[list[float]], device=None):
        self.groups = [torch.tensor(c, dtype=torch.float32) for c in counts]

    def view(self, g: int, i: int) -> torch.Tensor:
        return self.groups[g][i]

    def count(self, step: Step) -> None:
        """Every parameter with a gradient somewhere counts a step (one op per group)."""
        for steps, present in zip(self.groups, step.present):
            if any(present):
                steps.add_(1 if all(present) else torch.tensor(present, dtype=steps.dtype))

    def uncount(self, step: Step) -> None:
        """Take back ``count`` for a step that turned out skipped ("defer": known at the next host read)."""
        for steps, present in zip(self.groups, step.present):
            steps.sub_(torch.tensor(present, dtype=steps.dtype))

    def numbers(self, g: int) -> list:
        """Group ``g``'s counts as AdamW takes them (Python numbers)."""
        return self.groups[g].tolist()

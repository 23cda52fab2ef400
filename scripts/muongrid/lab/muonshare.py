"""Muon's share of a training step against the tokens of one step, for the configurations a reader runs.

Chapter 13's whole-step table (``wholestep``) prices a few fixed configurations at one batch each. Muon's extra
over AdamW is an optimizer cost, fixed per step, so its share of the step falls as the tokens of a step grow:
this module gives it as a function of the tokens, per configuration, from the same pieces:

* **forward + backward** (both optimizers): ``wholestep.forward_backward_seconds``, 6 N T FLOPs at the rate the
  H100 record measured for a 1.2B Llama (``hardware.figure("model_flops")``), nothing of communication;
* **the optimizer**, per sharding: ZeRO-1 (``DistributedMuon``, owner layout; under expert parallelism
  ``Grid.expert(ep)``'s dense and expert plans) is ``wholestep.optimizer_seconds``: the ZeRO-1 collectives
  (the same for AdamW), Muon's transfers and Newton-Schulz, and the element-wise passes. FSDP2 (``FSDPMuon``)
  is the element-wise passes plus ``timemodel.fsdp2_extra_seconds``: each matrix's row blocks to its owner and
  back, and the busiest owner's Newton-Schulz; FSDP2's own gathers and reduce-scatters are the same for both
  optimizers and are not charged to either (they are inside a real forward and backward).

Muon's **extra** is (Muon's step - AdamW's step) / AdamW's step, with everything serial (nothing hidden), the
way DMuon and NVIDIA report theirs. ``tokens_for(row, extra)`` inverts it: the tokens per step at which the model
gives that extra. ``dmuon_gap()`` sets DMuon's measured Llama-3.1-8B row (``wholestep.REPORTED``) beside the
model of the same model and world under FSDP2 on H100s.

    rows = [curve(r) for r in ROWS]      # chapter 13's figure and table (tests/test_muonshare.py)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import hardware
from . import timemodel, wholestep

TOKENS = tuple(2**k for k in range(17, 24))   # 128 Ki to 8 Mi tokens a step


@dataclass(frozen=True)
class Row:
    label: str
    model: str          # a key of model_shapes.MODELS
    dp: int
    tp: int = 1
    ep: int = 1         # expert-parallel slices: Grid.expert(ep)
    sharding: str = "zero1"   # "zero1" (DistributedMuon, owner) or "fsdp2" (FSDPMuon)


ROWS = (
    Row("Llama-3-8B, 8 H100, ZeRO-1", "llama3-8b", 8),
    Row("Llama-3-70B, 64 H100, FSDP2", "llama3-70b", 64, sharding="fsdp2"),
    Row("Moonlight-16B-A3B, 64 H100, EP 8", "moonlight-16b-a3b", 64, ep=8),
)


def optimizer_seconds(row: Row) -> dict:
    """AdamW's and Muon's optimizer seconds a step on the busiest rank (serial), for ``row``'s sharding."""
    if row.sharding == "zero1":
        c = wholestep.Config(row.label, row.model, row.dp, row.tp, tokens=1, ep=row.ep)
        t = wholestep.optimizer_seconds(c)
        return dict(adamw=t["adamw"]["total"], muon=t["owner"]["total"])
    if row.tp != 1 or row.ep != 1:
        raise ValueError("the FSDP2 rows here are FSDP2 over DP alone")
    groups, muon_elems, adamw_elems = wholestep.cost_groups(row.model)
    shapes = [s for g in groups if g["use_muon"] for s in g["shapes"]]
    extra = timemodel.fsdp2_extra_seconds(shapes, row.dp, timemodel.h100())["total"]
    return dict(adamw=wholestep.elementwise_seconds(muon_elems, adamw_elems, row.dp, "adamw"),
                muon=wholestep.elementwise_seconds(muon_elems, adamw_elems, row.dp, "muon") + extra)


def curve(row: Row, tokens=TOKENS) -> dict:
    """Muon's extra over AdamW's step at each number of tokens a step, and what it is made of."""
    opt = optimizer_seconds(row)
    world = row.dp * row.tp
    fb = {t: wholestep.forward_backward_seconds(row.model, world, t) for t in tokens}
    extra = {t: (opt["muon"] - opt["adamw"]) / (fb[t] + opt["adamw"]) for t in tokens}
    return dict(row=row, optimizer=opt, muon_minus_adamw=opt["muon"] - opt["adamw"], forward_backward=fb,
                extra=extra, tokens_per_gpu={t: t / world for t in tokens})


def tokens_for(row: Row, extra: float) -> float:
    """The tokens a step at which ``row``'s modelled extra is ``extra`` (the curve is 1 / (a T + b))."""
    opt = optimizer_seconds(row)
    per_token = wholestep.forward_backward_seconds(row.model, row.dp * row.tp, 1)
    return ((opt["muon"] - opt["adamw"]) / extra - opt["adamw"]) / per_token


def dmuon_gap() -> dict:
    """DMuon's measured Llama-3.1-8B step (FSDP-Z2, 128 A800, sequences of 4,096) beside this model's Llama-3-8B
    under FSDP2 on 128 H100: their extra in ms and in %, ours in ms, ours over their AdamW step, and the tokens
    a step at which the model reaches their +8.0% on H100s."""
    reported = next(r for r in wholestep.REPORTED if "step_ms" in r)
    adamw_ms, muon_ms = reported["step_ms"]
    row = Row("Llama-3-8B, 128 H100, FSDP2", "llama3-8b", 128, sharding="fsdp2")
    opt = optimizer_seconds(row)
    ours_ms = 1e3 * (opt["muon"] - opt["adamw"])
    theirs = muon_ms / adamw_ms - 1
    tokens = tokens_for(row, theirs)
    return dict(reported=reported, row=row, their_adamw_ms=adamw_ms, their_muon_ms=muon_ms,
                their_extra_ms=muon_ms - adamw_ms, their_extra=theirs, our_extra_ms=ours_ms,
                ours_over_their_step=ours_ms / adamw_ms, tokens_at_their_extra=tokens,
                sequences_per_gpu_at_their_extra=tokens / row.dp / reported["sequence"],
                forward_backward_s_per_sequence_per_gpu=wholestep.forward_backward_seconds(
                    row.model, 1, reported["sequence"]))


def assumed() -> dict:
    """The figures every row rests on, as the chapter states them."""
    return dict(model_flops=hardware.figure("model_flops"), elementwise=hardware.figure("elementwise"),
                muon_bytes=wholestep.ELEMENT_BYTES["muon"], adamw_bytes=wholestep.ELEMENT_BYTES["adamw"],
                model_share_of_matmul=hardware.figure("model_flops") / hardware.figure("matmul_bf16"))


def fmt_tokens(t: float) -> str:
    """128 Ki, 4 Mi: tokens as a page writes them."""
    k = math.log2(t)
    if k == int(k) and k >= 20:
        return f"{2 ** (int(k) - 20)} Mi"
    if k == int(k) and k >= 10:
        return f"{2 ** (int(k) - 10)} Ki"
    return f"{t:,.0f}"

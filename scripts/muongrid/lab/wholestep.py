"""The whole training step, per real configuration: how much longer Muon makes it than AdamW, per layout.

The optimizer's time alone (``timemodel``) answers "which layout"; a reader deciding whether to use Muon asks
what it costs in the *training step*. Per configuration (a model's parameter shapes from
``model_shapes``, a DP x TP grid of H100s, the tokens of one step), on the one hardware table
(``muongrid.hardware.H100_TABLE``; ``h100()`` is its profile):

* **forward + backward**: 6 x N x tokens FLOPs spread over every GPU, at the rate the GPU record measured for a
  1.2B Llama ("model_flops"). N counts every parameter a token uses (for a MoE, the routed experts it is sent
  to, ``ACTIVE_EXPERTS``), the embedding included, as that measurement counted it. Attention's FLOPs are left
  out and nothing of tensor parallelism's own traffic is charged, so forward + backward is modelled short and
  the optimizer's share errs large.
* **the optimizer**, on the busiest rank, serial (nothing overlapped): its collectives and Newton-Schulz
  (``timemodel.step_seconds``: the ZeRO-1 reduce-scatter and all-gather, the layout's transfers for
  Newton-Schulz, its FLOPs at the table's Newton-Schulz rate), plus the element-wise passes over this rank's
  shard at the measured element-wise bandwidth ("elementwise"), ``ELEMENT_BYTES`` per element. Kimi K2 (70,000
  matrices, 256 ranks) runs as it is trained, with expert parallelism (``Grid.expert(ep)``: each rank holds
  1/ep of every layer's experts, whose optimizer stays among the ranks holding the same slice), priced by
  ``scale.ep_report`` (its dense and expert plans; ``scale``'s all-to-all model, cruder than
  ``timemodel``'s: bytes over the DP link, one latency per exchange issued, but fast at that size).

Two shares are reported, as the sources report theirs: the **optimizer's share of the step**
(optimizer / (forward + backward + optimizer): the paper's "1-3%") and **Muon's extra over AdamW**
((Muon's step - AdamW's step) / AdamW's step: a throughput loss, as NVIDIA and DMuon report it). Each comes
twice: with the ZeRO-1 collectives in the step (serial) and with them hidden behind forward and backward,
as Megatron overlaps them; Muon's own transfers and Newton-Schulz are never hidden here.

Not modelled: pipeline parallelism, the MoE layers' token all-to-alls (forward and backward's, the same for both
optimizers), whether a configuration fits in memory, activation recomputation, and the copies of gradients into
the reduce-scatter buffer (the same for both).

    rows = [whole_step(c) for c in CONFIGS]      # the table chapter 13 prints
    reported_rows()                               # what the paper and other implementations report, cited
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import hardware
from . import scale, timemodel
from .model_shapes import MODELS

# Bytes each element costs per step outside Newton-Schulz, read and written: fused AdamW reads the parameter,
# gradient and two moments and writes all but the gradient (7 x 4); Muon's step, as DistributedMuon runs it,
# counted on the meta device by ``scripts/step_bench.py`` (``lab/stepcost.py``) on Llama-3.2-1B shapes: 55.9 GiB
# outside Newton-Schulz, less the fused AdamW pass over the embedding and norms, over 973M Muon elements
# (``tests/test_wholestep.py`` recounts it); torch.optim.Muon's count gives 43.
ELEMENT_BYTES = {"adamw": 28, "muon": 54}
# Routed experts each token is sent to (Kimi K2's report and config: 8 of 384; Moonlight: 6 of 64).
ACTIVE_EXPERTS = {"kimi-k2": 8, "moonlight-16b-a3b": 6}
DENSE_LAYOUTS = ("bucket", "owner", "aligned")


@dataclass(frozen=True)
class Config:
    label: str
    model: str          # a key of model_shapes.MODELS
    dp: int
    tp: int
    tokens: int         # tokens of one optimizer step, all GPUs together
    ep: int = 1         # expert-parallel slices (a MoE's experts: Grid.expert(ep)); 1: none


CONFIGS = (
    Config("Llama-3.2-1B, 1 H100", "llama3.2-1b", 1, 1, 16_384),         # the GPU record's configuration
    Config("Llama-3.2-1B, 8 H100", "llama3.2-1b", 8, 1, 8 * 16_384),     # 16,384 tokens per GPU, as measured
    Config("Llama-3-8B, 64 H100", "llama3-8b", 8, 8, 2**22),             # 4 Mi tokens a step
    Config("Llama-3-8B, 64 H100", "llama3-8b", 16, 4, 2**22),
    Config("Kimi K2, 256 H100, EP 64", "kimi-k2", 256, 1, 2**24, ep=64),  # 16 Mi tokens a step
)


def model_specs(model: str):
    """(ParamSpec groups, muon flags) of ``model`` (``model_shapes.MODELS``), all its layers."""
    build, layers = MODELS[model]
    return build(layers)


def active_params(model: str) -> int:
    """Parameters one token uses: all of them, but a MoE's routed experts beyond ``ACTIVE_EXPERTS`` per layer."""
    specs, _ = model_specs(model)
    keep = ACTIVE_EXPERTS.get(model)
    total = 0
    for spec in (s for g in specs for s in g):
        parts = spec.name.split(".")
        if keep is not None and "expert" in parts and int(parts[parts.index("expert") + 1]) >= keep:
            continue
        total += math.prod(spec.full_shape)
    return total


def cost_groups(model: str) -> tuple[list[dict], int, int]:
    """``model`` as ``costmodel`` groups, with its Muon and AdamW element counts."""
    specs, muon = model_specs(model)
    groups = [dict(shapes=[s.full_shape for s in g], tp_split_dims=[s.tp_split_dim for s in g], use_muon=m)
              for g, m in zip(specs, muon)]
    counts = [sum(math.prod(s.full_shape) for s in g) for g in specs]
    return groups, sum(c for c, m in zip(counts, muon) if m), sum(c for c, m in zip(counts, muon) if not m)


def forward_backward_seconds(model: str, world: int, tokens: int) -> float:
    """6 N tokens over ``world`` GPUs at the record's forward + backward rate (see the module docstring)."""
    return 6 * active_params(model) * tokens / (world * hardware.figure("model_flops"))


def elementwise_seconds(muon_elems: int, adamw_elems: int, world: int, optimizer: str) -> float:
    """The element-wise passes over one rank's shard (1 / world of the elements) at the measured bandwidth."""
    per_element = ELEMENT_BYTES["muon"] if optimizer == "muon" else ELEMENT_BYTES["adamw"]
    total = muon_elems * per_element + adamw_elems * ELEMENT_BYTES["adamw"]
    return total / world / hardware.figure("elementwise")


def optimizer_seconds(c: Config) -> dict:
    """Per layout ("adamw" too), the optimizer's seconds on the busiest rank: ``zero1`` (the reduce-scatter and
    all-gather every layout shares), ``muon_only`` (Newton-Schulz and its transfers) and ``elementwise``."""
    groups, muon_elems, adamw_elems = cost_groups(c.model)
    world, hw = c.dp * c.tp, timemodel.h100()
    out = {}
    if c.ep > 1:                        # a MoE with expert parallelism: scale.ep_report's plans, owner layout
        zero1 = expert_parallel_zero1_seconds(c)
        r = scale.ep_report(c.model, c.dp, c.tp, c.ep)
        out["adamw"] = dict(zero1=zero1, muon_only=0.0)
        out["owner"] = dict(zero1=zero1, muon_only=r["step_ms"] / 1e3 - zero1)
    else:
        for layout in ("adamw", *DENSE_LAYOUTS):
            t = timemodel.step_seconds(groups, c.dp, c.tp, "auto", layout, hw)
            zero1 = t["grad_reduce_scatter"] + t["param_all_gather"]
            out[layout] = dict(zero1=zero1, muon_only=t["total"] - zero1)
    for layout, t in out.items():
        t["elementwise"] = elementwise_seconds(muon_elems, adamw_elems, world, "adamw" if layout == "adamw" else "muon")
        t["total"] = t["zero1"] + t["muon_only"] + t["elementwise"]
    return out


def expert_parallel_zero1_seconds(c: Config) -> float:
    """The ZeRO-1 reduce-scatter and all-gather of one step under expert parallelism, AdamW's and Muon's alike:
    the dense plan's on the job's grid and the expert slice's on its expert grid (dp / ep x tp)."""
    from ..plan import build_plan

    specs, muon = model_specs(c.model)
    dense, experts = scale.split_experts(specs, muon, c.ep)
    prof = scale.profile(scale.H100)
    return (scale.zero1_seconds(build_plan(dense, c.dp, 0, c.tp, "auto", "owner", muon), prof)
            + scale.zero1_seconds(build_plan(experts, c.dp // c.ep, 0, c.tp, "auto", "owner", [True]),
                                prof))


def whole_step(c: Config) -> dict:
    """The configuration's step: forward + backward, the optimizer per layout, and the shares (module docstring),
    each as (ZeRO-1 collectives serial, hidden)."""
    fb = forward_backward_seconds(c.model, c.dp * c.tp, c.tokens)
    opt = optimizer_seconds(c)
    adamw = opt["adamw"]
    layouts = {}
    for layout, t in opt.items():
        serial, hidden = fb + t["total"], fb + t["total"] - t["zero1"]
        base_serial, base_hidden = fb + adamw["total"], fb + adamw["total"] - adamw["zero1"]
        layouts[layout] = dict(
            t, optimizer_share=(t["total"] / serial, (t["total"] - t["zero1"]) / hidden),
            over_adamw=(serial / base_serial - 1, hidden / base_hidden - 1),
            optimizer_x_adamw=t["total"] / adamw["total"])
    return dict(config=c, forward_backward=fb, active_params=active_params(c.model), layouts=layouts)


# What others report for Muon's cost in a whole step, each with where it was read; chapter 13 prints these beside
# the model. Figures are as published; NVIDIA's are throughputs (TFLOP/s per GPU) and the loss is computed.
NVIDIA_BLOG = ("https://developer.nvidia.com/blog/advancing-emerging-optimizers-for-accelerated-llm-training-with-"
               "nvidia-megatron/")
DMUON = "https://github.com/X-Square-Robot/dmuon/blob/{}/README.md"
REPORTED = (
    dict(source="Moonshot AI, the paper {cite:p}`liu2025muonscalable`", setting="Distributed Muon at scale",
         what="optimizer share of the step", figure="1-3%"),
    dict(source=f"[NVIDIA technical blog]({NVIDIA_BLOG}), April 2026",
         setting="Kimi K2, 256 GB300, PP4 x DP64 x EP64, MXFP8, Megatron-Bridge 26.02",
         what="model TFLOP/s per GPU, AdamW and Muon", values=(1051, 1029), kind="throughput"),
    dict(source=f"[NVIDIA technical blog]({NVIDIA_BLOG}), April 2026",
         setting="Qwen3-30B-A3B, 8 GB300, DP8 x EP8, MXFP8", what="model TFLOP/s per GPU, AdamW and Muon",
         values=(713, 686), kind="throughput"),
    dict(source=f"X-Square DMuon, [README at f002f24]({DMUON.format('f002f24a7e7397ae4b92ee6fd33fe62c75e9deb2')}),"
                " August 2026", setting="WallX, Pi0 and Wall-WM (robotics models) on 16 nodes",
         what="step time over AdamW's", figure="+2.1%, +1.7%, +3.4%"),
    dict(source=f"X-Square DMuon, [README at 001f582]({DMUON.format('001f5826527b8447b15f0efa455adfe0ca1f3043')}),"
                " May 2026", setting="Llama-3.1-8B, 128 A800, sequences of 4,096, FSDP-Z2 and HSDP-Z3",
         what="step time over AdamW's", figure="+8.0%, +4.7%",
         step_ms=(1271, 1372), sequence=4096),   # the FSDP-Z2 row: AdamW's and DMuon's p50 step (ms)
)


def reported_rows() -> list[list[str]]:
    """``REPORTED`` as table rows: source, setting, Muon's extra over AdamW (or the paper's share)."""
    rows = []
    for r in REPORTED:
        if r.get("kind") == "throughput":
            adamw, muon = r["values"]
            figure = f"{1 - muon / adamw:.1%} less model throughput ({muon:,} against {adamw:,} TFLOP/s)"
        else:
            figure = f"{r['figure']} ({r['what']})"
        rows.append([r["source"], r["setting"], figure])
    return rows


def hardware_rows() -> list[list[str]]:
    """``hardware.H100_TABLE`` for a page: figure, value, kind, source."""
    def value(v, unit):
        if isinstance(v, tuple):
            return f"{v[0] * 1e6:.0f} us, {v[1] / 1e9:.0f} GB/s"
        if unit == "FLOP/s":
            return f"{v / 1e12:,.0f} TFLOP/s"
        if unit == "bytes/s":
            return f"{v / 1e12:.2f} TB/s"
        return f"{v:g} {unit}"
    return [[key, value(v, unit), kind, source] for key, (v, unit, kind, source) in hardware.H100_TABLE.items()]

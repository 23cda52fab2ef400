"""The whole-step model (``muongrid/lab/wholestep.py``): its constants against what they come from, and the
shares it reports against their definitions. No process is launched; the meta-device count takes seconds.
"""
from __future__ import annotations

import math

import pytest

from muongrid import hardware
from muongrid.lab import gpurecord, wholestep
from muongrid.lab.stepcost import GiB, measure
from muongrid.lab.stepmodels import is_muon, named_params, ours_hybrid


def test_muons_bytes_per_element_are_what_the_step_moves_on_the_meta_device():
    """ELEMENT_BYTES["muon"]: our step's bytes outside Newton-Schulz, less fused AdamW's 28 per AdamW element,
    per Muon element, recounted on GPT-2's shapes (the constant was read off Llama-3.2-1B's)."""
    named = named_params("gpt2-124m", "meta")
    cost = measure(ours_hybrid(named, "meta").step).summary()
    muon = sum(p.numel() for n, p in named if is_muon(n, p))
    adamw = sum(p.numel() for n, p in named if not is_muon(n, p))
    per_element = (cost["outside_ns_gib"] * GiB - adamw * wholestep.ELEMENT_BYTES["adamw"]) / muon
    assert per_element == pytest.approx(wholestep.ELEMENT_BYTES["muon"], rel=0.1)
    assert sum(n.endswith(".qkv") for n, _ in named) == 12   # all of GPT-2's layers


def test_active_parameters():
    """Dense models use every parameter; Kimi K2's token uses 8 of 384 routed experts: its report's "32B
    activated" (the builder's simplifications put it within 3%)."""
    specs, _ = wholestep.model_specs("llama3-8b")
    assert wholestep.active_params("llama3-8b") == sum(math.prod(s.full_shape) for g in specs for s in g)
    assert 32e9 < wholestep.active_params("kimi-k2") < 33e9


def test_one_gpu_is_held_to_the_record():
    """On the record's own configuration: AdamW's step is the measured fused pass (the bandwidth comes from it),
    forward + backward is the measured rate on 6 N T, and the modelled Muon step is within 25% of torch.optim.Muon's
    measured one."""
    record = gpurecord.load()
    runs = next(m for m in record["bench"]["models"] if m["model"] == "llama-1b")["runs"]
    r = wholestep.whole_step(wholestep.CONFIGS[0])
    assert r["config"].dp * r["config"].tp == 1 and r["config"].tokens == 16_384
    assert r["layouts"]["adamw"]["total"] * 1e3 == pytest.approx(runs["torch_adamw_fused"]["gpu_ms"], rel=0.01)
    assert r["forward_backward"] == pytest.approx(6 * 1_235_814_400 * 16_384 / hardware.figure("model_flops"))
    assert r["layouts"]["owner"]["total"] * 1e3 == pytest.approx(runs["torch_hybrid"]["gpu_ms"], rel=0.25)


def test_shares_follow_their_definitions_and_owner_beats_bucket_on_the_8b():
    r = wholestep.whole_step(wholestep.CONFIGS[2])
    fb, adamw = r["forward_backward"], r["layouts"]["adamw"]
    for layout, t in r["layouts"].items():
        assert t["optimizer_share"][0] == pytest.approx(t["total"] / (fb + t["total"]))
        hidden = fb + t["total"] - t["zero1"]
        assert t["over_adamw"][1] == pytest.approx(hidden / (fb + adamw["total"] - adamw["zero1"]) - 1)
        assert t["zero1"] == pytest.approx(adamw["zero1"]) or layout == "aligned"   # aligned pads its shards
    assert r["layouts"]["adamw"]["over_adamw"] == (0.0, 0.0)
    assert r["layouts"]["owner"]["over_adamw"][0] < r["layouts"]["bucket"]["over_adamw"][0]

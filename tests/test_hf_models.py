"""`transformers` models (a Llama and a GPT-2, built from small configs with random weights) trained for 3
steps under DistributedMuon (ZeRO-1, layout "owner") and FSDPMuon (``fully_shard`` per decoder layer, then
the root), against single-device muongrid.MuonW in the same process (tests/hf_run.py says how).

Two launches, cached and shared by the tests (about 60 s together on this project's 2-core machine):

* 2x1: both models under both optimizers, a Mixtral (MoE: 3-D expert banks) under both too, plus gradient accumulation (2 micro-batches: the Llama under
  ZeRO-1, the GPT-2 under FSDP2 with ``set_requires_gradient_sync`` on the last micro-batch only) and the
  Llama ``torch.compile``d (backend "aot_eager": inductor compiled one step of this Llama in 67 s per process
  here, aot_eager in 10 s; AOT autograd's graphs run by eager kernels);
* 2x2: the Llama tensor-parallel over "tp" (``parallelize_module``) under ZeRO-1 over "dp".

**Bit for bit (tolerance 0)** wherever the layout promises it (README): the reference steps with each
rank's gradient computed as one process computes it for that rank's rows, averaged over DP. On 2 DP ranks
that mean is exactly what the reduce-scatter makes (a + b needs no order). Under TP the model's gradients
are not one process's (row-parallel layers sum partial products across ranks), so the reference steps with
the TP model's own gradients, gathered whole, and the TP model's loss is held to ``TP_LOSS_RTOL`` of the
one-process model's on the same weights. A change that moves one element by one ulp fails these tests:
syncing FSDP2's gradients on every micro-batch instead of the last (a sum in another order) did, by hand.
"""
from __future__ import annotations

import functools
import os
import re
import sys

import pytest

from conftest import ROOT, last_json, run

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # the ranks build models from configs: nothing may try the network

TP_LOSS_RTOL = 1e-5    # fp32 losses of about 4.6; another summation order moves them by a few ulps (1e-7)
CASES_2X1 = ["llama-zero1", "gpt2-zero1", "llama-fsdp", "gpt2-fsdp", "llama-zero1-accum", "gpt2-fsdp-accum",
             "llama-zero1-compile", "mixtral-zero1", "mixtral-fsdp"]
CASES_2X2 = ["llama-zero1-tp"]
MUON = {"llama": r"(_orig_mod\.)?model\.layers\.\d\.(self_attn|mlp)\.\w+_proj\.weight",
        "mixtral": r"model\.layers\.\d\.(self_attn\.\w+_proj\.weight|mlp\.experts\.(gate_up|down)_proj)",
        "gpt2": r"transformer\.h\.\d\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight"}


@functools.lru_cache(maxsize=None)
def launch(dp: int, tp: int, cases: tuple[str, ...]) -> dict:
    proc = run([sys.executable, str(ROOT / "tests" / "hf_run.py"), "--dp", str(dp), "--tp", str(tp),
                "--cases", ",".join(cases), "--steps", "3"], timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return last_json(proc.stdout)["cases"]


def result(case: str) -> dict:
    return launch(2, 2, tuple(CASES_2X2))[case] if case in CASES_2X2 else launch(2, 1, tuple(CASES_2X1))[case]


@pytest.mark.parametrize("case", CASES_2X1 + CASES_2X2)
def test_same_parameters_as_one_process_bit_for_bit(case):
    r = result(case)
    assert r["max_diff"] == 0.0, {n: d for n, d in r["diff"].items() if d}
    assert r["min_moved"] > 1e-3          # every parameter moved, so equal parameters say something
    losses, ref = r["losses"], r["ref_losses"]
    assert all(len(set(rank)) == 3 for rank in losses)                     # each step's loss is new
    if case in CASES_2X2:
        assert sum(losses, []) == pytest.approx(sum(ref, []), rel=TP_LOSS_RTOL)
    else:
        assert losses == ref                                                # the same forward, bit for bit


@pytest.mark.parametrize("case", CASES_2X1 + CASES_2X2)
def test_the_optimizer_got_the_routed_groups(case):
    """The table read from the wrapped model (fully_shard, torch.compile, parallelize_module) routes as the
    plain model does: embeddings, the (tied) head, norms and biases to AdamW, hidden matrices to Muon."""
    r = result(case)
    kind = case.split("-")[0]
    assert r["muon"] == r["muon_group"]
    assert r["muon"] and all(re.fullmatch(MUON[kind], n) for n in r["muon"]), r["muon"]
    assert not any(re.fullmatch(MUON[kind], n) for n in r["adamw"]), r["adamw"]
    assert len(r["muon"]) == {"llama": 14, "gpt2": 8, "mixtral": 12}[kind]   # 7, 4 and 4 + 2 banks per layer
    embed = "transformer.wte.weight" if kind == "gpt2" else "model.embed_tokens.weight"
    if kind == "mixtral":   # the routers go to AdamW
        assert sum(bool(re.fullmatch(r"model\.layers\.\d\.mlp\.gate\.weight", n)) for n in r["adamw"]) == 2
    assert any(n.endswith(embed) for n in r["adamw"])
    if kind == "gpt2":
        assert "lm_head.weight" not in r["adamw"] + r["muon"]   # tied: once, under the embedding's name
    else:
        assert any(n.endswith("lm_head.weight") for n in r["adamw"])

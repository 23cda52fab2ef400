"""Training the tensor-parallel tiny GPT with scripts/train.py, and the optimizer reading DTensor parameters.

Multi-process part: one train.py launch per grid (1x1, 2x1, 1x2, 2x2; cached, shared by the tests),
a tiny model (width 32, 1 layer, 2 heads, 16-character windows, global batch 8) for 8 hybrid
Muon steps, with 1 thread per rank (threads that spin-wait make tiny models slow on a busy machine).
The grids run different layouts (owner, aligned, bucket, group), which verify.py shows to be
bit-for-bit the same (the group layout's grouped matrices within its tolerance, tests/test_group_layout.py),
so every flow is exercised once: on 2x2 the group layout, sized by time on a hardware profile given with
``--hw`` (a JSON file: ``SLOW_HW``), gives the two 32x128 MLP matrices a group of ranks each and the other two
an owner, so its launch runs the owner flow and the group flow.

**Tolerance of the loss curves: 2e-3 nats per step, absolute** (the group layout included: its grouped
matrices differ from one process's Newton-Schulz by the order of bf16 sums, the same kind of drift; on
this model its 2x2 curve equals the owner layout's). The grids compute the same global
mean loss on the same data, but not with the same arithmetic: DP sums the gradient of each
slice's mean, TP splits the matmuls (RowwiseParallel sums partial products with an all-reduce),
so fp32 results differ in their last bits, and Newton-Schulz runs in bf16, where a last-bit
difference in its input can flip a rounding (a relative step of 2^-8). Measured on this model, the
curves of the four grids agree within 5e-5 over 8 steps, the same size as the difference between
one process run with 1 and with 2 threads (1.1e-5 at step 5): it is reduction-order drift. 2e-3 is
40 times that, and over 40 times smaller than the loss's average fall per step here (about 0.09
nats), so a real fault cannot hide under it: with every DP rank training on the first slice (a
mutation tried once by hand), the 2x1 curve left the 1x1 one by up to 0.11 nats, and by at least
0.016 at every step. Bit-exactness on one grid is verify.py's job.

One more launch trains with ``--fsdp`` (FSDP2 x TP on 2x2, FSDPMuon) and ``--compare-torch-muon``: both
curves must follow the 1x1 one within the same tolerance, and the comparison's counts are checked.

In-process part (a one-rank gloo group, no launch): the plan takes its split dims from DTensor
placements, DTensor parameters give the same steps as plain ones, and placements it cannot
handle are refused with an error naming the parameter.
"""
from __future__ import annotations

import functools
import importlib
import json

import pytest
import torch
import torch.distributed as dist

from conftest import BUILD, last_json, script

GRIDS = [(1, 1, "owner"), (2, 1, "aligned"), (1, 2, "bucket"), (2, 2, "group")]
STEPS, EVERY, TOL = 8, 4, 2e-3
TINY = ["--width", "32", "--layers", "1", "--heads", "2", "--context", "16", "--batch", "8", "--steps", str(STEPS),
        "--eval-every", str(EVERY), "--eval-batches", "1", "--eval-batch", "8", "--lr", "0.01", "--threads", "1"]


TRACES = BUILD / "traces" / "test_train"
PROFILED = (1, 2, "bucket")  # this grid's run also writes Chrome traces (profiling changes no number)


# a slow rank (1 GFLOP/s) in nodes of 4, fast links inside: the group layout's launch sizes its groups on it
SLOW_HW = dict(flops=1e9, efficiency=1.0, ranks_per_node=4, intra=[1e-6, 1e9], inter=[1e-4, 1e8])


@functools.lru_cache(maxsize=None)
def train(dp: int, tp: int, layout: str):
    profile = ["--profile", str(TRACES)] if (dp, tp, layout) == PROFILED else []
    if layout == "group":
        hw_file = BUILD / "test_train_hw.json"
        hw_file.parent.mkdir(parents=True, exist_ok=True)
        hw_file.write_text(json.dumps(SLOW_HW))
        profile = ["--hw", str(hw_file)]
    proc = script("train.py", "--dp", str(dp), "--tp", str(tp), "--optimizer", "hybrid", "--layout", layout, *TINY,
                  *profile)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc, last_json(proc.stdout)


@pytest.mark.parametrize("dp,tp,layout", GRIDS[1:], ids=[f"{d}x{t}-{lay}" for d, t, lay in GRIDS[1:]])
def test_grids_follow_the_same_loss_curve(dp, tp, layout):
    ref = train(*GRIDS[0])[1]
    got = train(dp, tp, layout)[1]
    diffs = [abs(a - b) for a, b in zip(got["step_loss"], ref["step_loss"])]
    assert len(diffs) == STEPS and max(diffs) <= TOL, diffs
    val = [abs(a["val_loss"] - b["val_loss"]) for a, b in zip(got["evals"], ref["evals"])]
    assert max(val) <= TOL, val


def test_loss_falls_and_json_holds_the_run():
    proc, r = train(2, 2, "group")
    assert (r["dp"], r["tp"], r["world_size"], r["optimizer"], r["layout"]) == (2, 2, 4, "hybrid", "group")
    assert r["step_loss"][-1] < r["step_loss"][0] - 0.3
    assert [e["step"] for e in r["evals"]] == [0, EVERY, STEPS]
    assert r["evals"][-1]["val_loss"] < r["evals"][0]["val_loss"] - 0.3
    assert r["tokens_seen"] == STEPS * 8 * 16 and r["evals"][-1]["tokens"] == r["tokens_seen"]
    assert r["tokens_per_s"] > 0
    t = r["time_ms"]
    assert set(t) >= {"step", "forward_backward", "waiting", "optimizer", "optimizer_compute", "communication"}
    assert set(t["communication"]) == {"grad_reduce_scatter", "ns_to_owner", "ns_group_gram", "ns_from_owner",
                                       "param_all_gather"}
    assert sum(r["ns_calls_per_step"]) == 2 + 2 * 2   # two owned matrices, two grouped ones of two members each
    assert r["hw"] == dict(SLOW_HW, parallel_ranks=None) and sorted(r["ns_groups"]) == ["blocks.0.fc.weight", "blocks.0.out.weight"]
    assert sorted(sum(r["ns_groups"].values(), [])) == [0, 1, 2, 3]   # two groups of two, on different ranks
    assert len(r["time_ms_per_rank"]) == 4 and len(r["bytes_per_step_per_rank"]) == 4
    assert r["bytes_per_step"] == r["ledger"]["bytes_sent"] > 0
    assert sum(p["bytes_sent"] for p in r["ledger"]["phases"].values()) == r["bytes_per_step"]
    assert f"step {STEPS}/{STEPS}" in proc.stdout and "tokens/s" in proc.stdout
    # the plan read TP splits from the DTensor placements parallelize_module made
    split = r["tp_split_dims"]
    assert (split["blocks.0.qkv.weight"], split["blocks.0.fc.weight"]) == (0, 0)
    assert (split["blocks.0.proj.weight"], split["blocks.0.out.weight"]) == (1, 1)
    assert split["embed.tok.weight"] == split["head.weight"] == split["norm.weight"] == -1
    # state metrics every K steps, one row per Muon matrix, measured by its owner or summed over its group
    assert [m["step"] for m in r["state_metrics"]] == [EVERY, STEPS]
    rows = r["state_metrics"][-1]["matrices"]
    assert set(rows) == {f"blocks.0.{n}.weight" for n in ("qkv", "proj", "fc", "out")}
    for row in rows.values():
        assert row["momentum_norm"] > 0 and 0.05 < row["update_rms"] < 0.3
        assert row["out_effective_rank"] > row["in_effective_rank"]   # NS flattens the spectrum
        assert row["out_top_median"] < row["in_top_median"]


def test_state_metrics_under_the_bucket_layout_are_measured_once():
    r = train(*PROFILED)[1]
    assert len(r["state_metrics"][0]["matrices"]) == 4


def test_profile_traces_every_rank_and_splits_the_step():
    r = train(*PROFILED)[1]
    assert r["profile_ms_per_rank"] and len(r["profile_ms_per_rank"]) == 2
    for rank, prof in enumerate(r["profile_ms_per_rank"]):
        assert prof["trace"].endswith(f"trace_rank{rank}.json") and (TRACES / f"trace_rank{rank}.json").stat().st_size
        assert prof["steps"] == [2, 4]
        assert prof["forward_backward"] > 0 and prof["optimizer"] > 0  # medians of parts need not sum to the step's
        assert prof["newton_schulz"] > 0 and prof["communication"] > 0 and 0 < prof["optimizer_share"] < 1
    assert train(*GRIDS[0])[1]["profile_ms_per_rank"] is None


# ---- in one process: DTensor parameters on a one-rank grid ---------------------------------------

@pytest.fixture(scope="module")
def grid():
    from muongrid import Grid
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield Grid.build(1, 1)
    finally:
        dist.destroy_process_group()


def dtensors(grid, placements):
    from torch.distributed.tensor import distribute_tensor
    torch.manual_seed(0)
    return [torch.nn.Parameter(distribute_tensor(torch.randn(6, 10), grid.mesh["tp"], [pl])) for pl in placements]


def test_plan_split_dims_come_from_placements(grid):
    from torch.distributed.tensor import Replicate, Shard
    from muongrid import DistributedMuon
    params = dtensors(grid, [Shard(0), Shard(1), Replicate(), Shard(-1)]) + [torch.nn.Parameter(torch.randn(4, 4))]
    opt = DistributedMuon([dict(params=params, names=list("abcde"))], grid, layout="owner")
    assert opt.param_groups[0]["tp_split_dims"] == [0, 1, -1, 1, -1]
    assert [m.tp_split_dim for m in opt.plan.metas[0]] == [0, 1, -1, 1, -1]
    assert [m.full_shape for m in opt.plan.metas[0]][:4] == [(6, 10)] * 4
    from torch.distributed.tensor import distribute_tensor
    on_grid = torch.nn.Parameter(distribute_tensor(torch.randn(6, 10), grid.mesh, [Replicate(), Shard(1)]))
    assert DistributedMuon([dict(params=[on_grid])], grid).param_groups[0]["tp_split_dims"] == [1]


@pytest.mark.parametrize("kind", ["muon", "adamw"])
def test_dtensor_parameters_step_like_plain_ones(grid, kind):
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from muongrid import DistributedAdamW, DistributedMuon
    cls = DistributedMuon if kind == "muon" else DistributedAdamW
    dts = dtensors(grid, [Shard(0), Shard(1), Replicate()])
    plain = [torch.nn.Parameter(p.to_local().clone()) for p in dts]
    opts = [cls([dict(params=ps, lr=0.02)], grid, layout="owner") for ps in (dts, plain)]
    for step in range(3):
        for ps in (dts, plain):
            for i, p in enumerate(ps):
                g = torch.randn(6, 10, generator=torch.Generator().manual_seed(10 * step + i))
                p.grad = distribute_tensor(g, p.device_mesh, p.placements) if isinstance(p, DTensor) else g
        for opt in opts:
            opt.step()
    for a, b in zip(dts, plain):
        assert torch.equal(a.to_local(), b.detach())


def test_placements_it_cannot_handle_are_refused(grid):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from muongrid import DistributedMuon
    t = torch.randn(6, 10)
    fsdp = torch.nn.Parameter(distribute_tensor(t, grid.mesh, [Shard(0), Replicate()]))
    with pytest.raises(ValueError, match=r"'w'.*sharded over the 'dp'.*FSDP"):
        DistributedMuon([dict(params=[fsdp], names=["w"])], grid)
    partial = torch.nn.Parameter(DTensor.from_local(t, grid.mesh["tp"], [Partial()]))
    with pytest.raises(ValueError, match=r"'w'.*Partial"):
        DistributedMuon([dict(params=[partial], names=["w"])], grid)
    rows = torch.nn.Parameter(distribute_tensor(t, grid.mesh["tp"], [Shard(0)]))
    with pytest.raises(ValueError, match=r"'w'.*tp_split_dims says 1.*says 0"):
        DistributedMuon([dict(params=[rows], names=["w"], tp_split_dims=[1])], grid)
    other = torch.nn.Parameter(distribute_tensor(t, init_device_mesh("cpu", (1,), mesh_dim_names=("x",)), [Shard(0)]))
    with pytest.raises(ValueError, match=r"'w'.*mesh with dimensions \('x',\)"):
        DistributedMuon([dict(params=[other], names=["w"])], grid)


def test_head_major_gpt_is_charlms_function():
    from muongrid.lab.charlm import TinyGPT
    from muongrid.lab.tpgpt import head_major_gpt
    torch.manual_seed(3)
    ref = TinyGPT(50, d=32, n_layer=2, n_head=4, context=16)
    torch.manual_seed(3)
    ours = head_major_gpt(50, d=32, n_layer=2, n_head=4, context=16)
    x = torch.randint(0, 50, (2, 16))
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-6)


def load_train_script():
    """The entry point as a module (pytest puts scripts/ on the path: pyproject.toml), for its argument checks."""
    return importlib.import_module("train")


def test_hw_is_for_the_group_layout_and_a_bad_profile_is_named(tmp_path, capsys):
    parse = load_train_script().parse_args
    assert parse(["--layout", "group", "--hw", "h100"]).hw["ranks_per_node"] == 8
    bad = tmp_path / "hw.json"
    bad.write_text(json.dumps(dict(SLOW_HW, efficiency=2)))
    for argv, words in ((["--layout", "owner", "--hw", "h100"], "needs --layout group"),
                        (["--layout", "group", "--hw", "a100"], "'h100' or a JSON file"),
                        (["--layout", "group", "--hw", str(bad)], "efficiency must be in")):
        with pytest.raises(SystemExit):
            parse(argv)
        assert words in capsys.readouterr().err, argv


def test_param_groups_per_optimizer():
    train_script = load_train_script()
    from muongrid.lab.tpgpt import head_major_gpt
    model = head_major_gpt(50, d=32, n_layer=1, n_head=2, context=16)
    hidden = {"qkv", "proj", "fc", "out"}
    for kind, muon_names in (("hybrid", hidden), ("muon", hidden | {"tok", "pos", "head"})):
        groups = train_script.param_groups(model, kind, 0.01, 0.003, 0.1)
        muon = {n.split(".")[-2] for g in groups if g["use_muon"] for n in g["names"]}
        assert muon == muon_names, kind
        assert {g["lr"] for g in groups if not g["use_muon"]} == {0.003}


def test_a_gradient_placed_unlike_its_parameter_is_refused(grid):
    from torch.distributed.tensor import Shard, distribute_tensor
    from muongrid import DistributedMuon
    w = torch.nn.Parameter(distribute_tensor(torch.randn(6, 10), grid.mesh["tp"], [Shard(0)]))
    opt = DistributedMuon([dict(params=[w], names=["w"])], grid)
    w.grad = torch.randn(6, 10)
    with pytest.raises(ValueError, match=r"'w' is a DTensor placed.*gradient is a plain tensor"):
        opt.step()


def test_ns_metrics_math():
    from muongrid.lab.statemetrics import ns_metrics, spectrum_stats
    q = torch.linalg.qr(torch.randn(8, 8, generator=torch.Generator().manual_seed(0)))[0]
    flat = spectrum_stats(torch.ones(8))
    assert flat["effective_rank"] == pytest.approx(8) and flat["top_median"] == pytest.approx(1)
    assert spectrum_stats(torch.tensor([5.0, 0, 0, 0]))["effective_rank"] == pytest.approx(1)
    rank1 = torch.outer(torch.arange(1.0, 9), torch.ones(8))
    row = ns_metrics(rank1, q, lr_factor=2.0)
    assert row["in_effective_rank"] == pytest.approx(1, abs=1e-3) and row["out_effective_rank"] == pytest.approx(8)
    assert row["momentum_norm"] == pytest.approx(rank1.norm().item())
    assert row["update_rms"] == pytest.approx(2.0 / 8 ** 0.5)   # an orthogonal 8x8 matrix has RMS 1/sqrt(8)


@pytest.mark.parametrize("shape,long_dim", [((6, 15), 1), ((14, 5), 0)])
def test_a_grouped_matrix_metrics_from_its_members_blocks_equal_the_whole_matrix(shape, long_dim):
    """The group layout's members each see a block of the long side; ``merge`` of their partial Gram
    matrices gives the whole matrix's row (eigenvalues of X X^T in float64 against an SVD in float32: 1e-4)."""
    from muongrid.lab.statemetrics import merge, ns_metrics, short_gram
    gen = torch.Generator().manual_seed(1)
    before = torch.randn(shape, generator=gen) @ torch.diag(torch.logspace(0, -1, shape[1]))
    after = torch.randn(shape, generator=gen)
    whole = ns_metrics(before, after, lr_factor=0.5)
    per_rank = [{"w": dict(gram_in=short_gram(b, shape), gram_out=short_gram(a, shape), numel=before.numel(),
                           lr_factor=0.5)}
                for b, a in zip(torch.tensor_split(before, 3, long_dim), torch.tensor_split(after, 3, long_dim))]
    per_rank.append({"v": whole})      # a whole row from another rank passes through
    merged = merge(per_rank)
    assert merged["v"] is whole and set(merged["w"]) == set(whole)
    assert all(merged["w"][k] == pytest.approx(v, rel=1e-4) for k, v in whole.items())


# ---- FSDP2: fully_shard on "dp" (after TP on "tp"), FSDPMuon, and torch.optim.Muon beside it ----------

@functools.lru_cache(maxsize=None)
def train_fsdp(dp: int, tp: int, *extra: str):
    proc = script("train.py", "--fsdp", "--dp", str(dp), "--tp", str(tp), "--optimizer", "hybrid", *TINY, *extra)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc, last_json(proc.stdout)


def test_fsdp_follows_the_same_loss_curve_and_beats_torch_muon_on_traffic():
    """2x2 FSDP2 x TP with FSDPMuon follows the 1x1 ZeRO-1 curve (same tolerance as the grids above), and
    torch.optim.Muon trained beside it on the same batches lands on the same curve (its Newton-Schulz differs
    from ours only by the order of bf16 sums, test_fsdp.py) while moving more, more often."""
    ref = train(*GRIDS[0])[1]
    proc, r = train_fsdp(2, 2, "--compare-torch-muon")
    assert r["fsdp"] and (r["dp"], r["tp"]) == (2, 2)
    assert max(abs(a - b) for a, b in zip(r["step_loss"], ref["step_loss"])) <= TOL
    c = r["compare"]
    assert max(abs(a - b) for a, b in zip(c["step_loss_torch"], r["step_loss"])) <= TOL
    assert c["ns_calls_per_step_all_ranks"] == dict(muongrid=4, torch=16)     # 4 block matrices: once vs on every rank
    assert sum(r["ns_calls_per_step"]) == 4
    assert c["collectives_per_step"]["muongrid"] == 2 < c["collectives_per_step"]["torch"]
    assert 0 < c["bytes_per_step"]["muongrid"] < c["bytes_per_step"]["torch"]
    assert set(r["ledger"]["phases"]) == {"ns_to_owner", "ns_from_owner"}
    assert "muongrid FSDPMuon" in proc.stdout and "torch.optim.Muon" in proc.stdout
    assert r["tp_split_dims"]["blocks.0.qkv.weight"] == ["_S(0, 2)", "S(0)"]   # rows over TP, then over DP (strided)
    assert r["tp_split_dims"]["head.weight"] == ["S(0)"]                     # replicated over TP: rows over DP only

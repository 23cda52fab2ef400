"""The "group" layout: a matrix above its fair share of Newton-Schulz work orthogonalised by a group of ranks.

Pure checks (plan, routing arithmetic, closed form, the Gram form over a group, options) run in this
process; one launch per grid (``tests/group_run.py``, three problems per launch, and the owner layout's
options on a fourth: ``ns_batch``, ``ns_form="gram"``, Polar Express, each overlap mode) checks the
optimizer against single-device Muon with the same options on 2x1, 1x2, 2x2, 3x2 and 2x4, and 1x1 runs in
this process.

Tolerance for a grouped matrix: the relative Frobenius distance between its parameters and the
reference's, over the size of the reference's update (parameters after 3 steps minus before), must be
at most 1e-2 on every rank's TP shard. Why 1e-2: the group sums the Gram matrix in another order than one
GEMM (``ns_group.py``), which moves an occasional bf16 rounding; ``tests/test_ns_group.py`` bounds one
orthogonalisation at 1e-2 relative in bf16 (measured up to 7.1e-3), the reference's own bf16-vs-fp32
distance is 1.2e-2 to 1.5e-2, and the gradients here do not depend on the parameters, so three steps'
differences add to the updates without compounding. Measured here: up to about 3e-3.
Every other matrix must equal the reference (and the owner layout) bit for bit. A grouped matrix runs in
the form with fewer bytes (``ns_group.group_form``): every launch has one in each form (the wide and
replicated problems are near square enough for the row form, the tall one, 64 x 228, is not). A fourth
problem sizes its groups by time on a hardware profile (``hw=``), which on 2 x 2 makes groups that are not
contiguous and share a rank; a row-form
matrix sums nothing across ranks, and on the machine where it was measured (``test_group_rows.py``) it
must also equal the reference bit for bit.

    pytest -q tests/test_group_layout.py
"""
import functools
import json
import math
import random
import threading
import sys

import pytest
import torch

from muongrid import DistributedMuon, Grid, hardware
from muongrid.comm import Comm
from muongrid.group_routes import band_indices, block_positions, count_in_band, local_band, long_bounds
from muongrid.lab import costmodel
from muongrid.lab.synthetic import REPORT_SHAPES, REPORT_TP_DIMS
from conftest import last_json
from muongrid.layouts import group_window
from muongrid.newton_schulz import zeropower_ns5
from muongrid.ns_gram_group import gram_sharded_flops, zeropower_gram_sharded
from muongrid.ns_variants import ns_flops
from muongrid.ns_group import group_form, sharded_collectives, simulate, split_long_side, zeropower_sharded
from muongrid.plan import ParamSpec, build_plan, disagreement, plan_key
from conftest import ROOT, run

import group_run
from test_group_rows import MEASURED_EXACT

TOLERANCE = 1e-2


def test_plan_gives_the_dominant_matrix_a_contiguous_tp_local_group_and_the_rest_owners():
    specs = [[ParamSpec("a", (20, 36), 1), ParamSpec("big", (96, 230), 0), ParamSpec("b", (24, 24), -1)]]
    for dp, tp in ((1, 1), (2, 1), (1, 2), (2, 2), (3, 2), (2, 4), (4, 4)):
        plan = build_plan(specs, dp, 0, tp, 4000, "group")
        keys = {(0, i) for i in range(3)}
        assert set(plan.owners) | set(plan.groups) == keys and not set(plan.owners) & set(plan.groups)
        if dp * tp == 1:
            assert plan.groups == {}
            continue
        members = plan.groups[(0, 1)]
        assert len(members) > 1 and members == tuple(range(members[0], members[0] + len(members)))
        if len(members) <= tp:
            assert members[0] // tp == members[-1] // tp      # inside one TP group
        assert build_plan(specs, dp, dp - 1, tp, 4000, "group").groups == plan.groups   # same on every rank
    assert build_plan(specs, 2, 0, 2, 4000, "owner").groups == {}
    assert group_window([5, 0, 0, 0, 9, 9, 9, 9], 2, 4) == (1, 2)
    assert group_window([0, 0, 0, 0, 1, 1, 1, 1], 6, 2) == (0, 1, 2, 3, 4, 5)


def test_routing_counts_agree_with_the_indices_and_rebuild_every_block_exactly():
    rng = random.Random(0)
    for _ in range(200):
        R, C, dim = rng.randint(1, 17), rng.randint(1, 17), rng.randint(0, 1)
        a = rng.randint(0, R * C)
        b = rng.randint(a, R * C)
        lo = rng.randint(0, (R, C)[dim])
        hi = rng.randint(lo, (R, C)[dim])
        assert len(band_indices(a, b, (R, C), dim, lo, hi)) == count_in_band(a, b, (R, C), dim, lo, hi)
    gen = torch.Generator().manual_seed(1)
    for full_shape, tp, tp_dim, dp, size in (((10, 8), 2, 1, 3, 3), ((6, 14), 2, 1, 2, 4), ((12, 5), 3, 0, 2, 5),
                                              ((9, 11), 1, -1, 4, 3), ((8, 8), 2, 0, 3, 2)):
        full = torch.randn(full_shape, generator=gen)
        dim, bounds = long_bounds(full_shape, size)
        shards = list(full.chunk(tp, dim=tp_dim)) if tp_dim != -1 else [full]
        for i, block in enumerate(torch.tensor_split(full, size, dim=dim)):
            rebuilt = torch.full((block.numel(),), float("nan"))
            for t, shard in enumerate(shards):
                flat = shard.reshape(-1)
                cuts = [min(d * -(-flat.numel() // dp), flat.numel()) for d in range(dp + 1)]
                for a, b in zip(cuts, cuts[1:]):
                    band = local_band(full_shape, tuple(shard.shape), tp_dim, t, bounds[i], bounds[i + 1])
                    src = band_indices(a, b, tuple(shard.shape), dim, *band)
                    dst = block_positions(a, b, full_shape, tuple(shard.shape), tp_dim, t, bounds[i], bounds[i + 1])
                    assert len(src) == len(dst) == count_in_band(a, b, tuple(shard.shape), dim, *band)
                    rebuilt[dst] = flat[a:b][src]
            assert torch.equal(rebuilt.view(block.shape), block), (full_shape, tp, tp_dim, dp, size, i)


def test_gram_bytes_closed_form_is_the_ring_price_of_the_kernels_collectives():
    for rows, cols, size in ((96, 230, 2), (4096, 4096, 4), (228, 64, 3)):
        calls, nbytes = sharded_collectives(rows, cols, split_b=True, size=size)
        m = min(rows, cols)
        reduced = [1] + [m * m] * 5                     # all-reduces: the norm and 5 Grams, fp32
        gathered = -(-m // size) * m                    # all-gathers: 5 blocks of B's rows, bf16
        assert calls == len(reduced) + 5 and nbytes == 4 * sum(reduced) + 5 * 2 * gathered
        ring = sum(2 * (size - 1) * -(-n // size) * 4 for n in reduced) + 5 * (size - 1) * gathered * 2
        assert costmodel.group_gram_bytes(rows, cols, size) == ring


@pytest.mark.parametrize("shape,k", [((24, 70), 3), ((61, 20), 4), ((33, 33), 2)])
def test_gathering_b_gives_the_same_bits_as_all_reducing_it(shape, k):
    G = torch.randn(shape, generator=torch.Generator().manual_seed(5))
    long_dim, blocks = split_long_side(G, k)
    for dtype in (torch.bfloat16, torch.float32):
        reduced = simulate(blocks, long_dim, split_b=True, dtype=dtype)
        gathered = simulate(blocks, long_dim, split_b=True, gather_b=True, dtype=dtype)
        assert all(torch.equal(a, b) for a, b in zip(reduced, gathered))
    with pytest.raises(ValueError, match="needs split_b"):
        zeropower_sharded(blocks[0], lambda t: t, long_dim, all_gather=lambda t: t)


def test_group_layout_takes_the_owner_layouts_options_and_refuses_bad_ones_naming_them():
    problem = group_run.problem_for("replicated", 1)
    opt = DistributedMuon([dict(g, ns_form="gram") for g in problem.param_groups()], Grid.single(), layout="group",
                          ns_batch=True, overlap="naive")
    assert (opt.ns_batch, opt.overlap, opt.param_groups[0]["ns_form"]) == (True, "naive", "gram")
    with pytest.raises(ValueError, match="ns_form must be one of"):
        DistributedMuon([dict(g, ns_form="cubic") for g in problem.param_groups()], Grid.single(), layout="group")
    with pytest.raises(ValueError, match="overlap must be one of"):
        DistributedMuon(problem.param_groups(), Grid.single(), layout="group", overlap="eager")
    with pytest.raises(ValueError, match="needs layout='owner', 'aligned' or 'group'"):
        DistributedMuon(problem.param_groups(), Grid.single(), layout="bucket", ns_batch=True)


def in_threads(blocks: list[torch.Tensor], run) -> list[torch.Tensor]:
    """``run(block, all_reduce)`` for k members in k threads, the all-reduce summing in rank order."""
    k, barrier, slots, out = len(blocks), threading.Barrier(len(blocks)), [None] * len(blocks), [None] * len(blocks)

    def member(i: int) -> None:
        def all_reduce(t: torch.Tensor) -> torch.Tensor:
            slots[i] = t
            barrier.wait()
            total = functools.reduce(torch.add, slots)
            barrier.wait()
            return total
        out[i] = run(blocks[i], all_reduce)

    threads = [threading.Thread(target=member, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(o is not None for o in out)
    return out


@pytest.mark.parametrize("shape,k", [((24, 70), 3), ((61, 20), 2), ((33, 33), 4)])
def test_the_gram_form_over_a_group_is_one_process_gram_form_to_rounding(shape, k):
    """``ns_gram_group`` on k members (partial Grams summed in rank order, in threads) and on one, against
    ``zeropower_ns5(form="gram")`` of the whole matrix. float64: within 1e-12 (the same algebra, another
    order of additions). bf16: never further from the float64 result than one process's bf16 Gram form
    plus 1e-3 (measured: +2e-4 at most, 3 seeds x 7 shapes), and within the group tolerance of it when the
    matrix is not square (measured up to 4.5e-4). A square matrix is the Gram form's worst case (R's small
    eigenvalues are the squares of the singular values, below bf16's resolution): there one process's bf16
    Gram form is itself 1.4e-2 to 5e-2 from float64, and a last-bit change of R moves it by up to 1.8e-2."""
    G = torch.randn(shape, generator=torch.Generator().manual_seed(6))
    long_dim, blocks = split_long_side(G, k)

    def rel(a, b):
        return float((a.double() - b.double()).norm() / b.double().norm())

    for parts in (blocks, [G]):
        for dtype in (torch.float64, torch.bfloat16):
            got = in_threads(parts, lambda b, ar: zeropower_gram_sharded(b, ar, long_dim, dtype=dtype,
                                                                         coefficients="polar_express"))
            whole = torch.cat(got, dim=long_dim)
            ref = zeropower_ns5(G, dtype=dtype, form="gram", coefficients="polar_express")
            assert whole.shape == G.shape and whole.dtype == dtype
            if dtype == torch.float64:
                assert rel(whole, ref) <= 1e-12
            else:
                exact = zeropower_ns5(G, dtype=torch.float64, form="gram", coefficients="polar_express")
                assert rel(whole, exact) <= rel(ref, exact) + 1e-3, len(parts)
                assert shape[0] == shape[1] or rel(whole, ref) <= TOLERANCE, len(parts)
    m, n = min(shape), max(shape)
    square = ns_flops(*shape, 5, "gram") - 4 * m * m * n        # the m x m iteration, every member's
    assert sum(gram_sharded_flops(*shape, b.shape[long_dim]) for b in blocks) == 4 * m * m * n + k * square
    with pytest.raises(ValueError, match="2-D shard and long_dim"):
        zeropower_gram_sharded(G, lambda t: t, 2)


def planned_groups(name: str, dp: int, tp: int) -> list:
    """``group_run``'s report of the groups that ``build_plan`` gives problem ``name`` (with its ``hw``)."""
    specs = [[ParamSpec(n, tuple(s), d) for n, s, d in zip(g["names"], g["shapes"], g["tp_split_dims"])]
             for g in group_run.problem_for(name, tp).groups]
    plan = build_plan(specs, dp, 0, tp, group_run.BUCKET_NUMEL, "group", hw=group_run.HW.get(name))
    return sorted([list(k), list(v)] for k, v in plan.groups.items())


def test_a_profile_sizes_groups_by_time_into_groups_no_flop_window_forms():
    """The launches' timed problem (``group_run.TIMED_HW``): on 2 x 2 its two large matrices get ranks 0, 1, 2
    and ranks 0, 3, which are neither contiguous windows nor disjoint, so the launch runs the flow on such
    groups; without the profile the same matrices get FLOP windows. Every rank plans the same groups."""
    timed = planned_groups("timed", 2, 2)
    assert [members for _, members in timed] == [[0, 1, 2], [0, 3]], timed
    specs = [[ParamSpec(n, tuple(s), d) for n, s, d in zip(g["names"], g["shapes"], g["tp_split_dims"])]
             for g in group_run.problem_for("timed", 2).groups]
    flop_sized = build_plan(specs, 2, 0, 2, group_run.BUCKET_NUMEL, "group").groups
    assert all(m == tuple(range(m[0], m[0] + len(m))) for m in flop_sized.values()) and flop_sized
    assert build_plan(specs, 2, 1, 2, group_run.BUCKET_NUMEL, "group", hw=group_run.TIMED_HW).groups == {
        tuple(k): tuple(v) for k, v in timed}
    # on the assumed H100 figures these small matrices are not worth a group: Newton-Schulz takes less than
    # a group's collectives' latency, so every matrix keeps one owner
    assert build_plan(specs, 2, 0, 2, group_run.BUCKET_NUMEL, "group", hw=hardware.h100()).groups == {}


def test_ranks_that_share_cores_get_groups_no_larger_than_the_ranks_that_compute_at_once():
    """``parallel_ranks``: on one machine whose cores the ranks share, a group larger than the ranks that can
    compute at once only adds traffic. The report's 4096 x 4096 matrix on 2 x 2, with a CPU core's rate per
    rank and a loopback link: four members when every rank has its own device, two (one TP group) when two
    compute at once, none (one owner) when one does."""
    specs = [[ParamSpec(f"w{i}", s, d) for i, (s, d) in enumerate(zip(REPORT_SHAPES, REPORT_TP_DIMS))]]
    link = (1.4e-3, 2.9e8)
    groups = {par: build_plan(specs, 2, 0, 2, 2**20, "group",
                              hw=hardware.profile(190e9, 1.0, None, link, link, parallel_ranks=par)).groups
              for par in (None, 4, 2, 1)}
    assert groups == {None: {(0, 0): (0, 1, 2, 3)}, 4: {(0, 0): (0, 1, 2, 3)}, 2: {(0, 0): (0, 1)}, 1: {}}
    with pytest.raises(ValueError, match="parallel_ranks must be a positive int"):
        hardware.profile(190e9, 1.0, None, link, link, parallel_ranks=0)
    shared = dict(hardware.profile(190e9, 1.0, None, link, link), shared_cores=True)   # the time model's CPU kind
    with pytest.raises(ValueError, match="whole machine's, shared by its ranks"):
        build_plan(specs, 2, 0, 2, 2**20, "group", hw=shared)


def test_a_profile_file_with_an_unknown_key_or_bad_bytes_is_refused_naming_the_file(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(dict(hardware.h100(), parallel_ranks=4, name="my cluster")))
    assert hardware.load(str(good))["parallel_ranks"] == 4 and hardware.load("H100") == hardware.h100()
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps(dict(hardware.h100(), parallel_rank=1)))     # misspelt: must not pass unseen
    shared = tmp_path / "shared.json"
    shared.write_text(json.dumps(dict(hardware.h100(), shared_cores=True)))
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe")
    for path, words in ((typo, r"unknown keys \['parallel_rank'\]"), (shared, "unknown keys"),
                        (binary, "binary.json: not a JSON hardware profile"), (tmp_path, "is neither")):
        with pytest.raises(ValueError, match=words):
            hardware.load(str(path))


def test_a_profile_is_checked_and_only_the_group_layout_takes_one():
    specs = [[ParamSpec("w", (96, 230), 0)]]
    with pytest.raises(ValueError, match="needs layout='group', not 'owner'"):
        build_plan(specs, 2, 0, 2, None, "owner", hw=hardware.h100())
    for bad, words in ((dict(flops=1e9), "lacks"), (dict(hardware.h100(), efficiency=0), "efficiency"),
                       (dict(hardware.h100(), inter=(5e-6,)), "inter must be"),
                       (dict(hardware.h100(), ranks_per_node=2.5), "ranks_per_node"), ("h100", "must be a dict")):
        with pytest.raises(ValueError, match=words):
            build_plan(specs, 2, 0, 2, None, "group", hw=bad)
    import numpy as np
    numpy_typed = hardware.check_hw(dict(hardware.h100(), flops=np.float32(2**40), ranks_per_node=np.int64(8)))
    assert numpy_typed["flops"] == 2**40 and type(numpy_typed["ranks_per_node"]) is int
    for bad, words in ((dict(hardware.h100(), flops=10**400), "flops must be"),
                       (dict(hardware.h100(), parallel_ranks=16), "cannot exceed ranks_per_node"),
                       (dict(hardware.h100(), shared_cores=True), "whole machine's")):
        with pytest.raises(ValueError, match=words):
            hardware.check_hw(bad)
    w = torch.nn.Parameter(torch.zeros(96, 230))
    with pytest.raises(ValueError, match="needs layout='group', not 'owner'"):   # refused before any collective
        DistributedMuon([dict(params=[w])], Grid.single(), layout="owner", hw=hardware.h100())
    h100 = plan_key(specs, [["float32"]], "group", None, [True], hardware.h100())
    other = plan_key(specs, [["float32"]], "group", None, [True], dict(hardware.h100(), ranks_per_node=4))
    assert "ranks_per_node 4 on rank 1 but 8 on rank 0" in disagreement([h100, other])
    assert disagreement([h100, h100]) is None
    none = plan_key(specs, [["float32"]], "group", None, [True])
    assert "given on rank 0 but not on rank 1" in disagreement([h100, none])
    assert "given on rank 1 but not on rank 0" in disagreement([none, h100])


GROUP_CALLS = {"gram": 1 + 2 * 5,    # the norm and 5 Gram all-reduces, 5 all-gathers of B's rows
               "rows": 1 + 2 * 5}    # the matrix, then 5 all-gathers of A's rows and 5 of X's


def check_grid(result: dict, dp: int, tp: int) -> None:
    ranks = result["ranks"]
    assert len(ranks) == dp * tp
    forms = set()
    for name in group_run.LARGE:
        problem = group_run.problem_for(name, tp)
        shapes = {n: s for g in problem.groups for n, s in zip(g["names"], g["shapes"])}
        per_rank = [r[name] for r in ranks]
        groups = per_rank[0]["groups"]
        assert all(r["groups"] == groups for r in per_rank)            # the same plan everywhere
        assert groups == planned_groups(name, dp, tp), (name, groups)  # sized as build_plan says (hw: by time)
        assert (len(groups) > 0) == (dp * tp > 1), (name, groups)
        form = {f"w{key[1]}": group_form(*shapes[f"w{key[1]}"], len(members)) for key, members in groups}
        forms |= set(form.values())
        for rank, found in enumerate(per_rank):
            assert found["owner_matrices_equal_owner_layout"], (name, rank)
            for pname, row in found["params"].items():
                assert row["owner_max_abs"] == 0.0, (name, rank, pname, row)
                assert row["grouped"] == (pname in form)
                if not row["grouped"]:
                    assert row["group_max_abs"] == 0.0, (name, rank, pname, row)
                    continue
                rel = math.sqrt(row["sq_diff"] / row["sq_update"])
                assert rel <= TOLERANCE, (name, rank, pname, rel)
                size = len(dict((f"w{k[1]}", m) for k, m in groups)[pname])
                if form[pname] == "rows" and MEASURED_EXACT and min(shapes[pname]) // size >= 4:
                    assert row["group_max_abs"] == 0.0, (name, rank, pname, row)   # one thread per rank
            expected = costmodel.step_bytes(problem.groups, dp, tp, group_run.BUCKET_NUMEL, layout="group", rank=rank,
                                            hw=group_run.HW.get(name))
            for phase in costmodel.PHASES:
                assert found["bytes_per_phase"].get(phase, 0) == expected[phase], (name, rank, phase)
            calls = sum(GROUP_CALLS[form[f"w{key[1]}"]] for key, members in groups if rank in members)
            assert found["calls_per_phase"].get("ns_group_gram", 0) == calls
        owned = len(per_rank[0]["owners"])
        assert sum(r["ns_calls"] for r in per_rank) == owned + sum(len(m) for _, m in groups)
        assert sum(r["owner_ns_calls"] for r in per_rank) == owned + len(groups)
    if dp * tp > 1:
        assert forms == {"gram", "rows"}, forms       # every launch runs both forms of the group


def check_options(result: dict, dp: int, tp: int) -> None:
    """``group_run.OPTIONS`` on every rank: owner matrices bit for bit against single-device Muon with the same
    options, grouped ones within the tolerance; the overlap mode asked for; Newton-Schulz calls per rank =
    (distinct shapes owned if batched, else matrices owned) + groups the rank is in; the Gram form's two
    all-reduces per grouped matrix."""
    for label, (ns_options, keywords) in group_run.OPTIONS.items():
        per_rank = [r["options"][label] for r in result["ranks"]]
        assert all(r["groups"] == per_rank[0]["groups"] for r in per_rank)
        assert (len(per_rank[0]["groups"]) > 0) == (dp * tp > 1), label
        for rank, found in enumerate(per_rank):
            assert (found["overlap"], found["ns_batch"]) == (keywords["overlap"], keywords.get("ns_batch", False))
            for pname, row in found["params"].items():
                if row["grouped"]:
                    assert math.sqrt(row["sq_diff"] / row["sq_update"]) <= TOLERANCE, (label, rank, pname)
                else:
                    assert row["max_abs"] == 0.0, (label, rank, pname, row)
            owned = found["distinct_shapes_owned"] if found["ns_batch"] else found["matrices_owned"]
            assert found["ns_calls"] == owned + found["memberships"], (label, rank, found)
            if ns_options.get("ns_form") == "gram":   # two all-reduces per grouped matrix, priced in closed form
                assert found["calls_per_phase"].get("ns_group_gram", 0) == 2 * found["memberships"], (label, rank)
                assert found["bytes_per_phase"].get("ns_group_gram", 0) == found["gram_form_bytes"], (label, rank)
    # batching batched something: ten 12x8 matrices on at most 8 ranks, so some rank owns two of one shape
    batched = [r["options"]["batch-none"] for r in result["ranks"]]
    assert any(r["matrices_owned"] > r["distinct_shapes_owned"] for r in batched)


def test_one_by_one_runs_in_process_with_no_groups_and_equals_the_reference():
    grid = Grid.single()
    found = {name: group_run.check(grid, name) for name in group_run.LARGE}
    found["options"] = {label: group_run.check_options(grid, label) for label in group_run.OPTIONS}
    check_grid(dict(ranks=[found]), 1, 1)
    check_options(dict(ranks=[found]), 1, 1)


@pytest.mark.parametrize("dp,tp", [(2, 1), (1, 2), (2, 2), (3, 2), (2, 4)])
def test_group_layout_against_single_device_muon(dp, tp):
    proc = run([sys.executable, str(ROOT / "tests" / "group_run.py"), "--dp", str(dp), "--tp", str(tp)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    check_grid(result, dp, tp)
    check_options(result, dp, tp)

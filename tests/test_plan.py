"""The ZeRO-1 plan, the tensor moves that follow it, the grid layout and the closed-form byte count."""
from __future__ import annotations

import random

import pytest
import torch

from muongrid.lab.costmodel import bytes_ratio, step_bytes
from muongrid.grid import check_grid, grid_layout
from muongrid.newton_schulz import ns5_flops
from muongrid.plan import (DEFAULT_BUCKET_NUMEL, SHARD_NUMEL, ParamSpec, bucket_limit, build_plan, split_into_buckets,
                           tp_local_shape)
from muongrid.sharding import bucket_matrix, dp_shard_of, pack_bucket, tp_shard, tp_unshard, unpack_bucket
from muongrid.lab.synthetic import DEFAULT_SHAPES, DEFAULT_TP_DIMS, build_problem


def random_cases(n=60, seed=0):
    rng = random.Random(seed)
    for _ in range(n):
        tp = rng.choice([1, 2, 4])
        dp = rng.choice([1, 2, 3, 4, 5, 8])
        groups = []
        for _ in range(rng.randint(1, 3)):
            specs = []
            for i in range(rng.randint(1, 5)):
                dim = rng.choice([-1, 0, 1])
                shape = [rng.randint(1, 40), rng.randint(1, 40)]
                if dim >= 0:
                    shape[dim] *= tp
                specs.append(ParamSpec(f"p{len(groups)}.{i}", tuple(shape), dim))
            groups.append(specs)
        yield groups, dp, tp, rng.choice([None, 50, 300, 2000])


@pytest.mark.parametrize("case", list(random_cases()), ids=lambda c: f"dp{c[1]}-tp{c[2]}-b{c[3]}")
def test_every_element_is_owned_by_exactly_one_dp_rank(case):
    groups, dp, tp, bucket_numel = case
    plans = [build_plan(groups, dp, r, tp, bucket_numel) for r in range(dp)]
    for b_idx, specs in enumerate(groups):
        buckets = plans[0].buckets[b_idx]
        # Buckets tile the buffer in order, each padded to a multiple of dp by less than dp.
        assert buckets[0].start == 0
        for prev, nxt in zip(buckets, buckets[1:]):
            assert nxt.start == prev.start + prev.padded_numel
        assert plans[0].global_buffer_size[b_idx] == sum(b.padded_numel for b in buckets)
        for b in buckets:
            assert b.padded_numel % dp == 0 and 0 <= b.padded_numel - b.numel < dp
        for i, spec in enumerate(specs):
            metas = [p.metas[b_idx][i] for p in plans]
            assert len({(m.global_range, m.shape, m.bucket_idx) for m in metas}) == 1  # same on every rank
            owned = sorted((m.local_range for m in metas if m.local_numel), key=lambda r: r[0])
            # The owned pieces are disjoint and cover the parameter exactly.
            assert owned[0][0] == metas[0].global_range[0] and owned[-1][1] == metas[0].global_range[1]
            for a, b in zip(owned, owned[1:]):
                assert a[1] == b[0]
            for r, m in enumerate(metas):
                lo, hi = plans[r].bucket_of(m).shard_range(r)
                assert lo <= m.local_range[0] <= m.local_range[1] <= hi
            assert metas[0].shape == tp_local_shape(spec.name, spec.full_shape, spec.tp_split_dim, tp)


def test_default_shapes_straddle_shard_boundaries_and_need_padding():
    specs = [[ParamSpec(f"w{i}", s, d) for i, (s, d) in enumerate(zip(DEFAULT_SHAPES, DEFAULT_TP_DIMS))]]
    plans = [build_plan(specs, 3, r, 1, None) for r in range(3)]
    owners = [sum(p.metas[0][i].local_numel > 0 for p in plans) for i in range(len(DEFAULT_SHAPES))]
    assert max(owners) > 1                                 # some matrix is split between DP ranks
    bucket = plans[0].buckets[0][0]
    assert bucket.numel == sum(a * b for a, b in DEFAULT_SHAPES) == 715280
    assert bucket.padded_numel == 715281                   # 715280 does not divide by 3


def test_a_group_index_has_one_name_and_0_4s_name_still_reads_it():
    """``group_idx`` (issue 53); ``buffer_idx``, the proof of concept's and muongrid 0.4's name, reads the same."""
    specs = [[ParamSpec("a", (6, 4), -1)], [ParamSpec("b", (5, 3), -1), ParamSpec("c", (4, 4), -1)]]
    plan = build_plan(specs, 2, 1, 1, 8)
    for g, (metas, buckets) in enumerate(zip(plan.metas, plan.buckets)):
        assert [m.group_idx for m in metas] == [m.buffer_idx for m in metas] == [g] * len(metas)
        assert [b.group_idx for b in buckets] == [b.buffer_idx for b in buckets] == [g] * len(buckets)


def test_buckets_break_on_parameter_boundaries():
    assert split_into_buckets([10, 10, 10], 25) == [[0, 1], [2]]
    assert split_into_buckets([30, 5, 5], 25) == [[0], [1, 2]]   # too big for a bucket: alone
    assert split_into_buckets([30, 5, 5], None) == [[0, 1, 2]]


def test_auto_buckets_grow_with_dp_so_shards_keep_their_size():
    """"auto" (the optimizer's default) is 2^20 elements up to 4 DP ranks, the grids the tests run, and beyond them
    grows so each rank's shard of a bucket keeps ``SHARD_NUMEL`` elements: at 1,024 ranks a plan of many 2^20-element
    matrices cuts shards of 2^18, not 2^10, and issues a 256th of the buckets' collectives."""
    assert [bucket_limit("auto", dp) for dp in (1, 2, 4)] == [DEFAULT_BUCKET_NUMEL] * 3
    assert bucket_limit("auto", 1024) == 1024 * SHARD_NUMEL
    assert bucket_limit("auto", 1024, aligned=True) == 1024 * DEFAULT_BUCKET_NUMEL   # aligned grew already
    assert bucket_limit(300, 8) == 300 and bucket_limit(None, 8) is None
    specs = [[ParamSpec(f"w{i}", (1024, 1024), -1) for i in range(512)]]
    auto, fixed = (build_plan(specs, 1024, 0, 1, b, "owner") for b in ("auto", DEFAULT_BUCKET_NUMEL))
    assert len(fixed.buckets[0]) == 512 and len(auto.buckets[0]) == 2
    assert min(b.shard_numel for b in auto.buckets[0]) == SHARD_NUMEL
    for bad in (0, -1, 2.5, True, "big"):
        with pytest.raises(ValueError, match="bucket_numel must be"):
            bucket_limit(bad, 2)


def test_tp_split_that_does_not_divide_is_a_clear_error():
    with pytest.raises(ValueError, match="'w'.*dimension 1 has size 30, which does not divide by tp=4"):
        tp_local_shape("w", (100, 30), 1, 4)
    with pytest.raises(ValueError, match="not a dimension"):
        tp_local_shape("w", (100, 32), 2, 4)
    with pytest.raises(ValueError, match="does not divide"):
        tp_shard(torch.zeros(100, 30), 1, 4, 0, "w")


@pytest.mark.parametrize("dim", [0, 1])
def test_tp_shard_and_unshard_are_inverse(dim):
    full = torch.arange(8 * 12, dtype=torch.float32).view(8, 12)
    meta = build_plan([[ParamSpec("w", (8, 12), dim)]], 1, 0, 4).metas[0][0]
    shards = [tp_shard(full, dim, 4, r) for r in range(4)]
    assert all(s.shape == meta.shape for s in shards)
    assert torch.equal(tp_unshard(torch.cat([s.view(-1) for s in shards]), meta, 4), full)


def test_pack_unpack_and_dp_pieces_reassemble_every_parameter():
    specs = [[ParamSpec("a", (7, 5)), ParamSpec("b", (3, 11)), ParamSpec("c", (13,))]]
    dp = 4
    tensors = [torch.randn(s.full_shape) for s in specs[0]]
    plans = [build_plan(specs, dp, r, 1, None) for r in range(dp)]
    bucket = plans[0].buckets[0][0]
    flat = pack_bucket(tensors, bucket)
    assert flat.numel() == bucket.padded_numel and torch.equal(flat[bucket.numel:], torch.zeros(bucket.padded_numel - bucket.numel))
    for i, t in enumerate(tensors):
        assert torch.equal(bucket_matrix(flat, bucket, plans[0].metas[0][i]), t)
        pieces = torch.cat([dp_shard_of(t, p.metas[0][i]) for p in plans])
        assert torch.equal(pieces, t.reshape(-1))
    out = [torch.zeros_like(t) for t in tensors]
    unpack_bucket(flat, bucket, plans[0].metas[0], out)
    assert all(torch.equal(a, b) for a, b in zip(out, tensors))


def test_grid_layout_is_tp_fastest():
    layout = grid_layout(2, 4)
    assert [r["tp_group"] for r in layout[:4]] == [[0, 1, 2, 3]] * 4
    assert layout[5]["dp_group"] == [1, 5] and (layout[5]["dp_rank"], layout[5]["tp_rank"]) == (1, 1)
    with pytest.raises(ValueError, match="world size 3 does not equal dp\\*tp = 2\\*2 = 4"):
        check_grid(2, 2, 3)
    with pytest.raises(ValueError, match="at least 1"):
        check_grid(0, 2)


@pytest.mark.parametrize("dp", [2, 3, 4, 8])
@pytest.mark.parametrize("bucket_numel", [None, 50_000, 2**20])
def test_closed_form_ratio_is_the_papers_upper_bound_on_dp_only_grids(dp, bucket_numel):
    groups = build_problem("muon").groups
    assert bytes_ratio(groups, dp, 1, bucket_numel) == 1.25          # (4 + 2 + 4) / (4 + 4), exactly
    assert bytes_ratio(build_problem("adamw").groups, dp, 1, bucket_numel) == 1.0
    assert 1.0 < bytes_ratio(build_problem("hybrid").groups, dp, 1, bucket_numel) < 1.25


def test_closed_form_tp_gathers_come_on_top():
    groups = build_problem("muon").groups
    with_tp = step_bytes(groups, 2, 2, None)
    assert with_tp["ns_gather_tp"] > 0 and bytes_ratio(groups, 2, 2, None) > 1.25
    assert step_bytes(groups, 2, 2, None, muon=False)["ns_gather_tp"] == 0
    assert bytes_ratio(groups, 1, 4, None) is None                   # AdamW moves nothing at dp = 1


# ---- layouts: shard cuts and owners -----------------------------------------------------------

def layout_cases():
    for case in random_cases(n=40, seed=1):
        for layout in ("owner", "aligned"):
            yield (*case, layout)


@pytest.mark.parametrize("case", list(layout_cases()), ids=lambda c: f"{c[4]}-dp{c[1]}-tp{c[2]}-b{c[3]}")
def test_every_matrix_has_one_owner_the_same_on_every_rank_and_work_is_balanced(case):
    groups, dp, tp, bucket_numel, layout = case
    plans = [build_plan(groups, dp, r, tp, bucket_numel, layout) for r in range(dp)]
    keys = {(g, i) for g, specs in enumerate(groups) for i in range(len(specs))}
    assert set(plans[0].owners) == keys                                # every matrix, exactly once
    assert all(p.owners == plans[0].owners for p in plans)             # whichever rank computes it
    assert set(plans[0].owners.values()) <= set(range(dp * tp))
    load = [0] * (dp * tp)
    for (g, i), rank in plans[0].owners.items():
        load[rank] += ns5_flops(*groups[g][i].full_shape)
    flops = [ns5_flops(*s.full_shape) for specs in groups for s in specs]
    if layout == "owner":  # longest-processing-time-first: never worse than the mean plus one matrix
        assert max(load) <= sum(flops) / (dp * tp) + max(flops)
    else:  # aligned: the owner's DP rank holds the whole matrix, so nothing crosses DP
        for (g, i), rank in plans[0].owners.items():
            meta = plans[0].metas[g][i]
            assert plans[0].piece_numel(meta, rank // tp) == meta.numel


def test_aligned_cuts_fall_between_matrices_and_owner_cuts_are_equal():
    specs = [[ParamSpec(f"w{i}", s, -1) for i, s in enumerate([(30, 10), (10, 10), (20, 10), (40, 10)])]]
    aligned = build_plan(specs, 3, 0, 1, None, "aligned").buckets[0][0]
    bounds = {0, 300, 400, 600, 1000}
    assert set(aligned.cuts) <= bounds and aligned.cuts[0] == 0 and aligned.cuts[-1] == 1000
    assert aligned.shard_numel == max(b - a for a, b in zip(aligned.cuts, aligned.cuts[1:]))
    owner = build_plan(specs, 3, 0, 1, None, "owner").buckets[0][0]
    assert owner.cuts == (0, 334, 668, 1000) and owner.padded_numel == 1002
    assert build_plan(specs, 3, 0, 1, None, "bucket").buckets[0][0] == owner


def test_pack_and_unpack_with_uneven_shards_round_trip():
    specs = [[ParamSpec(f"w{i}", s, -1) for i, s in enumerate([(3, 5), (2, 2), (4, 4), (1, 7)])]]
    bucket = build_plan(specs, 3, 0, 1, None, "aligned").buckets[0][0]
    tensors = [torch.arange(a * b, dtype=torch.float32).view(a, b) + 100 * i
               for i, (a, b) in enumerate([(3, 5), (2, 2), (4, 4), (1, 7)])]
    flat = pack_bucket(tensors, bucket)
    assert flat.numel() == bucket.padded_numel
    for r in range(3):  # shard r is its elements, then zeros up to shard_numel
        lo, hi = bucket.cuts[r], bucket.cuts[r + 1]
        chunk = flat[r * bucket.shard_numel:(r + 1) * bucket.shard_numel]
        assert torch.equal(chunk[:hi - lo], torch.cat([t.reshape(-1) for t in tensors])[lo:hi])
        assert not chunk[hi - lo:].any()
    metas = build_plan(specs, 3, 0, 1, None, "aligned").metas[0]
    out = [torch.zeros_like(t) for t in tensors]
    unpack_bucket(flat, bucket, metas, out)
    assert all(torch.equal(a, b) for a, b in zip(out, tensors))


def test_unknown_layout_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown layout 'rows'.*bucket"):
        build_plan([[ParamSpec("w", (4, 4))]], 1, 0, 1, None, "rows")

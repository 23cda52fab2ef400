"""The fast plan builder (layouts.EvenCuts, HeldRuns, _Loads' ranks filed by load; plan.piece_runs) gives the
same plan as the straightforward code it replaced, kept here as the reference: every rank's key compared
for every matrix (O(world) per matrix), every DP rank's piece asked for, every cut stored.

    PYTHONPATH=scripts python -m pytest -q tests/test_fast_plan.py
"""
from __future__ import annotations


import pytest

from muongrid.layouts import HeldRuns, Matrix, _Loads, _pick_owner, assign_owners, assign_owners_and_groups, even_cuts, group_ns_flops, group_window
from muongrid.newton_schulz import ns5_flops
from muongrid.plan import ParamSpec, owner_candidates, build_plan

from muongrid.lab.model_shapes import MODELS


def reference_candidates(plan, muon):
    """The old ``plan.owner_candidates``: every DP rank's piece, a full tuple per matrix."""
    out = []
    for group_idx, metas in enumerate(plan.metas):
        if not muon[group_idx]:
            continue
        for meta in metas:
            per_dp = [plan.piece_numel(meta, d) for d in range(plan.dp)]
            held = tuple(per_dp[r // plan.tp] for r in range(plan.world))
            ranks = range(plan.world)
            if plan.layout == "aligned":
                ranks = [r for r in ranks if per_dp[r // plan.tp] == meta.numel]
            out.append(Matrix((group_idx, meta.param_idx), ns5_flops(*meta.full_shape), held, tuple(ranks)))
    return out


def reference_owners(matrices, world):
    """The old ``layouts.assign_owners``: a min over every candidate for every matrix."""
    load, owners = [0] * world, {}
    for m in sorted(matrices, key=lambda m: -m.flops):
        rank = min(m.candidates, key=lambda r: (load[r], -m.held[r], r))
        owners[m.key] = rank
        load[rank] += m.flops
    return owners


def reference_groups(matrices, world, shapes, steps=5, split_b=False, tp=None):
    """The old ``layouts.assign_owners_and_groups``."""
    fair = sum(m.flops for m in matrices) / world
    load, owners, groups = [0] * world, {}, {}
    for m in sorted(matrices, key=lambda m: -m.flops):
        size = min(world, max(shapes[m.key]), -(-m.flops // max(1, int(fair))))
        if m.flops > fair and size > 1:
            members = (tuple(sorted(sorted(range(world), key=lambda r: (load[r], r))[:size])) if tp is None
                       else group_window(load, size, tp))
            for r in members:
                load[r] += group_ns_flops(*shapes[m.key], size, steps, split_b)
            groups[m.key] = members
            continue
        rank = min(m.candidates, key=lambda r: (load[r], -m.held[r], r))
        owners[m.key] = rank
        load[rank] += m.flops
    return owners, groups, load


CASES = [("llama3-8b", 2, 8, 4, 2**20), ("llama3-8b", 4, 16, 4, 2**18), ("moonlight-16b-a3b", 2, 3, 4, 2**20),
         ("moonlight-16b-a3b", 2, 64, 1, 2**19), ("kimi-k2", 2, 7, 2, 2**22), ("llama3-70b", 2, 96, 1, 2**20)]


@pytest.mark.parametrize("model,layers,dp,tp,bucket_numel", CASES)
def test_fast_plan_equals_the_reference(model, layers, dp, tp, bucket_numel):
    """Mid-size cases (MoE layers cut down; uneven DP such as 3, 7 and 96; matrices straddling shards and
    buckets holding many matrices): the same cuts, pieces, owners, groups and loads, exactly. The
    assignment's ties (equal FLOPs, equal loads, equal held pieces) are where a faster search could pick
    another rank, and these models have many of them (every expert matrix is the same shape)."""
    specs, muon = MODELS[model][0](layers)
    world = dp * tp
    for layout in ("owner", "aligned", "group"):
        plan = build_plan(specs, dp, dp - 1, tp, bucket_numel=bucket_numel, layout=layout, muon=muon)
        for buf in plan.buckets:
            for b in buf:
                want = even_cuts(b.numel, dp) if layout != "aligned" or not muon[b.group_idx] else tuple(b.cuts)
                assert b.cuts == want and tuple(b.cuts) == want and b.shard_numel == max(
                    y - x for x, y in zip(want, want[1:]))
        fast, ref = owner_candidates(plan, muon), reference_candidates(plan, muon)
        assert [(m.key, m.flops, tuple(m.held), m.candidates) for m in fast] == \
               [(m.key, m.flops, m.held, m.candidates) for m in ref]
        if layout != "group":
            assert plan.owners == reference_owners(ref, world) == assign_owners(fast, world)
        shapes = {m.key: plan.metas[m.key[0]][m.key[1]].full_shape for m in ref}
        for kw in (dict(), dict(split_b=True), dict(split_b=True, tp=tp)):
            assert assign_owners_and_groups(fast, world, shapes, **kw) == reference_groups(ref, world, shapes, **kw)


def test_held_runs_index_like_the_tuple():
    held = (0, 0, 5, 5, 5, 2, 0, 7)
    runs = HeldRuns.of(held)
    assert runs.runs == [(2, 5, 5), (5, 6, 2), (7, 8, 7)] and tuple(runs) == held and runs == held
    assert [runs[r] for r in range(8)] == list(held) and len(runs) == 8
    assert tuple(HeldRuns(8, [(1, 2, 5), (3, 4, 7)], tp=2)) == (0, 0, 5, 5, 0, 0, 7, 7)   # over DP ranks of TP 2


def test_the_least_loaded_ranks_pick_the_owner_the_plain_rule_picks():
    """_pick_owner compares only the ranks of the least load (_Loads files them by load): over 2,000 picks each
    equals the rule's plain min over every rank, (load, -held, rank), with loads that tie (integer FLOPs of a
    few sizes, as a MoE's equal experts give) and that do not (float seconds, as assign_timed's), runs of held
    pieces anywhere (the least-loaded rank inside one, or not), and loads also added off the owner (a group's
    members)."""
    import random
    rng, world = random.Random(0), 37
    for amounts in ([3, 5, 8], [0.1, 0.3, 0.7000000001]):
        loads = _Loads(world)
        for _ in range(1000):
            cuts = sorted(rng.sample(range(world + 1), 2 * rng.randint(0, 3)))
            runs = [(lo, hi, rng.randint(1, 3)) for lo, hi in zip(cuts[::2], cuts[1::2])]
            m = Matrix((0, 0), 1, HeldRuns(world, runs), tuple(range(world)))
            want = min(range(world), key=lambda r: (loads.load[r], -m.held[r], r))
            assert _pick_owner(m, world, loads) == want
            assert loads.least() == (min(loads.load), [r for r in range(world) if loads.load[r] == min(loads.load)])
            loads.add(want, rng.choice(amounts))
            if rng.random() < 0.3:
                loads.add(rng.randrange(world), rng.choice(amounts))

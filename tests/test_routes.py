"""The owner layouts' routes (``owner_routes.route``, plan data) against a brute-force enumeration (issue 41).

For many random plans (shapes, TP split dims, DP x TP grids, bucket sizes, "owner" and "aligned"), every rank's
route is built as the optimizer builds it, then the traffic is simulated element by element with labels
(matrix, TP block, flat index): each sender fills its all-to-all send buffer as the route says, the buffers
are exchanged by the route's counts, and every owner must find in its receive buffer exactly the elements its
parts name; the same for what owners send back. Independently of the route, the enumeration says what each
rank holds of each matrix (from the bucket's cuts and the matrix's range, by looping over elements) and checks
that the owner ends up with every element of every TP block exactly once and that each holder gets back exactly
its own piece. Exact: these are integers. A sender with several matrices of one bucket for one owner must occur.
"""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest

from muongrid import owner_routes
from muongrid.plan import ParamSpec, build_plan


def held(plan, meta, dp_rank):
    """Elements [a, b) of the TP-local flat matrix that DP rank ``dp_rank`` holds, by enumeration."""
    bucket = plan.buckets[meta.group_idx][meta.bucket_idx]
    lo, hi = bucket.start + bucket.cuts[dp_rank], bucket.start + bucket.cuts[dp_rank + 1]
    mine = [i for i in range(meta.global_range[0], meta.global_range[1]) if lo <= i < hi]
    if not mine:
        return 0, 0
    assert mine == list(range(mine[0], mine[-1] + 1))
    return mine[0] - meta.global_range[0], mine[-1] + 1 - meta.global_range[0]


def flows_for(specs, dp, tp, bucket_numel, layout):
    """Per rank, its plan and its routes (as the flow gets them: ``owner_routes.route``)."""
    world, out = dp * tp, []
    for rank in range(world):
        plan = build_plan([specs], dp, rank // tp, tp, bucket_numel, layout)
        out.append(SimpleNamespace(plan=plan, route=lambda chunk, plan=plan, rank=rank:
                                   owner_routes.route(plan, rank, chunk)))
    return out


def check_bucket(flows, b, dp, tp):
    """Simulate one bucket's two all-to-alls with labelled elements; returns how many (sender, owner) pairs had
    several matrices of the bucket."""
    world = dp * tp
    plan0 = flows[0].plan
    bucket = plan0.buckets[0][b]
    metas = [plan0.metas[0][i] for i in bucket.param_indices]
    routes = [f.route(bucket) for f in flows]
    owner = [plan0.owner_of(m) for m in metas]

    def block(meta, r):
        return r % tp if meta.tp_split_dim != -1 and tp > 1 else 0

    def sends(meta, r):   # a TP-replicated matrix is sent by the owner's TP rank only
        return meta.tp_split_dim != -1 or r % tp == owner[metas.index(meta)] % tp

    pieces = {(k, r): held(plan0, m, r // tp) for k, m in enumerate(metas) for r in range(world)}
    # what each rank puts in its send buffer, as labels
    sendbuf = []
    for r, route in enumerate(routes):
        buf = [None] * sum(route.send_counts)
        for k, off, _, _, _ in route.sends:
            a, b_ = pieces[(k, r)]
            buf[off: off + b_ - a] = [(k, block(metas[k], r), i) for i in range(a, b_)]
        assert None not in buf, r
        sendbuf.append(buf)
    several = 0
    for r, route in enumerate(routes):
        per_owner = {}
        for k, _, _, _, q in route.sends:
            assert q == owner[k]
            per_owner[owner[k]] = per_owner.get(owner[k], 0) + 1
        several += sum(1 for n in per_owner.values() if n > 1)
        # the expected sends, by enumeration: every matrix I hold a piece of, owned elsewhere, if I send it
        want = sorted(k for k, m in enumerate(metas) if owner[k] != r and pieces[(k, r)][1] > pieces[(k, r)][0]
                      and sends(m, r))
        assert sorted(k for k, *_ in route.sends) == want, (r, route.sends, want)
        # the same traffic said per matrix (owner_routes.messages): what each receiver gets, each way
        said = {}
        for phase, src, dst, name, n in owner_routes.messages(route, r):
            assert src == r and dst != r and n > 0
            said[(phase, dst)] = said.get((phase, dst), 0) + n
        assert {d: n for (p, d), n in said.items() if p == "ns_to_owner"} == {
            d: n for d, n in enumerate(route.send_counts) if n}
        assert {d: n for (p, d), n in said.items() if p == "ns_from_owner"} == {
            d: n for d, n in enumerate(route.back_counts) if n}
    # the all-to-all: receiver q gets, from each r in rank order, r's chunk for q
    for q, route in enumerate(routes):
        recv = []
        for r in range(world):
            start = sum(routes[r].send_counts[:q])
            chunk = sendbuf[r][start: start + routes[r].send_counts[q]]
            assert len(chunk) == route.recv_counts[r], (q, r)
            recv += chunk
        covered = {}
        for item in route.owned:
            k = item.j
            assert owner[k] == q
            split = metas[k].tp_split_dim != -1 and tp > 1   # the bank row: TP blocks of the local shape, or whole
            rows, cols = (metas[k].shape if split else metas[k].full_shape)[-2:]
            assert (item.blocks, item.key) == ((tp, (tp, rows, cols, metas[k].tp_split_dim)) if split
                                               else (1, (1, rows, cols, -1))), (q, k)
            assert all(b_ > a for _, a, b_, _ in item.parts) and all(b_ > a for _, _, a, b_, _ in item.back)
            assert (item.mine is not None) == (pieces[(k, q)][1] > pieces[(k, q)][0])   # only what I hold
            for blk, a, b_, off in item.parts:
                if off is not None:
                    assert recv[off: off + b_ - a] == [(k, blk, i) for i in range(a, b_)], (q, k, blk)
                for i in range(a, b_):
                    covered[(k, blk, i)] = covered.get((k, blk, i), 0) + 1
            blocks = tp if metas[k].tp_split_dim != -1 and tp > 1 else 1
            numel = metas[k].numel
            assert covered_all(covered, k, blocks, numel), (q, k)
        assert all(v == 1 for v in covered.values())
        assert {item.j for item in route.owned} == {k for k in range(len(metas)) if owner[k] == q}
    # back: owner q's send-back buffer, by labels
    backbuf = []
    for q, route in enumerate(routes):
        buf = [None] * sum(route.back_counts)
        for item in route.owned:
            for r, blk, a, b_, off in item.back:
                assert (blk, a, b_) == (block(metas[item.j], r), *pieces[(item.j, r)])
                buf[off: off + b_ - a] = [(r, item.j, blk, i) for i in range(a, b_)]
            if item.mine is not None:
                assert item.mine == (block(metas[item.j], q), *pieces[(item.j, q)])
        assert None not in buf
        backbuf.append(buf)
    for r, route in enumerate(routes):
        recv = []
        for q in range(world):
            start = sum(routes[q].back_counts[:r])
            chunk = backbuf[q][start: start + routes[q].back_counts[r]]
            assert len(chunk) == route.back_recv_counts[q]
            recv += chunk
        want = {k for k in range(len(metas)) if owner[k] != r and pieces[(k, r)][1] > pieces[(k, r)][0]}
        assert set(route.back_recv) == want, r
        for k, (off, n) in route.back_recv.items():
            a, b_ = pieces[(k, r)]
            assert n == b_ - a and recv[off: off + n] == [(r, k, block(metas[k], r), i) for i in range(a, b_)]
        assert sum(n for _, n in route.back_recv.values()) == len(recv)
    return several


def random_specs(rng, tp):
    """Matrices split over TP by rows or columns or not at all (a split declared on a 1-wide TP grid too: no
    split), and now and then a 3-D bank of matrices (whole on every TP rank)."""
    specs = []
    for i in range(rng.randint(1, 7)):
        if rng.random() < 0.15:
            specs.append(ParamSpec(f"m{i}", (rng.randint(2, 3), rng.randint(1, 5), rng.randint(1, 5)), -1))
            continue
        d = rng.choice([-1, 0, 1])
        shape = [rng.randint(1, 9), rng.randint(1, 9)]
        if d != -1:
            shape[d] *= tp
        specs.append(ParamSpec(f"m{i}", tuple(shape), d))
    return specs


def covered_all(covered, k, blocks, numel):
    return all(covered.get((k, blk, i), 0) == 1 for blk in range(blocks) for i in range(numel))


def test_owner_routes_agree_with_an_enumeration_over_random_plans():
    rng = random.Random(41)
    several = cases = 0
    for case in range(120):
        dp, tp = rng.choice([(1, 1), (2, 1), (3, 1), (4, 1), (1, 2), (2, 2), (3, 2), (1, 3), (2, 3), (5, 1)])
        specs = random_specs(rng, tp)
        bucket_numel = rng.choice([None, 8, 30, 100])
        layout = rng.choice(["owner", "aligned"])
        flows = flows_for(specs, dp, tp, bucket_numel, layout)
        for b in range(len(flows[0].plan.buckets[0])):
            several += check_bucket(flows, b, dp, tp)
        cases += 1
    assert cases == 120 and several > 0, several


def test_a_chunk_route_is_its_buckets_routes_laid_end_to_end():
    """A chunk of consecutive buckets travels in one all-to-all each way (``exchange_chunks``): its route must
    carry exactly what its buckets' routes carry (checked against the enumeration above), in bucket order."""
    rng = random.Random(42)
    joined = 0
    for case in range(60):
        dp, tp = rng.choice([(2, 1), (3, 1), (2, 2), (1, 3), (3, 2)])
        flows = flows_for(random_specs(rng, tp), dp, tp, rng.choice([8, 30]), rng.choice(["owner", "aligned"]))
        buckets = flows[0].plan.buckets[0]
        if len(buckets) < 2:
            continue
        joined += 1
        for f in flows:
            chunk, alone = f.route(tuple(buckets)), [f.route(b) for b in buckets]
            for key in ("send_counts", "recv_counts", "back_counts", "back_recv_counts"):
                assert getattr(chunk, key) == [sum(c) for c in zip(*(getattr(r, key) for r in alone))], key
            assert [m.name for m in chunk.metas] == [m.name for r in alone for m in r.metas]
            assert [i.meta.name for i in chunk.owned] == [i.meta.name for r in alone for i in r.owned]
            offsets = [0]
            for r in alone:
                offsets.append(offsets[-1] + len(r.metas))
            assert sorted(k for k, *_ in chunk.sends) == sorted(k + offsets[n] for n, r in enumerate(alone)
                                                                for k, *_ in r.sends)
    assert joined > 10, joined


# ---- the plan's geometry, by enumeration ------------------------------------------------------------------



def test_plan_geometry_agrees_with_an_enumeration_over_random_plans():
    """For 150 random plans and every DP rank: buckets are consecutive, never empty, within ``bucket_numel``
    unless one parameter alone exceeds it, and filled greedily; each shard is [cuts[r], cuts[r+1]) and pads to
    ``shard_numel``; a matrix's local range is its part of this rank's shard (empty: anchored at the shard's
    start); ``segments`` are the maximal runs of the element -> flat position map; ``piece_slice`` is what the
    element loop finds; ``piece_runs`` gives every DP rank's count as runs in order, none empty, at most three
    under even cuts (one per rank when asked: ``even=False``); only the owner layouts give owners; and the
    owners' ``HeldRuns`` list every DP rank's count (times its TP ranks)."""
    from muongrid.plan import owner_candidates, piece_runs, split_into_buckets
    rng = random.Random(7)
    for case in range(150):
        dp, tp = rng.choice([(1, 1), (2, 1), (3, 1), (4, 1), (2, 2), (3, 2), (1, 3), (5, 1), (7, 1)])
        specs, bucket_numel = random_specs(rng, tp), rng.choice([None, 1, 8, 30, 100])
        layout = "".join(list(rng.choice(["bucket", "owner", "aligned"])))   # not interned, as argv's are
        numels = [math.prod(s.full_shape) // (tp if s.tp_split_dim != -1 else 1) for s in specs]
        groups = split_into_buckets(numels, bucket_numel)
        assert [i for g in groups for i in g] == list(range(len(numels))) and all(groups)
        for a, b in zip(groups, groups[1:]):
            assert bucket_numel is not None and sum(numels[i] for i in a) + numels[b[0]] > bucket_numel
        for g in groups:
            assert bucket_numel is None or len(g) == 1 or sum(numels[i] for i in g) <= bucket_numel
        for d in range(dp):
            plan = build_plan([specs], dp, d, tp, bucket_numel, layout)
            limit = bucket_numel * dp if layout == "aligned" and bucket_numel is not None else bucket_numel
            assert [list(b.param_indices) for b in plan.buckets[0]] == split_into_buckets(numels, limit)
            for bucket in plan.buckets[0]:
                cuts = list(bucket.cuts)
                assert cuts[0] == 0 and cuts[-1] == bucket.numel and cuts == sorted(cuts) and len(cuts) == dp + 1
                assert bucket.shard_numel == max(b - a for a, b in zip(cuts, cuts[1:])) and bucket.padded_numel == dp * bucket.shard_numel
                assert bucket.shard_range(d) == (bucket.start + cuts[d], bucket.start + cuts[d + 1])
                position = {}
                for r in range(dp):
                    for i in range(cuts[r], cuts[r + 1]):
                        position[i] = r * bucket.shard_numel + i - cuts[r]
                for i in bucket.param_indices:
                    meta = plan.metas[0][i]
                    lo, hi = meta.global_range[0] - bucket.start, meta.global_range[1] - bucket.start
                    runs = []
                    for x in range(lo, hi):
                        if runs and runs[-1][2] + runs[-1][1] == position[x]:
                            runs[-1][1] += 1
                        else:
                            runs.append([x - lo, 1, position[x]])
                    assert bucket.segments(lo, hi) == [tuple(r) for r in runs], (case, d, i)
                    mine = [x for x in range(lo, hi) if cuts[d] <= x < cuts[d + 1]]
                    s_lo = bucket.start + cuts[d]
                    assert meta.local_range == ((bucket.start + mine[0], bucket.start + mine[-1] + 1) if mine
                                                else (s_lo, s_lo)), (case, d, i)
                    for r in range(dp):
                        a, b = held(plan, meta, r)
                        piece = plan.piece_slice(meta, r)
                        assert (piece.start, piece.stop) == ((a, b) if b > a else (0, 0))
                    counts = [b - a for a, b in (held(plan, meta, r) for r in range(dp))]
                    expanded, runs = [0] * dp, piece_runs(bucket, meta, even=layout != "aligned")
                    assert all(first < end <= after and n > 0 for (first, end, n), (after, _, _)
                               in zip(runs, runs[1:] + [(dp, dp, 0)])), runs   # in order, none empty (HeldRuns)
                    assert layout == "aligned" or len(runs) <= 3, runs   # even cuts: the whole shards one run
                    for first, end, n in runs:
                        for r in range(first, end):
                            expanded[r] = n
                    assert expanded == counts, (case, d, i, piece_runs(bucket, meta, layout != "aligned"), counts)
                    ranks = piece_runs(bucket, meta, even=False)   # one run per DP rank, on any cuts
                    assert [(r, r + 1, counts[r]) for r in range(dp) if counts[r]] == ranks, (case, d, i, ranks)
            assert (layout == "bucket") == (not plan.owners), (case, layout)   # only the owner layouts have owners
            if layout != "bucket" and d == 0:
                for m in owner_candidates(plan, [True]):
                    meta = plan.metas[0][m.key[1]]
                    want = [held(plan, meta, r // tp)[1] - held(plan, meta, r // tp)[0] for r in range(dp * tp)]
                    assert list(m.held) == want, (case, m.key)


def test_a_dp_rank_outside_the_grid_is_refused_with_the_range():
    for dp in (1, 3):
        for bad in (-1, dp, dp + 1):
            try:
                build_plan([[ParamSpec("w", (4, 4))]], dp, bad)
            except ValueError as e:
                assert str(e) == f"dp_rank {bad} outside 0..{dp - 1}"
            else:
                raise AssertionError("accepted")


def test_plan_defaults_and_bad_split_dims():
    """tp defaults to 1 (a split dim then splits nothing); a split dim that is not a dimension is a ValueError
    naming it, whichever side it is off."""
    plan = build_plan([[ParamSpec("w", (4, 6), 0)]], 1, 0)
    assert plan.tp == 1 and plan.metas[0][0].shape == (4, 6)
    for dim in (2, 3, 7):
        try:
            build_plan([[ParamSpec("w", (4, 6), dim)]], 1, 0, 2)
        except ValueError as e:
            assert f"tp_split_dim {dim} is not a dimension" in str(e)
        else:
            raise AssertionError(dim)


def test_owner_routes_on_a_grid_past_260_ranks():
    """260 ranks (130 x 2), 300 small matrices, so ranks above 256 own, hold and send: rank numbers there
    are not CPython's cached small ints, so a comparison by identity (``r is me``) instead of value would fail."""
    specs = [ParamSpec(f"m{i}", (2, 2 + i % 3), (-1, 0, 1)[i % 3]) for i in range(300)]
    flows = flows_for(specs, 130, 2, None, "aligned")   # aligned: an owner holds its matrix, and sends to itself
    assert max(flows[0].plan.owners.values()) > 256
    for b in range(len(flows[0].plan.buckets[0])):
        check_bucket(flows, b, 130, 2)


@pytest.mark.parametrize("overlap", ["none", "naive", "prefetch"])
def test_exchange_chunks_lay_every_bucket_end_to_end_in_k_chunks(overlap):
    """K exchanges per direction (1 without "prefetch", ``chunks`` or ``PREFETCH_CHUNKS`` with it) and every
    bucket in exactly one chunk, in order, the chunks' sizes as even as the count allows (make mutate found
    ``exchanges`` and the chunking's divisor unguarded by the fast tests; tests/test_exchanges.py counts the
    exchanges a simulated step issues)."""
    for chunks in (None, 1, 2, 3, 5):
        k = owner_routes.exchanges(overlap, chunks)
        assert k == (1 if overlap != "prefetch" else owner_routes.PREFETCH_CHUNKS if chunks is None else chunks)
        for n in range(0, 8):
            updates = [(f"b{i}", [i, 10 + i]) for i in range(n)]
            got = owner_routes.exchange_chunks(updates, overlap, chunks)
            assert len(got) == min(k, n)
            assert [b for buckets, _ in got for b in buckets] == [b for b, _ in updates]
            assert [p for _, pieces in got for p in pieces] == [p for _, ps in updates for p in ps]
            sizes = [len(buckets) for buckets, _ in got]   # the larger chunks first, by one at most
            assert sizes == sorted(sizes, reverse=True) and (not sizes or sizes[0] - sizes[-1] <= 1)
    ten = owner_routes.exchange_chunks([(f"b{i}", [f"p{i}a", f"p{i}b"]) for i in range(10)], "prefetch", 4)
    assert [len(buckets) for buckets, _ in ten] == [3, 3, 2, 2]


def test_every_rank_routes_agree_with_each_other_and_their_messages_under_every_owner_layout():
    """Over random plans with one matrix above the fair share (so "group" forms a group), each rank's route must
    agree with its peers' (what I send to q is what q receives from me, both ways), with its own ``messages``, and
    with itself: a grouped matrix comes back into ``group_back``, never ``back_recv``, and my parts read a receive
    offset for exactly the elements others send me (make mutate found the group layout's bookkeeping, ``messages``'
    members and the own-piece test of ``route`` unguarded by the fast tests)."""
    rng = random.Random(53)
    grouped_seen = 0
    for case in range(60):
        dp, tp = rng.choice([(2, 1), (3, 1), (4, 1), (2, 2), (3, 2)])
        specs = [ParamSpec("big", (8 * rng.randint(6, 9), 8 * rng.randint(5, 7)), -1)] + random_specs(rng, tp)
        layout, bucket_numel = rng.choice(["owner", "aligned", "group"]), rng.choice([None, 30, 100])
        flows = flows_for(specs, dp, tp, bucket_numel, layout)
        world = dp * tp
        for bucket in flows[0].plan.buckets[0]:
            routes = [f.route(bucket) for f in flows]
            for me, r in enumerate(routes):
                for q in range(world):
                    assert r.send_counts[q] == routes[q].recv_counts[me], (case, me, q)
                    assert r.back_counts[q] == routes[q].back_recv_counts[me], (case, me, q)
                said = owner_routes.messages(r, me)
                for phase, counts in (("ns_to_owner", r.send_counts), ("ns_from_owner", r.back_counts)):
                    assert [sum(n for p, _, to, _, n in said if p == phase and to == q) for q in range(world)] == \
                        counts, (case, me, phase)
                assert not set(r.grouped) & set(r.back_recv), case
                holds = {j for j, g in r.grouped.items()
                         if any(g.counts[me][i] for i, q in enumerate(g.members) if q != me)}
                assert set(r.group_back) == holds, (case, me)
                grouped_seen += len(r.grouped)
                received = sum(b - a for item in r.owned for _, a, b, at in item.parts if at is not None) + \
                    sum(n for item in r.members for at, n, _ in item.parts if at is not None)
                assert received == sum(r.recv_counts), (case, me)
    assert grouped_seen > 0

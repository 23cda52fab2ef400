"""The closed forms of torch's own data-parallel paths (``costmodel``: DDP's all-reduce, ZeroRedundancyOptimizer's
owners and broadcasts) and of our step's ballot, on numbers worked by hand. ``tests/test_iteration_bench.py`` holds
them to what a real run counts.

    python -m pytest -q tests/test_zero_cost.py
"""
from muongrid.comm import ring_bytes
from muongrid.lab import costmodel


def test_ddp_all_reduce_prices_each_bucket_as_a_ring_all_reduce():
    # buckets of 10 and 7 fp32 elements over 3 ranks: 2 * 2 hops * ceil(10/3)=4 * 4 B + 2 * 2 * ceil(7/3)=3 * 4 B
    assert costmodel.ddp_all_reduce_bytes([10, 7], 3) == 64 + 48
    assert costmodel.ddp_all_reduce_bytes([10, 7], 3) == sum(ring_bytes("all_reduce", 3, -(-b // 3), 4)
                                                             for b in (10, 7))
    assert costmodel.ddp_all_reduce_bytes([10, 7], 1) == 0


def test_zero_partition_is_sorted_greedy_by_elements():
    # largest first, ties in the group's order; each to the first rank holding the fewest elements:
    # 9 (index 1) -> 0, 9 (index 2) -> 1, 5 (index 0) -> 0 (9 vs 9: the first), 1 (index 3) -> 1 (14 vs 9)
    assert costmodel.zero_partition([5, 9, 9, 1], 2) == [0, 0, 1, 1]
    assert costmodel.zero_partition([5, 9, 9, 1], 1) == [0, 0, 0, 0]
    # more ranks than parameters: the last ranks own nothing
    assert costmodel.zero_partition([4, 4], 3) == [0, 1]


def test_broadcasts_charge_every_rank_each_whole_tensor():
    assert costmodel.broadcast_bytes([5, 9], 2) == 14 * 4
    assert costmodel.broadcast_bytes([5, 9], 64) == 14 * 4 == ring_bytes("broadcast", 64, 14, 4)
    assert costmodel.broadcast_bytes([5, 9], 1) == 0
    assert costmodel.broadcast_bytes([8], 2, element_size=2) == 16


def test_ballot_is_one_int32_all_reduce_per_parameter_twice_with_a_check():
    # 5 parameters, checked: 10 int32 over 4 ranks: 2 * 3 hops * ceil(10/4)=3 * 4 B
    assert costmodel.ballot_bytes(5, 4) == 72 == ring_bytes("all_reduce", 4, 3, 4)
    assert costmodel.ballot_bytes(5, 4, checked=False) == 2 * 3 * 2 * 4
    assert costmodel.ballot_bytes(5, 1) == 0


def test_group_layout_mean_over_ranks_sums_grouped_matrices_at_once():
    """The mean over ranks that step_bytes gives the group layout on a DP-only grid (grouped matrices summed over all
    ranks at once, so 1,024 ranks take a second) equals the mean of every rank's own count."""
    shapes = [(256, 512), (64, 64), (96, 40), (64, 64), (33, 17)]   # one matrix holds most of the work: grouped
    groups = [dict(shapes=shapes, tp_split_dims=[-1] * len(shapes), use_muon=True)]
    for dp in (3, 4, 6):
        plan = costmodel.plans_for(groups, dp, 1, 2**12, "group", first_only=True)[0]
        assert any(plan.group_of(m) for m in plan.metas[0]), "no matrix was grouped: the test tests nothing"
        every = [costmodel.step_bytes(groups, dp, 1, 2**12, layout="group", rank=r) for r in range(dp)]
        mean = costmodel.step_bytes(groups, dp, 1, 2**12, layout="group")
        for phase in (*costmodel.PHASES, "total"):
            assert abs(mean[phase] - sum(e[phase] for e in every) / dp) < 1e-6, (dp, phase)

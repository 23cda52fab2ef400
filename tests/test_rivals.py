"""The other implementations' traffic formulas (``muongrid.lab.rivals``), checked against cases small
enough to count by hand, transfer by transfer, and against our own closed form where both describe the
same collectives. Pure arithmetic: no process, no tensor (well under a second).

    PYTHONPATH=scripts python -m pytest -q tests/test_rivals.py
"""
from __future__ import annotations

import itertools

import pytest

from muongrid.lab import costmodel, rivals


def count_dmuon_hsdp(sizes: list[int], owners: list[tuple[int, int]], n: int, r: int, mode: str) -> float:
    """DMuon's HSDP traffic counted transfer by transfer, as its architecture page describes it, then
    averaged over the n x r ranks. In each of the r replica rows the shard group of n ranks moves a
    matrix with pipelined broadcasts and reduces: n - 1 ranks forward it once (twice broadcast under
    "z3"). Across replicas only the owner's shard column (r ranks) reduces and broadcasts it: r - 1
    transfers each."""
    shard_transfers = {"z2": 2, "z3": 3}[mode]
    total = 0
    for size, (shard, _replica) in zip(sizes, owners):
        for _row in range(r):
            total += shard_transfers * (n - 1) * size
        column = [(shard, row) for row in range(r)]      # the ranks of the owner's shard column
        total += 2 * (len(column) - 1) * size
    return total / (n * r)


def test_dmuon_one_dimension_by_hand():
    # 4 ranks, 1000 elements: a reduce to the owner and a broadcast from it move 3 x 1000 each in all.
    assert rivals.dmuon(1000, 4, "ddp") == dict(reduce_to_owner=750.0, broadcast_from_owner=750.0, total=1500.0)
    assert rivals.dmuon(1000, 4, "z2")["total"] == 1500.0
    z3 = rivals.dmuon(1000, 4, "z3")
    assert z3["backward_rebroadcast"] == 750.0 and z3["total"] == 2250.0
    assert rivals.dmuon(1000, 1, "z3")["total"] == 0.0          # one rank sends nothing


@pytest.mark.parametrize("n,r,mode", [(2, 2, "z2"), (4, 2, "z3"), (3, 4, "z2")])
def test_dmuon_hsdp_mean_equals_counting_every_transfer(n, r, mode):
    sizes = [10, 70, 30, 50, 20, 40]
    owners = list(itertools.islice(itertools.cycle(itertools.product(range(n), range(r))), len(sizes)))
    counted = count_dmuon_hsdp(sizes, owners, n, r, mode)
    assert rivals.dmuon(sum(sizes), n, mode, replicate=r)["total"] == pytest.approx(counted, rel=1e-12)


def test_dmuon_hsdp_as_documented_counts_every_matrix_on_every_rank():
    # 2 x 2 ranks, 1000 elements: the page writes (R - 1) / R * P per replicate phase, 500 each; a rank
    # on average takes part in half the matrices' column phases, 250 each.
    documented = rivals.dmuon(1000, 2, "z2", replicate=2, as_documented=True)
    derived = rivals.dmuon(1000, 2, "z2", replicate=2)
    assert documented["replicate_reduce"] == 500.0 and derived["replicate_reduce"] == 250.0
    # Averaged over all ranks, HSDP moves what one flat reduce and broadcast over n x R ranks move.
    assert derived["total"] == rivals.dmuon(1000, 4, "ddp")["total"] == 1500.0


def test_dmuon_refuses_what_it_does_not_do():
    with pytest.raises(ValueError, match="mode"):
        rivals.dmuon(10, 2, "z1")
    with pytest.raises(ValueError, match="HSDP"):
        rivals.dmuon(10, 2, "ddp", replicate=2)


def test_fsdp2_and_the_naive_muon_on_top():
    # 4 ranks, 800 elements: each ring gather or reduce-scatter has a rank send 3 of 4 shards of 200.
    assert rivals.fsdp2(800, 4) == dict(forward_all_gather=600.0, backward_all_gather=600.0,
                                        backward_reduce_scatter=600.0)
    assert "backward_all_gather" not in rivals.fsdp2(800, 4, reshard=False)
    assert rivals.naive_fsdp2_muon(800, 4)["total"] == 2400.0
    assert rivals.naive_fsdp2_muon(800, 4, reshard=False)["total"] == 1800.0


def test_row_shards_to_one_owner_by_hand():
    # An 8 x 3 matrix on 4 ranks: each holds 2 rows (6 elements); 3 ranks send theirs to the owner and
    # get them back: 18 each way in all, 4.5 per rank on average.
    assert rivals.row_shard_owner_all_to_all([(8, 3)], 4) == dict(to_owner=4.5, from_owner=4.5, total=9.0)
    with pytest.raises(ValueError, match="divide"):
        rivals.row_shard_owner_all_to_all([(6, 3)], 4)


def test_chunk_rows_is_torch_chunk():
    assert rivals.chunk_rows(6, 4) == [2, 2, 2, 0]
    assert rivals.chunk_rows(18, 8) == [3, 3, 3, 3, 3, 3, 0, 0]
    assert rivals.chunk_rows(8, 4) == [2, 2, 2, 2]


def test_dion_megabatch_by_hand():
    # Three 8 x 3 matrices on 4 ranks: padded with one zero matrix to 4, one per rank. Each rank sends
    # its 2-row block (6 elements) of the 3 matrices it does not get: 18 each way, 36 in all. Real
    # blocks: the ranks sending the zero matrix (ranks 0, 1 and 2, to rank 3) send 6 zeros each; so
    # 18 zeros each way over the 4 ranks, 4.5 per rank, 9 both ways.
    got = rivals.dion_megabatch([(8, 3)] * 3, 4)
    assert got == dict(to_owner=18.0, from_owner=18.0, total=36.0, padding=9.0)
    # A 6 x 3 matrix on 4 ranks: blocks padded to 2 rows; rank 3 holds no row. It goes to rank 0;
    # ranks 1, 2 (6 real each) and 3 (6 zeros) send: 18 sent, 12 real. The three zero matrices (to
    # ranks 1, 2, 3) are sent by the other 3 ranks each: 54 zeros. Per rank: (18 + 54) / 4 = 18 each
    # way, of which (6 + 54) / 4 = 15 zeros.
    got = rivals.dion_megabatch([(6, 3)], 4)
    assert got["to_owner"] == 18.0 and got["padding"] == 30.0
    # Counts that divide and rows that divide: no padding, the same as one owner per matrix.
    even = rivals.dion_megabatch([(8, 3)] * 4, 4)
    assert even["padding"] == 0 and even["total"] == rivals.row_shard_owner_all_to_all([(8, 3)] * 4, 4)["total"]


def test_dmuon_with_tensor_parallelism_by_hand():
    # 2 DP x 2 TP ranks, one 1000-element matrix split in two halves over TP. Each TP column's DP group
    # broadcasts and reduces its half (500 each: 1000 per column, 2000 in all); the two DP owners
    # gather the halves to one of them and scatter back (500 each way). 3000 over 4 ranks: 750.
    got = rivals.dmuon_tp(1000, 2, 2, "z2")
    assert got["tp_gather"] == got["tp_scatter"] == 125.0
    assert got["total"] == 750.0


def test_megatron_tensor_parallel_modes_by_hand():
    # A 4 x 6 matrix split by rows over 2 TP ranks, 2 DP ranks. Over DP each TP rank's 12 elements are
    # reduce-scattered and all-gathered: 6 each per rank. "duplicated": the owner's 2 TP ranks send
    # their 12 to each other: 24 over 4 ranks, 6. "distributed": the 6 x 6 Gram (the unsplit side) is
    # all-reduced 5 times and the squared norm once; a ring all-reduce over 2 ranks has each send half
    # of it twice: 2 x 0.5 x (5 x 36 + 1) = 181 per member, 362 over 4 ranks: 90.5.
    dup = rivals.megatron_tp([(4, 6)], 2, 2, [0], "duplicated")
    assert dup == dict(grad_reduce_scatter=6.0, param_all_gather=6.0, tp_all_gather=6.0, total=18.0)
    dist = rivals.megatron_tp([(4, 6)], 2, 2, [0], "distributed")
    assert dist["tp_gram_all_reduce"] == 90.5
    assert rivals.megatron_tp([(4, 6)], 2, 2, [1], "distributed")["tp_gram_all_reduce"] == 2 * 0.5 * (5 * 16 + 1) / 2
    with pytest.raises(ValueError, match="split dim"):
        rivals.megatron_tp([(4, 6)], 2, 2, [-1])


@pytest.mark.parametrize("dp", [2, 3, 4])
@pytest.mark.parametrize("layout", ["owner", "aligned"])
def test_dmuon_formula_is_zero1_reduce_scatter_and_all_gather_on_the_padded_buffer(dp, layout):
    """Reduce-to-owner plus broadcast (DMuon) and reduce-scatter plus all-gather (ZeRO-1) move the same
    (n - 1) / n of the elements each way; ZeRO-1's shards carry padding (the plan's), DMuon's do not."""
    groups = [dict(shapes=[(100, 100), (124, 324), (456, 124)], tp_split_dims=[-1] * 3, use_muon=True)]
    plan = costmodel.plans_for(groups, dp, 1, None, layout)[0]
    padded = dp * sum(b.shard_numel for buffer in plan.buckets for b in buffer)
    ours = costmodel.step_bytes(groups, dp, 1, None, layout=layout)
    elements = (ours["grad_reduce_scatter"] / costmodel.GRAD_BYTES + ours["param_all_gather"] / costmodel.PARAM_BYTES)
    assert elements == pytest.approx(rivals.dmuon(padded, dp, "ddp")["total"], rel=1e-12)
    assert padded >= sum(r * c for r, c in groups[0]["shapes"])

"""Orthogonalising each shard (``muongrid.lab.shard_ortho``, chapter 11): one shard is Muon bit for bit, more
shards give another update, and the optimizer that trains with the shortcut refuses a cut it cannot make.

    python -m pytest -q tests/test_shard_ortho.py
"""
from __future__ import annotations

import pytest
import torch

from muongrid.lab.shard_ortho import ShardMuonW, blocks, muon_direction, relative_difference, shard_direction
from muongrid.newton_schulz import zeropower_ns5
from muongrid.optim import MuonW
from muongrid.updates import adjust_lr


def skewed(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """A matrix with one dominant direction over noise, as a gradient's momentum has (chapter 1)."""
    gen = torch.Generator().manual_seed(seed)
    u, v = torch.randn(rows, 1, generator=gen), torch.randn(1, cols, generator=gen)
    return 10 * u @ v + torch.randn(rows, cols, generator=gen)


@pytest.mark.parametrize("dim", [0, 1])
def test_one_shard_is_muon_bit_for_bit_and_more_shards_give_another_update(dim):
    """Exact for one shard (the same Newton-Schulz on the same numbers). For 2, 4 and 8 blocks (uneven ones
    included: 100 rows and 60 columns into 8) the update differs by far more than rounding: at least ten
    times what Newton-Schulz in fp32 instead of bf16 changes. (The difference need not grow with the count:
    a block that turns from tall to wide changes which side Newton-Schulz works on; chapter 11 plots it.)"""
    m = skewed(100, 60)
    whole = zeropower_ns5(m).float() * adjust_lr(1.0, (100, 60))
    assert torch.equal(shard_direction(m, 1, dim), whole)
    assert torch.equal(muon_direction(m), whole)
    rounding = float((muon_direction(m, dtype=torch.float32) - whole).norm() / whole.norm())
    diffs = [relative_difference(m, n, dim) for n in (1, 2, 4, 8)]
    assert diffs[0] == 0.0
    assert 0 < rounding and all(d > 10 * rounding for d in diffs[1:]), (rounding, diffs)
    # each block of the shortcut is a Newton-Schulz result of its own: the blocks are cut as torch.chunk cuts
    n8 = shard_direction(m, 8, dim)
    for got, block in zip(blocks(n8, 8, dim), blocks(m, 8, dim)):
        assert torch.equal(got, muon_direction(block))


def test_shard_muon_trains_as_muon_with_one_shard_and_otherwise_not():
    """ShardMuonW with one shard is MuonW bit for bit over three steps (momentum, decay, the AdamW group
    alike); with four row blocks the Muon matrix ends elsewhere and the AdamW parameter does not."""
    gen = torch.Generator().manual_seed(1)
    start = [torch.randn(48, 32, generator=gen), torch.randn(32, generator=gen)]
    grads = [[torch.randn(t.shape, generator=gen) for t in start]
             for _ in range(3)]

    def trained(make):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        opt = make([dict(params=[params[0]], use_muon=True), dict(params=[params[1]], use_muon=False)])
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
        return [p.detach() for p in params]

    hyper = dict(lr=0.02, weight_decay=0.1)
    muon = trained(lambda groups: MuonW(groups, **hyper))
    one = trained(lambda groups: ShardMuonW(groups, shards=1, **hyper))
    four = trained(lambda groups: ShardMuonW(groups, shards=4, dim=0, **hyper))
    assert all(torch.equal(a, b) for a, b in zip(muon, one))
    assert not torch.equal(four[0], muon[0]) and torch.equal(four[1], muon[1])


def test_a_cut_the_matrix_cannot_take_is_refused_before_any_step():
    p = torch.nn.Parameter(torch.zeros(6, 4))
    with pytest.raises(ValueError, match="cannot cut 4 columns into 5 shards"):
        ShardMuonW([p], shards=5, dim=1)
    with pytest.raises(ValueError, match="dim 0 \\(rows\\) or 1 \\(columns\\)"):
        relative_difference(torch.zeros(6, 4), 2, dim=2)

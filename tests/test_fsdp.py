"""FSDPMuon (muongrid/fsdp.py) on fully_shard models, against one process and against torch.optim.Muon.

Six launches of tests/fsdp_run.py (cached, shared by the tests), each a tiny GPT (width 40, one block,
vocabulary 41) with *every* matrix in Muon (embeddings and head too, which are replicated over TP) and
the vectors in AdamW, 3 steps with seeded whole gradients given to every optimizer, under a warm-up
scheduler whose lr differs at every step:

* 2x1, 4x1 and 2x2 (TP on "tp", then fully_shard on "dp": strided row blocks) run from step 1;
  2x1 and 2x2 save a checkpoint at step 2 with ``muongrid.checkpoint.save(opt, ..., scheduler=sched)``;
* 3x1 (uneven rows: 41, 160 and 40 rows over 3), 1x1 and 2x2 *load* those checkpoints with
  ``checkpoint.load`` (2x2 -> 3x1, 2x1 -> 1x1, 2x1 -> 2x2: another number of ranks, 2-D into 1-D and
  1-D into 2-D), scheduler included, and continue to step 4. The reference ran uninterrupted, so a lost
  scheduler (step 3 at 0.25 x lr where 0.75 x lr was due) fails the bit-for-bit test.

**Against single-device muongrid.MuonW: bit for bit (tolerance 0).** Momentum, decay and AdamW are
elementwise, and Newton-Schulz runs once on the same whole matrix (assembled from the blocks at their
global offsets) with the same function, so the same numbers go through the same kernels.

**Against torch.optim.Muon on the same FSDP2 model: ||ours - torch|| <= 6% of ||ours - initial||, per
matrix.** On one whole matrix torch's Newton-Schulz and ours give the same bits (checked by hand on a
160 x 40 matrix). On FSDP2 DTensors torch's runs sharded: DTensor splits its bf16 matmuls and norms
across ranks, sums partial results with all-reduces and gathers, so the sums happen in another order;
bf16 keeps 8 bits, and five iterations of a degree-5 polynomial carry such last-bit differences
through. Measured on this model after 3 steps: 0% to 2.7% of how far a matrix moved (2x1 and 2x2).
A wrong orthogonalisation lands far outside: Newton-Schulz on each local block alone (a mutation
tried once by hand on 2x1) is 22% to 43% off, over 3.5 times the tolerance. The AdamW vectors agree
with torch.optim.AdamW exactly.

**Sharded by someone else** (one more launch, tests/fsdp_mesh_run.py, 3 ranks: uneven rows): ``fully_shard`` on
torch's default mesh (1-D, unnamed) with the grid from ``Grid.from_mesh``, and Accelerate's order (the
optimizer built on the plain model, then accelerate's own FSDP2 ``prepare`` swaps in the sharded parameters),
each against MuonW bit for bit, as above; and first, accelerate left to itself on a CPU (DDP), refused by name.
"""
from __future__ import annotations

import copy
import functools
import shutil
import sys

import pytest
import torch
import torch.distributed as dist

from conftest import BUILD, ROOT, last_json, run

CKPT = BUILD / "test_fsdp"
TORCH_TOL = 0.06


@functools.lru_cache(maxsize=None)
def launch(dp: int, tp: int, *extra: str) -> dict:
    proc = run([sys.executable, str(ROOT / "tests" / "fsdp_run.py"), "--dp", str(dp), "--tp", str(tp), *extra],
               timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return last_json(proc.stdout)


def fresh(name: str) -> str:
    path = CKPT / name
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    return str(path)


@functools.lru_cache(maxsize=None)
def saved(dp: int, tp: int) -> dict:
    return launch(dp, tp, "--steps", "3", "--torch", "--save", fresh(f"{dp}x{tp}"), "--save-at", "2")


def resumed(dp: int, tp: int, source: tuple[int, int]) -> dict:
    saved(*source)
    return launch(dp, tp, "--steps", "4", "--load", str(CKPT / f"{source[0]}x{source[1]}"))


RUNS = {"2x1": lambda: saved(2, 1), "4x1": lambda: launch(4, 1, "--steps", "3", "--torch"),
        "2x2": lambda: saved(2, 2), "3x1-from-2x2": lambda: resumed(3, 1, (2, 2)),
        "1x1-from-2x1": lambda: resumed(1, 1, (2, 1)), "2x2-from-2x1": lambda: resumed(2, 2, (2, 1))}


@pytest.mark.parametrize("name", list(RUNS))
def test_same_parameters_as_one_process_bit_for_bit(name):
    r = RUNS[name]()
    assert len(r["max_diff"]) == 13 and r["n_matrices"] == 7
    assert max(r["max_diff"].values()) == 0.0, r["max_diff"]
    assert r["lrs"] == r["ref_lrs"]   # the scheduler's lr after the last step, a resumed one included
    if "from" in name:
        assert r["first_step"] == 3  # resumed after step 2, then steps 3 and 4 here


@pytest.mark.parametrize("name", ["2x1", "4x1", "2x2"])
def test_same_result_as_torch_muon_on_the_same_fsdp2_model(name):
    r = RUNS[name]()
    rel = r["rel_diff_torch"]
    matrices = [n for n in rel if n in r["names"]]
    assert len(matrices) == 7 and max(rel[n] for n in matrices) <= TORCH_TOL, rel
    assert all(v == 0.0 for n, v in rel.items() if n not in r["names"]), rel   # AdamW: torch.optim.AdamW's numbers


@pytest.mark.parametrize("name", list(RUNS))
def test_each_matrix_is_orthogonalised_once(name):
    r = RUNS[name]()
    world = r["dp"] * r["tp"]
    assert sum(r["ns_calls"]) == r["n_matrices"] and len(r["ns_calls"]) == world
    assert sorted(set(r["owners"])) == list(range(world)) if world <= r["n_matrices"] else True
    for ledger in r["ledger"]:
        phases = set(ledger["phases"])
        assert phases <= {"ns_to_owner", "ns_from_owner"}   # nothing else moves: FSDP2 did the rest
        assert ledger["bytes_sent"] == sum(p["bytes_sent"] for p in ledger["phases"].values())
    if world > 1:
        assert all(ledger["phases"]["ns_to_owner"]["dtype"] == "bfloat16" for ledger in r["ledger"])
    # uneven rows: the 41-row head is cut 14/14/13 over three ranks
    if name.startswith("3x1"):
        head = r["names"].index("head.weight")
        assert [row[head][0] for row in r["pieces"]] == [14, 14, 13]


def test_ledger_bytes_are_the_blocks_that_leave_their_rank():
    """2x1: every block of a matrix owned by the other rank goes there in bf16, and comes back."""
    r = saved(2, 1)
    for rank, ledger in enumerate(r["ledger"]):
        away = sum(row[0] * row[1] for m, row in enumerate(r["pieces"][rank]) if r["owners"][m] != rank)
        assert ledger["phases"]["ns_to_owner"]["bytes_sent"] == 2 * away
        assert ledger["phases"]["ns_from_owner"]["bytes_recv"] == 2 * away


# ---- the routing, pure ---------------------------------------------------------------------------

def test_routes_send_a_tp_replicated_block_once():
    from muongrid.fsdp_routes import Piece, routes
    # a 4 x 6 matrix replicated over tp=2, rows split over dp=2: ranks 0,1 hold rows 0-1, ranks 2,3 rows 2-3
    top, bottom = Piece((0, 0), (2, 6)), Piece((2, 0), (2, 6))
    r = routes([(4, 6)], [[top], [top], [bottom], [bottom]], tp=2)
    owner = r.owners[0]
    assert r.senders[0] == {owner % 2, 2 + owner % 2}
    assert sum(sum(r.send_counts(q)) for q in range(4)) == 24          # each element sent once
    assert r.back_counts(owner) == [12, 12, 12, 12]                    # and every rank gets its block back


def test_routes_refuse_pieces_that_do_not_cover_the_matrix():
    from muongrid.fsdp_routes import Piece, routes
    with pytest.raises(ValueError, match="cover 8 elements, not 12"):
        routes([(3, 4)], [[Piece((0, 0), (1, 4))], [Piece((1, 0), (1, 4))]], tp=1)


def test_owners_balance_newton_schulz_work():
    from muongrid.fsdp_routes import Piece, routes
    shapes = [(8, 8)] * 4
    pieces = [[Piece((0, 0), (4, 8))] * 4, [Piece((4, 0), (4, 8))] * 4]
    assert sorted(routes(shapes, pieces, tp=1).owners) == [0, 0, 1, 1]


# ---- clear errors, in one process ------------------------------------------------------------------

@pytest.fixture(scope="module")
def grid():
    from muongrid import Grid
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield Grid.build(1, 1)
    finally:
        dist.destroy_process_group()


def test_bad_input_is_refused_by_name(grid):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor, Shard
    from muongrid.fsdp import FSDPMuon
    plain = torch.nn.Linear(4, 6, bias=False)
    opt = FSDPMuon([dict(params=[plain.weight], names=["w"])], grid)   # Accelerate's order: planned at step 1
    plain.weight.grad = torch.ones(6, 4)
    with pytest.raises(ValueError, match=r"'w' is a plain tensor, not an FSDP2 parameter: call fully_shard\(model\) "
                                         r"before the first step.*Accelerate's prepare"):
        opt.step()
    other = init_device_mesh("cpu", (1,), mesh_dim_names=("x",))
    w = torch.nn.Parameter(distribute_tensor(torch.randn(6, 4), other, [Shard(0)]))
    with pytest.raises(ValueError, match=r"'v' is a plain tensor"):   # some sharded, some not: refused when built
        FSDPMuon([dict(params=[w, plain.weight], names=["w", "v"])], grid)
    FSDPMuon([dict(params=[w], names=["w"])], grid)   # a 1-D mesh of any name whose ranks are the DP group
    two_d = init_device_mesh("cpu", (1, 1), mesh_dim_names=("x", "y"))
    w2 = torch.nn.Parameter(distribute_tensor(torch.randn(6, 4), two_d, [Shard(0), Shard(0)]))
    with pytest.raises(ValueError, match=r"'w' is a DTensor on a mesh with dimensions \('x', 'y'\); FSDPMuon reads "
                                         r"FSDP2 parameters sharded on a 1-D mesh \(any name\)"):
        FSDPMuon([dict(params=[w2], names=["w"])], grid)
    tp_only = torch.nn.Parameter(distribute_tensor(torch.randn(6, 4), grid.mesh["tp"], [Shard(0)]))
    with pytest.raises(ValueError, match=r"dimensions \('tp',\)"):
        FSDPMuon([dict(params=[tp_only], names=["w"])], grid)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 3))
    fully_shard(model, mesh=grid.mesh["dp"])
    with pytest.raises(ValueError, match=r"'0.bias' has shape \(6,\) but Muon orthogonalises 2-D"):
        FSDPMuon([dict(params=list(model.parameters()), names=[n for n, _ in model.named_parameters()])], grid)
    opt = FSDPMuon([dict(params=[model[0].weight], names=["0.weight"]),
                    dict(params=[model[0].bias], names=["0.bias"], use_muon=False)], grid)
    model[0].bias.grad = torch.zeros_like(model[0].bias)
    before = model[0].weight.detach().to_local().clone()
    opt.step()  # no gradient anywhere: skipped, as torch skips it (tests/test_contract.py has the rest)
    assert torch.equal(model[0].weight.detach().to_local(), before)
    model[0].weight.grad = torch.zeros(6, 4)
    with pytest.raises(ValueError, match=r"'0.weight': gradient a plain tensor"):
        opt.step()


def test_a_torch_optimizer_with_a_scheduler_and_a_state_dict_round_trip(grid):
    from torch.distributed.fsdp import fully_shard
    from muongrid import MuonW
    from muongrid.fsdp import FSDPMuon

    def build():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
        return m

    ref, model = build(), build()
    fully_shard(model, mesh=grid.mesh["dp"])

    def groups(m):
        return [dict(params=[m[0].weight, m[1].weight], use_muon=True),
                dict(params=[m[0].bias, m[1].bias], use_muon=False)]
    opt, ref_opt = FSDPMuon(groups(model), grid, lr=0.05), MuonW(groups(ref), lr=0.05)
    sched = [torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5) for o in (opt, ref_opt)]
    x = torch.randn(4, 5)
    for step in range(3):
        for m, o, s in ((model, opt, sched[0]), (ref, ref_opt, sched[1])):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
            s.step()
        if step == 0:  # round trip through state_dict into a fresh optimizer, then carry on with it
            sd = opt.state_dict()
            opt = FSDPMuon(groups(model), grid, lr=0.05)
            opt.load_state_dict(sd)
            state = sched[0].state_dict()
            sched[0] = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
            sched[0].load_state_dict(state)
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"] == 0.05 * 0.5**3
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.full_tensor(), q.detach())


def small_fsdp(grid, seed=0, out=3):
    """A fully_shard model of two layers (Muon weights, AdamW biases), its FSDPMuon and a warm-up scheduler."""
    from torch.distributed.fsdp import fully_shard
    from muongrid.fsdp import FSDPMuon
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, out))
    fully_shard(model, mesh=grid.mesh["dp"])
    named = list(model.named_parameters())
    opt = FSDPMuon([dict(params=[p for _, p in named if p.ndim == 2], names=[n for n, p in named if p.ndim == 2]),
                    dict(params=[p for _, p in named if p.ndim == 1], names=[n for n, p in named if p.ndim == 1],
                         use_muon=False)], grid, lr=0.05)
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))


def train(model, opt, sched, steps):
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    for _ in steps:
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()
        sched.step()
    return [p.detach().to_local().clone() for p in model.parameters()]


def test_accelerates_order_plans_at_the_first_step_and_keeps_a_state_loaded_before_it(grid):
    """Built on plain parameters, which fully_shard then replaces and the optimizer's groups are given (what
    Accelerate's prepare does): no plan and no state until the parameters are sharded; a state_dict loaded into
    it before its first step (Accelerate's load_state after prepare) is kept, and it then steps as the
    optimizer it came from."""
    from torch.distributed.fsdp import fully_shard
    from muongrid.fsdp import FSDPMuon
    model, opt, sched = small_fsdp(grid)
    train(model, opt, sched, [1, 2])
    torch.manual_seed(5)
    late = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    named = list(late.named_parameters())
    late_opt = FSDPMuon([dict(params=[p for _, p in named if p.ndim == 2], names=[n for n, p in named if p.ndim == 2]),
                         dict(params=[p for _, p in named if p.ndim == 1], names=[n for n, p in named if p.ndim == 1],
                              use_muon=False)], grid, lr=0.05)
    late_sched = torch.optim.lr_scheduler.LambdaLR(late_opt, lambda s: min(1.0, (s + 1) / 4))
    assert late_opt.routes is None and not late_opt.state and late_opt.state_dict()["state"] == {}
    fully_shard(late)
    swap = {id(p): q for (_, p), (_, q) in zip(named, late.named_parameters())}
    for group in late_opt.param_groups:
        group["params"] = [swap[id(p)] for p in group["params"]]
    assert len(late_opt.state_dict()["state"]) == 4 and late_opt.routes is None   # zeros, placed like FSDP2's
    with torch.no_grad():
        for mine, theirs in zip(late.parameters(), model.parameters()):
            mine.to_local().copy_(theirs.to_local())
    late_opt.load_state_dict(copy.deepcopy(opt.state_dict()))   # torch's load keeps the tensors it is given
    late_sched.load_state_dict(sched.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(train(model, opt, sched, [3, 4]),
                                                 train(late, late_opt, late_sched, [3, 4])))


def test_grid_from_mesh_takes_a_1d_mesh_over_the_job(grid):
    from torch.distributed.device_mesh import init_device_mesh
    from muongrid import Grid
    g = Grid.from_mesh(init_device_mesh("cpu", (1,)))
    assert (g.dp, g.tp, g.rank, g.dp_rank, g.device) == (1, 1, 0, 0, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"takes a 1-D mesh over every rank of the job in order \(0..0\); this one "
                                         r"is 2-D \('dp', 'tp'\).*use Grid.build\(dp, tp\)"):
        Grid.from_mesh(grid.mesh)


@functools.lru_cache(maxsize=None)
def sharded_elsewhere() -> dict:
    proc = run([sys.executable, str(ROOT / "tests" / "fsdp_mesh_run.py"), "--dp", "3", "--steps", "3"], timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return last_json(proc.stdout)


@pytest.mark.parametrize("case", ["unnamed", "accelerate"])
def test_a_model_sharded_by_someone_else_steps_as_one_process(case):
    """3 ranks (41 rows cut 14/14/13): bit for bit with MuonW, as the runs above (the same kernels on the same
    numbers); each matrix orthogonalised once; the state on every parameter, placed as FSDP2 placed it."""
    r = sharded_elsewhere()
    c = r[case]
    assert r["max_diff"][case] == 0.0 and c["lrs"] == r["ref_lrs"]
    assert c["mesh_names"] is None and c["mesh_ranks"] == [0, 1, 2]   # torch's default mesh: 1-D, unnamed
    assert sum(r["ns_calls"][case]) == len(c["owners"]) == 7
    assert c["state_entries"] == c["params"] == 13
    if case == "accelerate":
        assert not c["planned_at_build"] and not c["planned_before_step"] and c["wrapper"] == "AcceleratedOptimizer"
        # on a CPU accelerate's FSDP2 plugin gives DDP (why the run then sets FSDP2 by hand): refused by name
        assert c["accelerate_type_on_cpu"] == "DistributedType.MULTI_CPU" and c["cpu_wraps_in"] == "DistributedDataParallel"
        assert "wrapped in DistributedDataParallel, not sharded by FSDP2" in c["cpu_refusal"]


def test_checkpoint_save_and_load_take_an_fsdpmuon_with_its_scheduler(grid, tmp_path):
    """``muongrid.checkpoint`` with an FSDPMuon (the README's call raised AttributeError before): saved after
    step 2, loaded into a fresh model, optimizer and scheduler, steps 3 and 4 equal the uninterrupted run's."""
    from muongrid import checkpoint
    model, opt, sched = small_fsdp(grid)
    train(model, opt, sched, [1, 2])
    checkpoint.save(opt, tmp_path / "ck", step=2, scheduler=sched)
    uninterrupted = train(model, opt, sched, [3, 4])
    model2, opt2, sched2 = small_fsdp(grid, seed=5)
    assert checkpoint.load(opt2, tmp_path / "ck", scheduler=sched2) == 2
    assert sched2.last_epoch == 2 and [g["lr"] for g in opt2.param_groups] == [0.05 * 0.75] * 2
    resumed = train(model2, opt2, sched2, [3, 4])
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted, resumed))
    assert opt2.steps_taken == opt.steps_taken == 4
    # without the scheduler the lr would restart its warm-up: load warns, so it is not silent
    model3, opt3, sched3 = small_fsdp(grid, seed=5)
    with pytest.warns(UserWarning, match="holds a LambdaLR's state but load.. was given no scheduler"):
        checkpoint.load(opt3, tmp_path / "ck")


def test_an_fsdp_checkpoint_that_does_not_fit_is_refused_by_name_and_changes_nothing(grid, tmp_path):
    import json
    from muongrid import DistributedMuon, checkpoint
    model, opt, sched = small_fsdp(grid)
    train(model, opt, sched, [1])
    checkpoint.save(opt, tmp_path / "ck", step=1, scheduler=sched)
    other, other_opt, other_sched = small_fsdp(grid, seed=5, out=4)
    before = [p.detach().to_local().clone() for p in other.parameters()]
    with pytest.raises(checkpoint.CheckpointError, match=r"1.weight: shape \[3, 7\] in the checkpoint, \[4, 7\] here"):
        checkpoint.load(other_opt, tmp_path / "ck", scheduler=other_sched)
    # a marker that lies about a shape gets past that check; DCP's own refusal comes back as ours, by name
    marker = json.loads((tmp_path / "ck" / "muongrid.json").read_text())
    marker["params"]["1.weight"]["shape"], marker["params"]["1.bias"]["shape"] = [4, 7], [4]
    (tmp_path / "ck" / "muongrid.json").write_text(json.dumps(marker))
    with pytest.raises(checkpoint.CheckpointError, match=r"parameter '1\.(weight|bias)' \(its \w+\) is stored as "
                                                         r"torch.Size\(\[3.*\]\) there, torch.Size\(\[4.*\]\) here; "
                                                         "nothing was changed"):
        checkpoint.load(other_opt, tmp_path / "ck", scheduler=other_sched)
    assert all(torch.equal(a, b.detach().to_local()) for a, b in zip(before, other.parameters()))
    assert other_sched.last_epoch == 0
    # an FSDP checkpoint into a ZeRO-1 optimizer: refused, saying which kind saved it
    plain = torch.nn.Linear(7, 3)
    zero1 = DistributedMuon([dict(params=[plain.weight], names=["1.weight"])], grid)
    with pytest.raises(checkpoint.CheckpointError, match="saved by FSDPMuon .FSDP2 DTensor blocks.; "
                                                         "DistributedMuon keeps ZeRO-1 shards"):
        checkpoint.load(zero1, tmp_path / "ck")


def test_an_exported_fsdp_checkpoint_continues_in_single_device_muonw(grid, tmp_path):
    from muongrid import MuonW, checkpoint
    model, opt, sched = small_fsdp(grid)
    train(model, opt, sched, [1, 2])
    checkpoint.save(opt, tmp_path / "ck", step=2)
    checkpoint.export(tmp_path / "ck", tmp_path / "ck.pt")
    torch.manual_seed(9)
    ref = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    named = list(ref.named_parameters())
    single = MuonW([dict(params=[p for _, p in named if p.ndim == 2], names=[n for n, p in named if p.ndim == 2]),
                    dict(params=[p for _, p in named if p.ndim == 1], names=[n for n, p in named if p.ndim == 1],
                         use_muon=False)], lr=0.05)
    assert checkpoint.load_single(single, torch.load(tmp_path / "ck.pt", weights_only=True)) == 2
    for g, ours in zip(single.param_groups, opt.param_groups):
        g["lr"] = ours["lr"]   # the lr the scheduler left (load_single restores the state, not the schedule)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    for o, m in ((opt, model), (single, ref)):
        o.zero_grad()
        m(x).pow(2).sum().backward()
        o.step()
    assert all(torch.equal(a.detach().to_local(), b.detach()) for a, b in zip(model.parameters(), ref.parameters()))


def test_checkpoint_folder_is_complete_or_refused(grid, tmp_path):
    from torch.distributed.fsdp import fully_shard
    from muongrid import checkpoint
    from muongrid.checkpoint import CheckpointError
    from muongrid.fsdp import FSDPMuon, load, save
    model = torch.nn.Sequential(torch.nn.Linear(4, 6, bias=False))
    fully_shard(model, mesh=grid.mesh["dp"])
    opt = FSDPMuon([dict(params=list(model.parameters()))], grid)
    with pytest.warns(FutureWarning, match=r"muongrid.fsdp.save\(model, opt, ...\) is deprecated .* call "
                                           r"muongrid.checkpoint.save\(opt, path"):
        save(model, opt, tmp_path / "ck", step=7)         # fsdp.save: the older entry point, checkpoint.save's
    checkpoint.save(opt, tmp_path / "ck", step=8)         # over an older one: replaced whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    with pytest.warns(FutureWarning, match=r"muongrid.fsdp.load\(model, opt, ...\) is deprecated .* "
                                           r"muongrid.checkpoint.load"):
        assert load(model, opt, tmp_path / "ck") == 8
    (tmp_path / "half").mkdir()                            # what a save killed before its rename leaves
    with pytest.raises(CheckpointError, match="has no muongrid.json: it is not a muongrid checkpoint, or its save did "
                                              "not finish"):
        checkpoint.load(opt, tmp_path / "half")

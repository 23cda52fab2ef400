"""Checkpoints (muongrid/checkpoint.py): save on one grid and layout, resume on others bit for bit; crashes
and bad checkpoints fail clearly and change nothing.

Tolerance zero: a resumed run must continue exactly as the single-device reference run uninterrupted
from step 1 does (the synthetic gradients average to the same global gradient on every grid, see
muongrid/lab/synthetic.py, so one reference serves every grid). The "group" layout, and anything resumed
from a checkpoint it wrote, is held to its own tolerance instead (``group_atol``): a matrix it orthogonalises
over several ranks is not bit-exact (tests/test_group_layout.py).
"""
from __future__ import annotations

import functools
import json
import sys

import pytest
import torch

from conftest import ODD_SHAPES, ODD_TP_DIMS, last_json, script
from muongrid import DistributedAdamW, DistributedMuon, Grid, MuonW, checkpoint
from muongrid.lab.synthetic import build_problem

PROBLEM = ["--optimizer", "hybrid", "--shapes", ODD_SHAPES, "--tp-dims", ODD_TP_DIMS, "--bucket-numel", "1500"]


@pytest.fixture(scope="module")
def saved_2x2(tmp_path_factory):
    """A checkpoint after 2 steps on a 2 x 2 grid, bucket layout."""
    path = tmp_path_factory.mktemp("ckpt") / "run"
    proc = script("verify.py", "--dp", "2", "--tp", "2", "--steps", "2", "--save", str(path), *PROBLEM)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return path


@functools.lru_cache(maxsize=None)
def group_atol(steps: int = 4) -> float:
    """The "group" layout's tolerance in the max norm verify.py reports: 1e-2 of the Frobenius norm of the
    largest update the reference makes to a matrix over ``steps`` steps. The group layout holds each grouped
    matrix within 1e-2 of its update in the Frobenius norm on every shard (tests/test_group_layout.py), so
    no element can be further off than this. Computed here, in one process, on verify.py's problem (its varied groups and schedule): 8.3e-3.
    Measured: 0.0 on every grid here (this problem's grouped matrix happens to round alike); a resume that
    forgets the momentum (a mutation tried once by hand) is 1.5e-2 off after its two steps."""
    from muongrid.lab.synthetic import parse_shapes, parse_tp_dims
    from muongrid.verify import reference_optimizer, scheduler, vary_hyperparameters
    problem = build_problem("hybrid", parse_shapes(ODD_SHAPES), parse_tp_dims(ODD_TP_DIMS))
    vary_hyperparameters(problem)   # verify.py's groups and schedule (issue 41)
    params = {n: t.clone() for n, t in problem.full.items()}
    ref = reference_optimizer(problem, params)
    sched = scheduler(ref, problem)
    for step in range(1, steps + 1):
        for n, g in problem.mean_grads(step, 1).items():
            params[n].grad = g
        ref.step()
        sched.step()
    return 1e-2 * max(float((params[n].detach() - problem.full[n]).norm()) for n in params)


def check_resumed(proc, saved_on: dict) -> dict:
    """A run resumed after step 2 for 2 steps: every layout but "group" equal to the uninterrupted reference
    bit for bit, "group" within ``group_atol`` (its grouped matrices; the rest is exact there too)."""
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["ok"] and result["resumed_from"]["step"] == 2 and result["resumed_from"]["saved_on"] == saved_on
    assert "step 3:" in proc.stdout and "step 4:" in proc.stdout and "step 1:" not in proc.stdout
    for layout, res in result["layouts"].items():
        assert len(res["per_step_max_abs_diff"]) == 2 and res["state_dict_roundtrip"]
        assert res["max_abs_diff"] <= (group_atol() if layout == "group" or saved_on["layout"] == "group" else 0.0), \
            (layout, res["per_step_max_abs_diff"])
    return result


@pytest.mark.parametrize("dp,tp,layouts", [(3, 1, "owner"), (1, 4, "aligned,owner"), (1, 1, "bucket"),
                                           (3, 2, "owner,group")])
def test_resume_on_another_grid_and_layout_continues_bit_for_bit(saved_2x2, dp, tp, layouts):
    proc = script("verify.py", "--dp", str(dp), "--tp", str(tp), "--layout", layouts, "--steps", "2",
                  "--resume", str(saved_2x2), "--atol", repr(group_atol()), *PROBLEM)
    result = check_resumed(proc, dict(dp=2, tp=2, layout="bucket"))
    if "group" in layouts:   # 3x2: the largest matrix is orthogonalised by a group
        assert result["layouts"]["group"]["groups"] and result["layouts"]["group"]["groups_agree"]


def test_saved_under_the_group_layout_resumes_under_others_on_another_grid(tmp_path):
    """Save under "group" on 2x1 (its largest matrix grouped over both ranks), resume on 1x2 under "owner" and
    "bucket" (DP shards become TP shards): the checkpoint is in global coordinates, so the layout that wrote
    it does not matter."""
    path, atol = tmp_path / "run", repr(group_atol())
    saved = script("verify.py", "--dp", "2", "--tp", "1", "--layout", "group", "--steps", "2", "--save", str(path),
                   "--atol", atol, *PROBLEM)
    assert saved.returncode == 0, saved.stdout[-2000:] + saved.stderr[-3000:]
    assert last_json(saved.stdout)["layouts"]["group"]["groups"]
    check_resumed(script("verify.py", "--dp", "1", "--tp", "2", "--layout", "owner,bucket", "--steps", "2",
                         "--resume", str(path), "--atol", atol, *PROBLEM), dict(dp=2, tp=1, layout="group"))


def test_resume_with_another_problem_is_refused_before_starting(saved_2x2):
    proc = script("verify.py", "--resume", str(saved_2x2), "--optimizer", "hybrid", "--shapes", "8x8")
    assert proc.returncode == 2 and "give the same --optimizer, --shapes" in proc.stderr


def test_a_save_that_dies_half_way_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "run"
    assert script("verify.py", "--dp", "2", "--steps", "1", "--save", str(path), *PROBLEM).returncode == 0
    # The next save dies: rank 1 exits once every rank has written its shard, before the checkpoint is complete.
    monkeypatch.setenv("MUONGRID_DIE_WHILE_SAVING", "1")
    died = script("verify.py", "--dp", "2", "--steps", "2", "--save", str(path), *PROBLEM)
    monkeypatch.delenv("MUONGRID_DIE_WHILE_SAVING")
    assert died.returncode != 0 and "rank 1 (dp 1, tp 0) failed first" in died.stderr
    assert (tmp_path / "run.partial").is_dir() and not (tmp_path / "run.partial" / "muongrid.json").exists()
    assert json.loads((path / "muongrid.json").read_text())["step"] == 1  # the previous one, untouched
    resumed = script("verify.py", "--dp", "2", "--steps", "1", "--resume", str(path), *PROBLEM)
    assert resumed.returncode == 0 and last_json(resumed.stdout)["resumed_from"]["step"] == 1
    with pytest.raises(checkpoint.CheckpointError, match="has no muongrid.json"):
        checkpoint.read_marker(tmp_path / "run.partial")


# ---- in one process: the library's own checks -------------------------------------------------------

SHAPES = [(12, 20), (16, 8), (9, 9)]


def fresh(layout="owner", cls=DistributedMuon, shapes=SHAPES):
    problem = build_problem("hybrid", shapes, [-1] * len(shapes), 2, seed=3)
    return problem, cls(problem.param_groups(), Grid.single(), layout=layout, bucket_numel=300)


def stepped(opt, problem, steps):
    for step in steps:
        grads = problem.grads(step, 0)
        for g in opt.param_groups:
            for n, p in zip(g["names"], g["params"]):
                p.grad = grads[n].clone()
        opt.step()
    return [p.detach().clone() for g in opt.param_groups for p in g["params"]]


def state_of(opt):
    return {id(p): {k: v.clone() for k, v in opt.state[p].items()} for g in opt.param_groups for p in g["params"]}


def test_export_loads_into_single_device_muonw_and_continues_bit_for_bit(tmp_path):
    problem, opt = fresh()
    stepped(opt, problem, [1, 2])
    checkpoint.save(opt, tmp_path / "ck", step=2)
    checkpoint.export(tmp_path / "ck", tmp_path / "ck.pt")
    single = MuonW(problem.param_groups())
    assert checkpoint.load_single(single, torch.load(tmp_path / "ck.pt", weights_only=True)) == 2
    assert all(torch.equal(a, b) for a, b in zip(stepped(opt, problem, [3]), stepped(single, problem, [3])))


def test_loading_a_mismatched_checkpoint_names_the_problem_and_changes_nothing(tmp_path):
    problem, opt = fresh()
    stepped(opt, problem, [1])
    checkpoint.save(opt, tmp_path / "ck", step=1)
    _, other = fresh(shapes=[(12, 20), (16, 8), (9, 10)])
    before = state_of(other)
    with pytest.raises(checkpoint.CheckpointError, match=r"layers.2.weight: shape \[9, 9\] in the checkpoint, \[9, 10\]"):
        checkpoint.load(other, tmp_path / "ck")
    _, adamw = fresh(cls=DistributedAdamW)
    with pytest.raises(checkpoint.CheckpointError, match=r"kinds \['master', 'momentum'\] in the checkpoint"):
        checkpoint.load(adamw, tmp_path / "ck")
    after = state_of(other)
    assert all(torch.equal(before[i][k], after[i][k]) for i in before for k in before[i])


def test_a_truncated_or_foreign_checkpoint_fails_before_anything_changes(tmp_path):
    problem, opt = fresh()
    stepped(opt, problem, [1])
    checkpoint.save(opt, tmp_path / "ck", step=1)
    data = next((tmp_path / "ck").glob("*.distcp"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    _, target = fresh()
    before = state_of(target)
    with pytest.raises(checkpoint.CheckpointError, match="truncated or corrupted.*nothing was changed"):
        checkpoint.load(target, tmp_path / "ck")
    after = state_of(target)
    assert all(torch.equal(before[i][k], after[i][k]) for i in before for k in before[i])
    (tmp_path / "foreign").mkdir()
    with pytest.raises(checkpoint.CheckpointError, match="not a muongrid checkpoint"):
        checkpoint.load(target, tmp_path / "foreign")
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint at"):
        checkpoint.load(target, tmp_path / "missing")


def test_export_loads_into_torch_optim_muon(tmp_path):
    """torch.optim.Muon keeps the same EMA momentum (``momentum_buffer``), so a Muon checkpoint continues
    there. Tolerance as in test_math's comparison with torch.optim.Muon: exact where the CPU has a native
    bf16 GEMM (the same kernels run), else one bf16 ulp of the update per element and step."""
    from muongrid.newton_schulz import native_bf16_matmul
    from muongrid.updates import adjust_lr

    problem = build_problem("muon", SHAPES, [-1] * len(SHAPES), 1, seed=3)
    opt = DistributedMuon(problem.param_groups(), Grid.single(), layout="owner", bucket_numel=300)
    stepped(opt, problem, [1, 2])
    checkpoint.save(opt, tmp_path / "ck", step=2)
    checkpoint.export(tmp_path / "ck", tmp_path / "ck.pt")
    g = opt.param_groups[0]
    theirs = torch.optim.Muon([dict(params=[torch.nn.Parameter(torch.zeros_like(p)) for p in g["params"]],
                                    names=g["names"])], lr=g["lr"], weight_decay=g["weight_decay"],
                              momentum=g["momentum"], nesterov=g["nesterov"], adjust_lr_fn="match_rms_adamw")
    assert checkpoint.load_single(theirs, torch.load(tmp_path / "ck.pt", weights_only=True)) == 2
    ours_after, theirs_after = stepped(opt, problem, [3]), stepped(theirs, problem, [3])
    for shape, a, b in zip(SHAPES, ours_after, theirs_after):
        atol = 0.0 if native_bf16_matmul(torch.device("cpu")) else adjust_lr(g["lr"], shape, "match_rms_adamw") * 2**-6
        assert (a - b).abs().max().item() <= atol


def test_a_dtensor_model_saves_and_loads(tmp_path):
    """parallelize_module's DTensor parameters: the checkpoint writes each rank's local TP shard."""
    from conftest import ROOT, run

    proc = run([sys.executable, str(ROOT / "tests" / "dtensor_checkpoint_run.py"), "--dp", "2", "--tp", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DTensor checkpoint round trip ok" in proc.stdout


def test_a_scheduler_saved_with_the_checkpoint_continues_its_lr_bit_for_bit(tmp_path):
    """A warm-up LambdaLR over a resume: saved after step 2 with ``scheduler=``, loaded into a fresh optimizer
    and scheduler, steps 3 and 4 take the lrs and give the parameters of the run never interrupted. Without
    ``scheduler=`` the warm-up would restart (step 3 at 0.25 x lr where 0.75 x lr is due), and load warns."""
    def warmup(opt):
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))

    def run(opt, sched, problem, steps):
        lrs = []
        for step in steps:
            lrs.append([g["lr"] for g in opt.param_groups])
            stepped(opt, problem, [step])
            sched.step()
        return lrs, [p.detach().clone() for g in opt.param_groups for p in g["params"]]

    problem, opt = fresh()
    sched = warmup(opt)
    run(opt, sched, problem, [1, 2])
    checkpoint.save(opt, tmp_path / "ck", step=2, scheduler=sched)
    lrs, params = run(opt, sched, problem, [3, 4])
    _, resumed = fresh(layout="bucket")
    resumed_sched = warmup(resumed)
    assert checkpoint.load(resumed, tmp_path / "ck", scheduler=resumed_sched) == 2
    lrs_after, params_after = run(resumed, resumed_sched, problem, [3, 4])
    base = [g["lr"] for g in fresh()[1].param_groups]
    assert lrs == lrs_after == [[lr * 0.75 for lr in base], base]
    assert all(torch.equal(a, b) for a, b in zip(params, params_after))
    _, forgot = fresh()
    with pytest.warns(UserWarning, match="holds a LambdaLR's state but load.. was given no scheduler"):
        checkpoint.load(forgot, tmp_path / "ck")


def test_scheduler_mismatches_and_unsaveable_schedulers_are_refused_before_anything_changes(tmp_path):
    problem, opt = fresh()
    stepped(opt, problem, [1])
    checkpoint.save(opt, tmp_path / "plain", step=1)
    _, target = fresh()
    with pytest.raises(checkpoint.CheckpointError, match="saved without a scheduler"):
        checkpoint.load(target, tmp_path / "plain", scheduler=torch.optim.lr_scheduler.StepLR(target, 1))
    checkpoint.save(opt, tmp_path / "step", step=1, scheduler=torch.optim.lr_scheduler.StepLR(opt, 1))
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(target, 10)
    before = state_of(target)
    with pytest.raises(checkpoint.CheckpointError, match="holds a StepLR's state, not a CosineAnnealingLR's"):
        checkpoint.load(target, tmp_path / "step", scheduler=cosine)
    after = state_of(target)
    assert all(torch.equal(before[i][k], after[i][k]) for i in before for k in before[i]) and cosine.last_epoch == 0

    class Factor:   # a callable object: LambdaLR saves its __dict__, here a tensor JSON cannot hold
        def __init__(self):
            self.scale = torch.tensor(0.5)

        def __call__(self, step):
            return float(self.scale)

    with pytest.raises(checkpoint.CheckpointError, match="LambdaLR's state_dict.. cannot be written as JSON.*nothing "
                                                         "was saved"):
        checkpoint.save(opt, tmp_path / "lambda", step=1, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, Factor()))
    assert not (tmp_path / "lambda").exists() and not (tmp_path / "lambda.partial").exists()


def test_what_dcp_refuses_comes_back_as_our_error_naming_the_parameter(tmp_path):
    """The marker is checked first (test above); a marker that does not tell the truth gets past it, and DCP's
    ``CheckpointException`` (a BaseException) then becomes a ``CheckpointError`` naming the parameter."""
    problem, opt = fresh()
    stepped(opt, problem, [1])
    checkpoint.save(opt, tmp_path / "ck", step=1)
    marker_file = tmp_path / "ck" / "muongrid.json"
    saved = marker_file.read_text()
    for shapes, pattern in [
            ([(12, 20), (16, 8), (9, 10)], r"parameter 'layers.2.weight' \(its \w+\) is stored as "
                                           r"torch.Size\(\[9, 9\]\) there, torch.Size\(\[9, 10\]\) here; "
                                           "nothing was changed"),
            (SHAPES + [(5, 6)], r"parameter 'layers.3.\w+' \(its \w+\) is not in it; nothing was changed")]:
        _, other = fresh(shapes=shapes)
        lie = json.loads(saved)
        told = checkpoint.describe(other, 1)
        lie["params"] = told["params"]
        for theirs, ours in zip(lie["param_groups"], told["param_groups"]):
            theirs["names"] = ours["names"]
        marker_file.write_text(json.dumps(lie))
        before = state_of(other)
        with pytest.raises(checkpoint.CheckpointError, match=pattern):
            checkpoint.load(other, tmp_path / "ck")
        after = state_of(other)
        assert all(torch.equal(before[i][k], after[i][k]) for i in before for k in before[i])


def test_other_groups_and_other_optimizers_are_refused_by_name(tmp_path):
    problem, opt = fresh()
    stepped(opt, problem, [1])
    checkpoint.save(opt, tmp_path / "ck", step=1)
    groups = problem.param_groups()
    muon = next(g for g in groups if g["use_muon"])
    split = [dict(g, params=g["params"][i:i + 1], names=g["names"][i:i + 1], tp_split_dims=[-1])
             for g in groups if g is muon for i in range(len(g["params"]))] + [g for g in groups if g is not muon]
    regrouped = DistributedMuon(split, Grid.single(), layout="owner", bucket_numel=300)
    with pytest.raises(checkpoint.CheckpointError, match="groups its parameters otherwise"):
        checkpoint.load(regrouped, tmp_path / "ck")
    with pytest.raises(TypeError, match="DistributedMuon, DistributedAdamW or FSDPMuon, not a MuonW.*load_single"):
        checkpoint.save(MuonW(problem.param_groups()), tmp_path / "single", step=1)

"""The GPU path without a GPU: every optimizer path and entry point's worker on the ``meta`` device.

Each case runs a script's ``worker`` for every rank of a grid in this one process, over torch's ``fake``
process group, with the grid's device set to ``meta`` (``muongrid/lab/devicecheck.py``). It fails on a
tensor that is off the grid's device at a collective (NCCL would raise), on an op that mixes devices (a
CPU batch fed to a device model, say), and on any host sync inside one optimizer step (the
engine's budget: every ``.item()``/``bool(t)`` on a GPU stalls the CPU until the device catches up).
Grids: 2x2 and 3x2; FSDP also on 3x2 with one layer (4 Muon matrices for 6 ranks: some own none).

What this cannot see: NCCL itself, streams, real timings; those need scripts/gpu_smoke.sh on a GPU.

    PYTHONPATH=scripts python -m pytest -q tests/test_meta_device.py
"""
from __future__ import annotations

import importlib
import warnings

import pytest
import torch

from muongrid.lab import devicecheck
from muongrid.lab.devicecheck import simulate

SYNC_BUDGET = 0  # host syncs per optimizer step: off a CPU the finite check is deferred (finite.py), so none
SMALL = ["--shapes", "36x57,45x28,33x17,20x44,8x12", "--tp-dims", "0,1,none,1,0"]
TRAIN = ["--steps", "1", "--eval-every", "1", "--eval-batches", "1", "--eval-batch", "2", "--batch", "6",
         "--width", "16", "--heads", "2", "--context", "8", "--layers", "1", "--metrics-every", "0"]


PACKAGED = {"verify", "bench"}  # scripts/verify.py and bench.py wrap muongrid.verify / muongrid.bench


def entry(name: str):
    """Import ``scripts/<name>.py`` as a module (it is a script, not part of the package), or, for the
    checks that live in the package, the module the script wraps."""
    if name in PACKAGED:
        return importlib.import_module(f"muongrid.{name}")
    return importlib.import_module(name)   # scripts/ is on pytest's path (pyproject.toml)


def args_of(name: str, argv: list[str]):
    """The parsed arguments ``scripts/<name>.py argv`` would hand its worker (its own parser and checks)."""
    module = entry(name)
    if hasattr(module, "parse_args"):
        return module.parse_args(argv)
    seen = {}
    launch = module.launch
    module.launch = lambda worker, args: seen.setdefault("args", args) and 0
    try:
        module.main(argv)
    finally:
        module.launch = launch
    return seen["args"]


@pytest.fixture(scope="module", autouse=True)
def quiet_and_small_corpus():
    """One corpus load for all cases (the scripts read it on every rank), and no deprecation noise."""
    from muongrid.lab import charlm
    corpus = charlm.load_corpus()
    saved = {}
    for name in ("train", "profile_step"):
        saved[name] = entry(name).load_corpus
        entry(name).load_corpus = lambda *a, **k: corpus
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    for name, fn in saved.items():
        entry(name).load_corpus = fn


CASES = {
    # every optimizer path of the engine: three layouts of Muon, the hybrid, AdamW
    "verify-muon-layouts": ("verify", ["--layout", "bucket,owner,aligned,group", "--steps", "1", *SMALL]),
    "verify-hybrid": ("verify", ["--optimizer", "hybrid", "--layout", "owner", "--steps", "1", *SMALL]),
    "verify-adamw": ("verify", ["--optimizer", "adamw", "--steps", "1", *SMALL]),
    # the entry points' workers
    "trace_step": ("trace_step", SMALL),
    "collectives": ("collectives", ["--numel", "12"]),
    "faults-none": ("faults", ["--steps", "2", "--step", "99"]),
    "train-hybrid-owner": ("train", [*TRAIN, "--steps", "2"]),  # a second step: state made in the first
    "train-fsdp": ("train", [*TRAIN, "--fsdp"]),
    "inspect_grid": ("inspect_grid", []),
    "measure_links": ("measure_links", ["--points", "2", "--reps", "1"]),
}
# bench.py's worker passed this check (2x2, one step of bucket Muon and AdamW, 9 s) and is left out for time: it
# runs the optimizers verify covers, plus timing helpers that synchronize on CUDA (lab/profiling.py).
# train.py with --optimizer muon/adamw or another layout runs the same worker lines with another optimizer class,
# whose paths verify covers on both grids; left out to keep this file under a minute.
# 3x2 (DP shards that do not divide evenly, six ranks) for the paths whose plan depends on it; FSDP on 3x2 is below.
ON_3X2 = ("verify-muon-layouts", "verify-hybrid", "train-hybrid-owner", "faults-none", "collectives")
# trace_step's hook reads the norm of every intermediate tensor by design (a teaching trace, not a training path)
SYNCS_BY_DESIGN = ("trace_step",)


@pytest.mark.parametrize("case,grid", [(c, (2, 2)) for c in sorted(CASES)] + [(c, (3, 2)) for c in ON_3X2],
                         ids=lambda v: v if isinstance(v, str) else f"{v[0]}x{v[1]}")
def test_meta_device(case, grid):
    name, argv = CASES[case]
    dp, tp = grid
    args = args_of(name, [*argv, "--dp", str(dp), "--tp", str(tp)])
    audit = simulate(entry(name).worker, dp, tp, args, passes=2 if "--fsdp" in argv else 1)
    budget = 10**9 if case in SYNCS_BY_DESIGN else SYNC_BUDGET
    assert audit.problems(budget) == []
    if name in ("verify", "train", "faults", "trace_step"):
        assert audit.steps > 0, "no optimizer step was seen: the check would pass vacuously"


def test_fsdp_more_ranks_than_matrices():
    """3x2 grid, one layer: 4 Muon matrices for 6 ranks, so two ranks own none and send an empty buffer."""
    args = args_of("train", [*TRAIN, "--steps", "2", "--fsdp", "--dp", "3", "--tp", "2"])
    audit = simulate(entry("train").worker, 3, 2, args, passes=2)
    assert audit.problems(SYNC_BUDGET) == []
    assert audit.steps == 6 * 2


def test_the_check_catches_each_kind():
    """The audit is not vacuous: a CPU tensor at a collective, a mixed-device op and two syncs in a step
    are each reported."""
    from muongrid.distributed import DistributedMuon

    def worker(grid, comm, args):
        comm.all_gather(torch.ones(4), "dp", "demo")                       # off the grid's device
        try:
            torch.ones(3, device=grid.device) + torch.ones(3)              # mixes meta and cpu
        except RuntimeError:
            pass
        p = torch.nn.Parameter(torch.ones(4, 4, device=grid.device))
        opt = DistributedMuon([p], grid, comm=comm)
        opt.register_step_pre_hook(lambda o, a, k: (bool(p.sum() > 0), float(p.sum())) and None)  # two syncs in a step
        p.grad = torch.ones_like(p)
        opt.step()

    problems = simulate(worker, 2, 2, None).problems(SYNC_BUDGET)
    assert any("collective c10d._allgather_base_" in p and "cpu" in p for p in problems), problems
    assert any("mixes devices" in p for p in problems), problems
    assert any("host syncs in optimizer step" in p for p in problems), problems


@pytest.mark.parametrize("mode, syncs", [(None, 0), ("defer", 0), ("raise", 1)])
def test_a_step_reads_nothing_back_unless_asked(mode, syncs):
    """check_finite's default off a CPU ("defer") and the presence vote over the host group cost no host sync;
    "raise" reads one flag per step, before anything changes."""
    from muongrid.distributed import DistributedMuon

    def worker(grid, comm, args):
        p = torch.nn.Parameter(torch.ones(8, 4, device=grid.device))
        opt = DistributedMuon([p], grid, comm=comm, layout="owner", check_finite=mode)
        for _ in range(2):
            p.grad = torch.ones_like(p)
            opt.step()

    audit = simulate(worker, 2, 2, None)
    per_step = audit.syncs_per_step()
    assert audit.steps == 8 and sorted(set(per_step.values()) or {0}) == [syncs], per_step
    assert audit.problems(syncs) == []


def test_checkpoint_placement_names_the_device_index():
    """ShardedTensor compares a shard's placement device with its tensor's device: cuda:1 is not cuda."""
    from torch.distributed._shard.sharded_tensor.metadata import ShardMetadata

    from muongrid.checkpoint import placement
    assert placement(3, torch.device("cuda", 1)) == "rank:3/cuda:1"
    assert ShardMetadata([0], [1], placement(3, torch.device("cuda", 1))).placement.device() == torch.device("cuda", 1)
    assert placement(0, torch.device("cpu")) == "rank:0/cpu"


def test_meta_handle_is_removed():
    """simulate() lends torch a stand-in device module for meta and takes it back."""
    assert not hasattr(torch, "meta") or not isinstance(torch.meta, devicecheck._MetaHandle)


def test_subgroups_get_the_timeout():
    """--timeout reaches the dp and tp groups: init_device_mesh gets backend options carrying it (a gloo
    2x2 run showed dp/tp groups at 0:30:00, gloo's default, beside a world group at --timeout before)."""
    import datetime

    import torch.distributed as dist

    from muongrid.grid import subgroup_options
    assert subgroup_options(None) is None
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        options = subgroup_options(datetime.timedelta(seconds=7))
        assert set(options) == {"dp", "tp"}
        assert all(backend == "gloo" and opts._timeout == datetime.timedelta(seconds=7)
                   for backend, opts in options.values())
    finally:
        dist.destroy_process_group()


def test_finite_check_reads_one_flag_and_still_names_the_bad_parameters():
    """All finite: one host sync (counted on meta). Not: the error names the first bad gradient with its count, in
    the wording faultcheck expects, and lists the others."""
    import re

    from muongrid.finite import check_finite, nonfinite
    from muongrid.lab.devicecheck import Audit, DeviceAudit
    from muongrid.lab.faultcheck import EXPECTED

    audit = Audit(torch.device("meta"))
    audit._step = "step"
    with DeviceAudit(audit):
        check_finite([(f"w{i}", torch.ones(3, 3, device="meta")) for i in range(21)], where="rank 0")
    assert audit.syncs_per_step() == {(0, "step"): 1}

    grads = [("w0", torch.tensor([1.0, float("nan")])), ("w1", torch.ones(2)), ("w2", torch.tensor([float("inf")] * 3))]
    assert nonfinite(grads) == [("w0", 1), ("w2", 3)]
    with pytest.raises(FloatingPointError) as e:
        check_finite(grads, where="rank 3 (dp 1, tp 1), step 2")
    assert re.search(EXPECTED["nan"][0][0].format(rank=3, dp=1, tp=1), str(e.value)), str(e.value)
    assert "also non-finite: 'w2' (3)" in str(e.value)
    assert nonfinite([("w", torch.ones(2))]) == [] and nonfinite([]) == []


def test_rank_device_under_torchrun_and_one_gpu_per_process(monkeypatch):
    """cuda:{LOCAL_RANK % visible GPUs}: all GPUs visible -> its own index; one visible (a scheduler's
    CUDA_VISIBLE_DEVICES per task) -> cuda:0, not a cuda:5 that does not exist. gloo -> the CPU."""
    from muongrid.devices import rank_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert rank_device("nccl") == torch.device("cuda", 5)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert rank_device("nccl") == torch.device("cuda", 0)
    assert rank_device("gloo") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        rank_device("nccl")


def test_bucket_prefetch_keeps_at_most_two_gathered_buckets_alive(monkeypatch):
    """The bucket layout with prefetch gathers one bucket ahead: at most two DP-gathered bf16 buckets are
    alive at once (gathered and not yet orthogonalised), not every bucket of the model; the numbers are
    those of the unprefetched step (zero tolerance: the same kernels on the same numbers)."""
    from muongrid import DistributedMuon, Grid
    from muongrid.comm import Pending

    def params():
        g = torch.Generator().manual_seed(0)
        return [torch.nn.Parameter(torch.randn(24, 40, generator=g)) for _ in range(6)]

    result = {}
    for overlap in ("none", "prefetch"):
        ps = params()
        opt = DistributedMuon(ps, Grid.single(), layout="bucket", bucket_numel=1000, overlap=overlap, lr=0.02)
        alive, most, started = [0], [0], [0]
        start = opt.comm.all_gather_into_async   # the DP gather, in place in a slot of the flow's pool

        def counting(full, rank, group, phase, wait_now=False, start=start):
            out = start(full, rank, group, phase, wait_now=wait_now)
            if phase != "ns_gather_dp":
                return out
            alive[0] += 1
            started[0] += 1
            most[0] = max(most[0], alive[0])

            def finish():
                alive[0] -= 1
                return Pending.wait(out)
            return type("Counted", (), {"wait": staticmethod(finish)})()

        monkeypatch.setattr(opt.comm, "all_gather_into_async", counting)
        for step in range(2):
            for i, p in enumerate(ps):
                p.grad = torch.full_like(p, 0.25 * (i + step + 1)).add_(torch.arange(p.numel()).view_as(p) % 7)
            opt.step()
        assert started[0] >= 2 * 4, "the test needs several buckets per step"
        result[overlap] = ([p.detach().clone() for p in ps], most[0])
    assert result["prefetch"][1] == 2 and result["none"][1] == 1
    assert all(torch.equal(a, b) for a, b in zip(result["none"][0], result["prefetch"][0]))

"""Run by tests/test_agree.py under the launcher: ranks that always agree (issue 40), on gloo.

Every case gives one rank (the job's last) a NaN in one gradient at step ``BAD`` of a short loop that catches
``FloatingPointError`` and goes on, as a user's loop skips a bad batch, and compares what every rank did:

* ``check_finite="raise"``: every rank raises at ``BAD``, with everything (parameters, state, step counts) as it was
  just before, and the loop's end equals, bit for bit, a run that never saw that batch;
* ``check_finite="defer"``: nothing raises; at ``BAD`` every rank leaves its parameters and state as they were,
  the next ``step()`` warns (``SkippedStep``) on every rank naming the step, and the end equals the same run;
* ``"capturable"`` (ZeRO-1 only): "defer" with ``capturable=True``, whose step reads nothing back, so the loop
  reads the verdict after every step (``opt.check_finite_now()``) and the warning names ``BAD`` right after it.

A split (one rank skipping while another enters a collective) would abort or time out the launch instead.
The cases: ZeRO-1 on the launch's grid (2x1 or 2x2, TP-split matrices on 2x2), an expert grid (4x1, ep 2: a
dense optimizer and an expert one decided together), FSDPMuon 2x1; on two ranks also ``torch.amp.GradScaler``
(refused at its first step, on every rank, nothing changed), a ``DistributedDataParallel`` model (refused with
the fix; the same model unwrapped is not), the plan check's setup traffic and the expert groups' timeouts.
Prints one JSON line (rank 0): every rank's results.

    python tests/agree_run.py --dp 2 --tp 1 --cases zero1,fsdp,scaler,ddp,setup
    python tests/agree_run.py --dp 2 --tp 2 --cases zero1,expert
"""
import argparse
import json
import sys
import warnings

import torch

from muongrid import DistributedMuon
from muongrid.contract import prepare_together
from muongrid.finite import SkippedStep
from muongrid.launch import add_launch_args, launch

STEPS, BAD = 4, 2
# name: (full shape, tp split dim); the matrices go to Muon, the vector to AdamW
DENSE = {"a.w": ((8, 5), 0), "b.w": ((9, 6), 1), "c.w": ((6, 11), -1), "c.b": ((5,), -1)}
BANK = {"experts.w": ((4, 6, 5), -1)}   # 4 experts, dealt over ep slices


def local_shape(shape, dim, tp):
    return tuple(s // tp if d == dim else s for d, s in enumerate(shape))


def start(spec: dict, tp: int, tp_rank: int) -> dict:
    """The same full values on every rank; this TP rank's block of each."""
    gen, out = torch.Generator().manual_seed(0), {}
    for name, (shape, dim) in spec.items():
        full = torch.randn(shape, generator=gen)
        out[name] = full if dim == -1 else full.chunk(tp, dim)[tp_rank].clone()
    return out


def grad_of(name: str, shape, step: int, rank: int) -> torch.Tensor:
    seed = 1000 * step + 10 * rank + sorted(DENSE | BANK).index(name)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def snapshot(opts, params) -> list[torch.Tensor]:
    """Everything a step may change: the parameters and every state tensor (step counts included)."""
    out = [p.detach().to_local().clone() if hasattr(p, "to_local") else p.detach().clone() for p in params]
    for opt in opts:
        for p in params:
            for v in opt.state.get(p, {}).values():
                if isinstance(v, torch.Tensor):
                    out.append(v.to_local().clone() if hasattr(v, "to_local") else v.detach().clone())
    return out


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def loop(opts, params, give, skip=None, together=False, read_each=False) -> dict:
    """The user's loop: ``give(step)`` sets the gradients; a FloatingPointError skips the batch."""
    raised, unchanged, warned = [], [], []
    first = snapshot(opts, params)[:len(params)]
    for step in range(1, STEPS + 1):
        if step == skip:
            continue
        give(step)
        before = snapshot(opts, params)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if together:
                    prepare_together(opts)
                for opt in opts:
                    opt.step()
                    if read_each:   # capturable: the step leaves its verdict on the device; read it between steps
                        opt.check_finite_now()
            warned += [(step, str(w.message)) for w in caught if issubclass(w.category, SkippedStep)]
            if step == BAD and skip is None:   # "defer": the step ran, masked; its host counts wait for the read
                unchanged.append(same([t for t in before if t.dim()], [t for t in snapshot(opts, params) if t.dim()]))
        except FloatingPointError as e:
            raised.append((step, str(e), same(before, snapshot(opts, params))))
        for opt in opts:
            opt.zero_grad()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for opt in opts:
            opt.check_finite_now()
    warned += [(0, str(w.message)) for w in caught if issubclass(w.category, SkippedStep)]
    return dict(raised=[(s, m[:160], ok) for s, m, ok in raised], unchanged=unchanged,
                warned=[(s, m[:120]) for s, m in warned], end=snapshot(opts, params),
                skipped=[o.skipped_steps for o in opts], moved=not same(first, snapshot(opts, params)[:len(params)]))


def compare(bad: dict, clean: dict) -> dict:
    return dict(raised=bad["raised"], unchanged=bad["unchanged"], warned=bad["warned"], skipped=bad["skipped"],
                equal=same(bad["end"], clean["end"]), moved=bad["moved"] and clean["moved"],
                clean_end=[t.tolist() for t in clean["end"]])


# ---- the cases -------------------------------------------------------------------------------------------

def zero1(grid, comm, mode: str) -> dict:
    last, capturable = grid.dp * grid.tp - 1, mode == "capturable"

    def run(skip):
        vals = start(DENSE, grid.tp, grid.tp_rank)
        params = {n: torch.nn.Parameter(v) for n, v in vals.items()}
        mats = [n for n in DENSE if len(DENSE[n][0]) == 2]
        opt = DistributedMuon([dict(params=[params[n] for n in mats], names=mats,
                                    tp_split_dims=[DENSE[n][1] for n in mats], weight_decay=0.1),
                               dict(params=[params["c.b"]], names=["c.b"], use_muon=False, tp_split_dims=[-1])],
                              grid, layout="owner", check_finite="defer" if capturable else mode, capturable=capturable)

        def give(step):
            for n, p in params.items():
                p.grad = grad_of(n, p.shape, step, grid.rank)
            if step == BAD and grid.rank == last:
                params["b.w"].grad[1, 2] = float("nan")
        return loop([opt], list(params.values()), give, skip, read_each=capturable)
    return compare(run(None), run(BAD))


def expert(grid, comm, mode: str) -> dict:
    """A dense optimizer on the job's grid and an expert one on grid.expert(2), decided together; the NaN is in
    an expert bank on the last rank, so only the other slice's optimizer has finite gradients of its own."""
    from same_world import grid_of
    _, _, job = grid_of(grid, "4x1", 60.0)
    sub = job.expert(2)
    last, k = job.dp - 1, BANK["experts.w"][0][0] // 2
    mine = slice((job.dp_rank % 2) * k, (job.dp_rank % 2 + 1) * k)

    def run(skip):
        vals = start(DENSE, 1, 0)
        dense = {n: torch.nn.Parameter(v) for n, v in vals.items()}
        bank = torch.nn.Parameter(start(BANK, 1, 0)["experts.w"][mine].clone())
        mats = [n for n in DENSE if len(DENSE[n][0]) == 2]
        dense_opt = DistributedMuon([dict(params=[dense[n] for n in mats], names=mats),
                                     dict(params=[dense["c.b"]], names=["c.b"], use_muon=False)],
                                    job, layout="owner", check_finite=mode)
        expert_opt = DistributedMuon([dict(params=[bank], names=["experts.w"])], sub, layout="owner",
                                     check_finite=mode)

        def give(step):
            for n, p in dense.items():
                p.grad = grad_of(n, p.shape, step, job.rank)
            bank.grad = grad_of("experts.w", BANK["experts.w"][0], step, job.rank)[mine].clone()
            if step == BAD and job.rank == last:
                bank.grad[0, 1, 1] = float("inf")
        return loop([dense_opt, expert_opt], list(dense.values()) + [bank], give, skip, together=True)
    out = compare(run(None), run(BAD))
    out["timeouts"] = sorted({str(g._get_backend(torch.device("cpu")).options._timeout)
                              for g in (sub.dp_group, sub.world_group, sub.host_group)})
    return out


def fsdp(grid, comm, mode: str) -> dict:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from muongrid.fsdp import FSDPMuon, fsdp_piece
    last = grid.dp * grid.tp - 1

    def run(skip):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(9, 7), torch.nn.Linear(7, 5))
        fully_shard(model, mesh=grid.mesh["dp"])
        named = list(model.named_parameters())
        opt = FSDPMuon([dict(params=[p for _, p in named if p.ndim == 2], names=[n for n, p in named if p.ndim == 2],
                             weight_decay=0.1),
                        dict(params=[p for _, p in named if p.ndim != 2], names=[n for n, p in named if p.ndim != 2],
                             use_muon=False)], grid, check_finite=mode)

        def give(step):
            for i, (n, p) in enumerate(named):
                whole = torch.randn(p.shape, generator=torch.Generator().manual_seed(1000 * step + i))
                block = whole[fsdp_piece(n, p, grid).slices()].contiguous()
                if step == BAD and grid.rank == last and i == 2:
                    block.view(-1)[0] = float("nan")
                p.grad = DTensor.from_local(block, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
        return loop([opt], [p for _, p in named], give, skip)
    return compare(run(None), run(BAD))


def scaler(grid, comm) -> dict:
    """fp16 loss scaling: GradScaler's overflow check is each rank's own; the optimizer refuses to be driven by it."""
    w = torch.nn.Parameter(torch.ones(6, 4))
    opt = DistributedMuon([w], grid)
    scale = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scale.scale(torch.ones(()))
    w.grad = torch.full_like(w, float("inf") if grid.rank == grid.dp * grid.tp - 1 else 1.0)
    before = w.detach().clone()
    try:
        scale.step(opt)
        return dict(refused=None)
    except RuntimeError as e:
        refused, unchanged = str(e), torch.equal(before, w.detach())
    w.grad = torch.ones_like(w)
    opt.step()   # the same optimizer stepped directly afterwards: not refused
    return dict(refused=refused, unchanged=unchanged, stepped=not torch.equal(before, w.detach()))


def ddp(grid, comm) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4)
    wrapped = DDP(model)
    opt = DistributedMuon([dict(params=[model.weight]), dict(params=[model.bias], use_muon=False)], grid)
    wrapped(torch.randn(3, 6)).sum().backward()
    try:
        opt.step()
        refused = None
    except RuntimeError as e:
        refused = str(e)
    del wrapped, opt
    plain = DistributedMuon([dict(params=[model.weight]), dict(params=[model.bias], use_muon=False)], grid)
    model(torch.randn(3, 6)).sum().backward()
    plain.step()   # the same parameters, no longer wrapped: no error
    return dict(refused=refused)


def setup(grid, comm) -> dict:
    """The plan check's traffic when the optimizer is built: a hash, however many parameters."""
    params = [torch.nn.Parameter(torch.ones(3, 2)) for _ in range(300)]
    opt = DistributedMuon([dict(params=params, names=[f"layer{i}.weight" for i in range(len(params))])], grid)
    return dict(setup_bytes=[r.numel for r in opt.comm.ledger.records if r.phase == "setup"])


def worker(grid, comm, args):
    torch.set_num_threads(1)
    out = {}
    for case in args.cases.split(","):
        if case in ("zero1", "expert", "fsdp"):
            fn = globals()[case]
            modes = ("raise", "defer") + (("capturable",) if case == "zero1" else ())
            out[case] = {mode: fn(grid, comm, mode) for mode in modes}
            # the masked ("defer") steps take the same numbers as the plain ones, bit for bit
            plain = out[case]["raise"].pop("clean_end")
            for mode in modes[1:]:
                out[case][mode]["same_as_raise"] = out[case][mode].pop("clean_end") == plain
        else:
            out[case] = globals()[case](grid, comm)
    everyone = comm.gather_objects(out, "report")
    if grid.rank == 0:
        print(json.dumps(dict(world=grid.dp * grid.tp, ranks=everyone)), flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_launch_args(p)
    p.add_argument("--cases", default="zero1")
    sys.exit(launch(worker, p.parse_args()))

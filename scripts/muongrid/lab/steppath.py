"""The step path, measured: which of the package's modules and lines one steady-state ``step()`` runs.

    python -m muongrid.lab.steppath            # per module: lines in the file, lines a step ran

A line tracer (``sys.settrace``) watches the second of two ``step()`` calls of ``DistributedMuon`` on small odd
shapes (the tests' own), for every layout (bucket, owner, aligned, group), with and without ``capturable``, on
a 1 x 1 grid on the CPU and on 2 x 1 and 2 x 2 grids over the fake process group on the meta device
(``devicecheck.simulate``: every rank in this process, in turn), and in the DDP mode (``grad_reduce="ddp"``,
aligned, 1 x 1 and 2 x 1). Every module of ``muongrid`` (``lab`` aside)
that ran a line is on the step path; ``tests/test_house.py`` holds the files a newcomer reads to follow a step
to a line budget, and checks that each of them really runs in a step.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

PACKAGE = Path(__file__).resolve().parents[1]
LAYOUTS = ("bucket", "owner", "aligned", "group")
SHAPES, TP_DIMS = [(36, 57), (45, 28), (33, 17), (20, 44), (8, 12)], [0, 1, -1, 1, 0]


class LineTracer:
    """(module path relative to the package, line number) of every line of ``muongrid`` run inside the block."""

    def __init__(self):
        self.lines: set[tuple[str, int]] = set()

    def _local(self, frame, event, arg):
        if event == "line":
            self.lines.add((self._files[frame.f_code.co_filename], frame.f_lineno))
        return self._local

    def _global(self, frame, event, arg):
        name = frame.f_code.co_filename
        if name not in self._files:
            path = Path(name)
            inside = path.is_relative_to(PACKAGE) and not path.is_relative_to(PACKAGE / "lab")
            self._files[name] = path.relative_to(PACKAGE).as_posix() if inside else None
        return self._local if self._files[name] else None

    def __enter__(self):
        self._files: dict = {}
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)


def _params(grid):
    from ..sharding import tp_shard

    mats = [torch.nn.Parameter(tp_shard(torch.randn(s, device=grid.device), d, grid.tp, grid.tp_rank).clone())
            for s, d in zip(SHAPES, TP_DIMS)]
    gains = [torch.nn.Parameter(torch.randn(n, device=grid.device)) for n in (57, 31)]
    return [dict(params=mats, tp_split_dims=TP_DIMS, lr=0.02),
            dict(params=gains, use_muon=False, tp_split_dims=[-1, -1], lr=1e-3)]


def _two_steps(grid, comm, layout: str, capturable: bool, tracer: LineTracer, grad_reduce: str = "step") -> None:
    from ..distributed import DistributedMuon

    groups = _params(grid)
    opt = DistributedMuon(groups, grid, comm=comm, layout=layout, capturable=capturable, bucket_numel=600,
                          grad_reduce=grad_reduce)
    if grad_reduce == "ddp":   # no DistributedDataParallel here: the first step's check that one holds the model
        opt._ddp_checked = True   # is not a steady-state step's (contract.check_ddp; tests/test_ddp.py runs it)
    for step in range(2):
        for g in groups:
            for p in g["params"]:
                p.grad = torch.randn_like(p)
        if step:
            with tracer:
                opt.step()
        else:
            opt.step()


def step_lines() -> set[tuple[str, int]]:
    """Every (module, line) of the package that a steady-state step ran, over all the configurations above."""
    from ..grid import Grid
    from .devicecheck import simulate

    tracer, seen = LineTracer(), set()
    for layout in LAYOUTS:
        for capturable in (False, True):
            _two_steps(Grid.single("cpu"), None, layout, capturable, tracer)
            seen |= tracer.lines
            for dp, tp in ((2, 1), (2, 2)):
                simulate(lambda grid, comm, _: _two_steps(grid, comm, layout, capturable, tracer), dp, tp, None)
                seen |= tracer.lines
    for capturable in (False, True):   # the DDP mode: aligned, DP only (options.check_grad_reduce)
        _two_steps(Grid.single("cpu"), None, "aligned", capturable, tracer, "ddp")
        seen |= tracer.lines
        simulate(lambda grid, comm, _: _two_steps(grid, comm, "aligned", capturable, tracer, "ddp"), 2, 1, None)
        seen |= tracer.lines
    return seen


def report(lines: set[tuple[str, int]]) -> list[tuple[str, int, int]]:
    """(module, lines in its file, distinct lines a step ran), the modules a step ran, most run first."""
    ran: dict[str, set] = {}
    for module, line in lines:
        ran.setdefault(module, set()).add(line)
    rows = [(m, len((PACKAGE / m).read_text().splitlines()), len(ls)) for m, ls in ran.items()]
    return sorted(rows, key=lambda r: -r[2])


def main() -> int:
    rows = report(step_lines())
    print(f"{'module':<24} {'lines':>6} {'run by a step':>14}")
    for module, total, run in rows:
        print(f"{module:<24} {total:>6} {run:>14}")
    print(f"{'all':<24} {sum(r[1] for r in rows):>6} {sum(r[2] for r in rows):>14}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

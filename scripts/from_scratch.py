"""Distributed Muon from scratch: ZeRO-1 x TP in plain torch.distributed, checked bit for bit against muongrid.

    python scripts/from_scratch.py --dp 2 --tp 2                  # 4 local gloo ranks
    python scripts/from_scratch.py --dp 2 --tp 1 --steps 5
    python scripts/from_scratch.py --dp 2 --tp 2 --plant tp-lr    # plant a bug beside it: the check catches it
    python scripts/from_scratch.py --dp 2 --tp 2 --launch listing # the ranks started by the listing's own launch
    python scripts/from_scratch.py --dp 3 --code mine.py --class OwnerMuon --layout owner   # your version
    torchrun --standalone --nproc-per-node 4 scripts/from_scratch.py --dp 2 --tp 2   # NCCL where CUDA is

What it is for: learning the mechanism by reading it whole. The lines between the ``BOOK-START`` and
``BOOK-END`` markers (chapter 5 shows them) are a complete program's parts, with their imports:
``FromScratchMuon``, Moonshot's Distributed Muon (the "bucket" layout: every rank orthogonalises every
matrix) written with nothing but ``torch.distributed``'s own calls (``new_group``, ``reduce_scatter``,
``all_gather``: their long-standing list forms, which torch 2.13 did not rename, while the flat
``all_gather_into_tensor`` / ``reduce_scatter_tensor`` forms warn there that they were), and ``launch``, ten lines of
``mp.spawn`` and ``init_process_group`` that start the ranks on one machine. One step:

  1. gradients reduce-scattered (sum) over DP into this rank's shard of a flat buffer, divided by dp;
  2. momentum on the shard (fp32, torch's EMA form) and the Nesterov update, sent as bf16;
  3. the update shards gathered over DP in bf16: every rank has the whole TP-local buffer;
  4. each matrix split over TP gathered over TP: the whole matrix;
  5. Newton-Schulz on it;
  6. this rank keeps its TP slice, and of that the part inside its DP shard;
  7. decoupled weight decay and the scaled step (lr * 0.2 * sqrt(max(A, B))) on the fp32 master shard;
  8. the master shards all-gathered over DP (fp32) into the parameters.

Stages 3-6 are one method, ``orthogonalise``: chapter 5's exercise replaces it with one owner per
matrix (``from_scratch_owner.py``, checked here against ``layout="owner"``). A group's TP-local
matrices lie end to end in one flat buffer, padded to ``dp`` equal shards: a matrix may straddle two
shards and the buffer's length need not divide by ``dp``. Newton-Schulz itself is imported
(``muongrid.newton_schulz.zeropower_ns5``): orthogonalising one whole matrix is chapter 1's subject,
and nothing about it is distributed.

Every rank builds the same seeded problem (``muongrid.lab.synthetic``), takes its TP slice of every
matrix, and steps two optimizers on the same gradients (different on every DP rank): this file's and
muongrid's ``DistributedMuon`` (``--layout``, default bucket), with the same hyperparameters on the same
grid. After each step every rank compares its parameters, bit for bit, and the largest difference over
all ranks is printed. By default the ranks are started by ``muongrid.launch`` (torchrun, timeouts, a
failing rank's traceback); ``--launch listing`` starts them with the listing's ``launch`` instead.
``--code FILE`` runs FILE after the listing, in its namespace, so FILE may redefine any of its names
(a whole edited copy of the listing, or one class that subclasses ``FromScratchMuon``), and steps the
class ``--class`` names. ``--plant NAME`` (a comma list) also steps copies of ``FromScratchMuon``
with one line of it changed (``PLANTED``), to see the comparison catch a bug, or not. The last line
is JSON: ``{"equal": ..., "max_abs_diff": ..., "per_step_max_abs_diff": [...], "planted": {...},
...}`` (``equal``: the class stepped, every parameter, rank and step, bit for bit). Exit code 0 iff
equal.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
import textwrap

# BOOK-START from-scratch
import math
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from muongrid.newton_schulz import zeropower_ns5


def make_groups(dp, tp):
    """This rank's DP and TP process groups; rank = dp_rank * tp + tp_rank. new_group
    is collective: every rank creates every group, in the same order."""
    rank, dp_group, tp_group = dist.get_rank(), None, None
    for t in range(tp):      # a DP group: the same TP slice in every model replica
        group = dist.new_group([d * tp + t for d in range(dp)])
        if rank % tp == t:
            dp_group = group
    for d in range(dp):      # a TP group: the ranks of one model replica
        group = dist.new_group([d * tp + t for t in range(tp)])
        if rank // tp == d:
            tp_group = group
    return dp_group, tp_group


class FromScratchMuon:
    """ZeRO-1 Muon for one parameter group of TP-local matrices."""

    def __init__(self, params, split_dims, groups, dp, tp, lr, wd, mu=0.95):
        self.params, self.split_dims = params, split_dims
        self.dp_group, self.tp_group = groups
        self.dp, self.tp, self.tp_rank = dp, tp, dist.get_rank() % tp
        self.lr, self.wd, self.mu = lr, wd, mu   # momentum mu, weight decay wd
        self.shapes = [list(p.shape) for p in params]   # each whole matrix's shape
        for shape, d in zip(self.shapes, split_dims):
            shape[d] *= tp if d != -1 else 1
        sizes = [p.numel() for p in params]   # matrices end to end in one flat buffer
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.shard = -(-sum(sizes) // dp)     # dp equal shards; the last one padded
        self.lo = dist.get_rank() // tp * self.shard   # mine: [lo, lo + shard)
        flat = self.flatten([p.detach() for p in params])
        self.master = flat[self.lo: self.lo + self.shard].clone()   # fp32
        self.momentum = torch.zeros_like(self.master)

    def flatten(self, tensors):
        flat = torch.zeros(self.dp * self.shard, device=tensors[0].device)
        for t, o in zip(tensors, self.offsets):
            flat[o: o + t.numel()] = t.reshape(-1)
        return flat

    def mine(self, i):
        """Matrix i in my DP shard: [a, b) of the flat buffer (nothing if a >= b)."""
        o, n = self.offsets[i], self.params[i].numel()
        return max(o, self.lo), min(o + n, self.lo + self.shard)

    @torch.no_grad()
    def step(self):
        dp, lo = self.dp, self.lo
        # 1. gradients: reduce-scatter (sum) over DP into my shard, then the mean
        grad = torch.empty_like(self.master)
        grads = self.flatten([p.grad for p in self.params])
        dist.reduce_scatter(grad, list(grads.chunk(dp)), group=self.dp_group)
        grad /= dp
        # 2. momentum on my shard (EMA form), then the Nesterov update
        self.momentum.lerp_(grad, 1 - self.mu)
        update = grad.lerp(self.momentum, self.mu)
        self.master.mul_(1 - self.lr * self.wd)   # 7. decoupled weight decay ...
        for i, ortho in self.orthogonalise(update.to(torch.bfloat16)):   # 3-6
            scaled_lr = self.lr * 0.2 * math.sqrt(max(self.shapes[i]))   # match RMS
            a, b = self.mine(i)   # ... and the scaled step on my part of matrix i
            self.master[a - lo: b - lo].add_(ortho, alpha=-scaled_lr)
        # 8. all-gather the master shards over DP (fp32) into the parameters
        flat = torch.empty(dp * self.shard, device=grad.device)
        dist.all_gather(list(flat.chunk(dp)), self.master, group=self.dp_group)
        for p, o in zip(self.params, self.offsets):
            p.copy_(flat[o: o + p.numel()].view(p.shape))

    def orthogonalise(self, update):
        """Stages 3-6, from my shard of the bf16 update: for each matrix i that I keep
        a part of, (i, my part of the orthogonalised matrix i, flat)."""
        dp, tp = self.dp, self.tp
        # 3. DP gather (bf16): every rank gets the whole TP-local buffer of updates
        whole = torch.empty(dp * self.shard, dtype=update.dtype, device=update.device)
        dist.all_gather(list(whole.chunk(dp)), update, group=self.dp_group)
        for i, (p, o, d) in enumerate(zip(self.params, self.offsets, self.split_dims)):
            matrix = whole[o: o + p.numel()].view(p.shape)   # a matrix, not flat
            if d != -1 and tp > 1:   # 4. TP gather: the whole matrix
                parts = [torch.empty_like(matrix) for _ in range(tp)]
                dist.all_gather(parts, matrix, group=self.tp_group)
                matrix = torch.cat(parts, dim=d)
            ortho = zeropower_ns5(matrix)   # 5. Newton-Schulz (chapter 1)
            if d != -1 and tp > 1:   # 6. keep my TP slice ...
                ortho = ortho.chunk(tp, dim=d)[self.tp_rank]
            a, b = self.mine(i)   # ... and of it my DP part
            if a < b:
                yield i, ortho.reshape(-1)[a - o: b - o]


def run_rank(rank, world, port, fn, args):   # one process: join the job, run fn
    address = f"tcp://127.0.0.1:{port}"
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
    try:
        fn(*args)
    finally:
        dist.destroy_process_group()


def launch(fn, dp, tp, *args):
    """Run fn(dp, tp, *args) in dp * tp processes on this machine, over gloo (CPU).
    mp.spawn's general form; "fork" starts each from this process, torch imported."""
    with socket.socket() as s:   # a free port for the ranks to meet on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run_rank, (dp * tp, port, fn, (dp, tp, *args)), nprocs=dp * tp,
                       start_method="fork")
# BOOK-END from-scratch


# ---- planted bugs: one line of the class above changed, to see the comparison catch it --------------

PLANTED = {
    # the sum of the DP gradients, not their mean (invisible when dp is a power of 2: see the chapter)
    "no-mean": ("grad /= dp", "pass"),
    # the lr scaled by the TP-local shape instead of the whole matrix's
    "tp-lr": ("max(self.shapes[i])", "max(self.params[i].shape)"),
    # every TP rank keeps TP slice 0 of the orthogonalised matrix
    "tp-slice": ("[self.tp_rank]", "[0]"),
    # the momentum's new value computed and thrown away (lerp, not lerp_): the buffer stays zero
    "lost-momentum": ("self.momentum.lerp_(", "self.momentum.lerp("),
}
LISTING = "FromScratchMuon"   # the class stepped unless --class names another


def planted(name: str) -> type:
    """``FromScratchMuon`` with the one line ``PLANTED[name]`` names changed (it must be there)."""
    old, new = PLANTED[name]
    source = textwrap.dedent(inspect.getsource(FromScratchMuon))
    if source.count(old) != 1:
        raise LookupError(f"planted bug {name!r}: {old!r} is not one line of FromScratchMuon any more")
    scope = dict(globals())
    exec(compile(source.replace(old, new), f"<FromScratchMuon with {name}>", "exec"), scope)
    return scope["FromScratchMuon"]


def load_code(path: str | None) -> tuple[dict, list[str]]:
    """The listing's names, with ``path`` (if given) run after them in the same namespace; and the names
    that ``path`` bound (new ones, or the listing's redefined)."""
    scope = dict(globals())
    if path is None:
        return scope, []
    before = dict(scope)
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), scope)
    return scope, sorted(k for k, v in scope.items() if not k.startswith("__") and before.get(k) is not v)


# ---- the run: this file's optimizer beside muongrid's, on the same problem and gradients ---------------

def parse_args(argv=None):
    from muongrid.launch import add_launch_args, arg_type, check_launch_args
    from muongrid.lab.synthetic import add_problem_args, check_problem_args

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    # small matrices that divide by neither 2 nor 3 (padding, straddlers); split dims that divide by 1, 2, 4
    add_problem_args(p, shapes="36x57,45x28,33x17,20x44,8x12", tp_dims="0,1,none,1,0")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layout", choices=["bucket", "owner"], default="bucket",
                   help="the layout of muongrid's DistributedMuon to compare with (default bucket)")
    p.add_argument("--code", metavar="FILE",
                   help="a Python file run after the listing, in its namespace: your version of any of its "
                        "names (the optimizer class, make_groups, launch)")
    p.add_argument("--class", dest="cls", default=LISTING, metavar="NAME",
                   help=f"the optimizer class to step (default {LISTING})")
    p.add_argument("--launch", choices=["muongrid", "listing"], default="muongrid",
                   help="start the ranks with muongrid.launch (default: torchrun too, timeouts, a failing "
                        "rank's traceback) or with the listing's launch (mp.spawn, gloo)")
    p.add_argument("--plant", type=arg_type(lambda s: [x for x in s.split(",") if x]), default=[],
                   help=f"comma list of bugs to step beside the real thing: {', '.join(PLANTED)}")
    args = p.parse_args(argv)
    check_launch_args(p, args)
    check_problem_args(p, args, "muon", 2)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    unknown = [x for x in args.plant if x not in PLANTED]
    if unknown:
        p.error(f"--plant {','.join(unknown)}: unknown; choose from {', '.join(PLANTED)}")
    if args.plant and (args.code or args.cls != LISTING):
        p.error("--plant changes a line of this file's FromScratchMuon: leave out --code and --class")
    try:
        scope, _ = load_code(args.code)
    except (OSError, SyntaxError) as e:
        p.error(f"--code {args.code}: {e}")
    if not isinstance(scope.get(args.cls), type):
        p.error(f"--class {args.cls}: no such class in the listing{' or ' + args.code if args.code else ''}")
    if args.launch == "listing" and args.backend == "nccl":
        p.error("--launch listing starts gloo ranks on this machine; for NCCL use torchrun (--launch muongrid)")
    return args


def worker(grid, comm, args) -> int:
    from muongrid.distributed import DistributedMuon
    from muongrid.lab.synthetic import build_problem, set_grads

    scope, defined = load_code(args.code)
    problem = build_problem("muon", args.shapes, args.tp_dims, 2, args.seed, grid.tp)
    hyper = [dict(lr=g["hyper"]["lr"], wd=g["hyper"]["weight_decay"]) for g in problem.groups]
    engine = DistributedMuon([dict(g, momentum=0.95, nesterov=True, adjust_lr="match_rms_adamw")
                              for g in problem.param_groups(grid.tp, grid.tp_rank, grid.device)],
                             grid, layout=args.layout, comm=comm)
    groups = scope["make_groups"](grid.dp, grid.tp)
    classes = {"from scratch": scope[args.cls], **{name: planted(name) for name in args.plant}}
    ours = {}
    for name, cls in classes.items():
        mine = problem.param_groups(grid.tp, grid.tp_rank, grid.device)
        ours[name] = (mine, [cls(g["params"], g["tp_split_dims"], groups, grid.dp, grid.tp, **h)
                             for g, h in zip(mine, hyper)])
    diffs = {name: [] for name in ours}
    for step in range(1, args.steps + 1):
        grads = problem.grads(step, grid.dp_rank, grid.dp)
        set_grads(engine.param_groups, grads, grid)
        engine.step()
        for name, (mine, opts) in ours.items():
            set_grads(mine, grads, grid)
            for opt in opts:
                opt.step()
            # bit for bit: the int32 patterns equal; and the largest difference, for the printout
            diff, same = torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)
            for g, e in zip(mine, engine.param_groups):
                for a, b in zip(g["params"], e["params"]):
                    a, b = a.detach().cpu(), b.detach().cpu()
                    diff = torch.maximum(diff, (a.double() - b.double()).abs().max())
                    same = same * float(torch.equal(a.view(torch.int32), b.view(torch.int32)))
            both = torch.stack([diff, -same]).to(grid.device)
            dist.all_reduce(both, op=dist.ReduceOp.MAX)   # over every rank: the worst
            diffs[name].append((both[0].item(), both[1].item() == -1))
        if grid.rank == 0:
            print(f"step {step}: largest |{args.cls} - muongrid| over all ranks = "
                  + ", ".join(f"{diffs[n][-1][0]:.3e} ({n}{', bit for bit' if diffs[n][-1][1] else ''})"
                              for n in ours), flush=True)
    if grid.rank != 0:
        return 0
    summary = {n: dict(equal=all(s for _, s in d), max_abs_diff=max(x for x, _ in d),
                       per_step_max_abs_diff=[x for x, _ in d]) for n, d in diffs.items()}
    mine = summary.pop("from scratch")
    print(f"\n{'EQUAL' if mine['equal'] else 'DIFFERENT'}: {args.cls} vs muongrid DistributedMuon "
          f"(layout {args.layout}), dp={grid.dp}, tp={grid.tp}, {args.steps} steps, bit for bit: {mine['equal']}")
    for n, s in summary.items():
        print(f"planted {n} ({PLANTED[n][0]!r} -> {PLANTED[n][1]!r}): "
              f"{'caught' if not s['equal'] else 'NOT caught'}, largest difference {s['max_abs_diff']:.3e}")
    print(json.dumps(dict(**mine, dp=grid.dp, tp=grid.tp, steps=args.steps, seed=args.seed, layout=args.layout,
                          cls=args.cls, code=args.code, defined=defined, launch=args.launch,
                          shapes=[list(s) for s in args.shapes], tp_dims=args.tp_dims, planted=summary,
                          backend=dist.get_backend(), device=str(grid.device))), flush=True)
    return 0 if mine["equal"] else 1


def listing_worker(dp: int, tp: int, args) -> None:
    """``worker`` on a rank that the listing's ``launch`` started (its process group is up): muongrid's grid
    and ledger are built here, on that group. A check that fails ends the rank with its exit code."""
    from muongrid.comm import Comm
    from muongrid.grid import Grid

    grid = Grid.build(dp, tp)
    comm = Comm(grid)
    code = worker(grid, comm, args)
    comm.close()
    if code:
        raise SystemExit(code)


def main(argv=None) -> int:
    from muongrid.launch import launch as launch_ranks

    args = parse_args(argv)
    if args.launch == "muongrid":
        return launch_ranks(worker, args)
    scope, _ = load_code(args.code)
    try:
        scope["launch"](listing_worker, args.dp, args.tp, args)
    except mp.ProcessExitedException as e:   # a rank's check failed (or it died): its exit code
        print(f"from_scratch: {e}", file=sys.stderr)
        return e.exit_code or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

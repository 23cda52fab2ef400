"""Seeded synthetic problems for verification and benchmarks: parameters, groups and per-rank gradients.

The same problem can be built whole (for the single-device reference) or TP-sharded for one rank
(for the distributed run), so the two can be compared element by element.

Gradients are drawn on a grid of multiples of 2**-12 with magnitudes below 2**3 (a rank's,
global gradient plus deviation, below 2**7 on up to 16 ranks): every sum of them that a step takes
is exact in fp32. So the DP average (sum, then divide by dp) is the same number
whatever order the backend adds in, and a difference between a distributed run and the
reference can only come from the optimizer, never from reduction order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..launch import forkable
from ..optim import hybrid_param_groups
from ..sharding import tp_shard

# The proof of concept's test shapes and TP split dims (-1: not split).
DEFAULT_SHAPES = [(100, 100), (124, 324), (456, 124), (676, 876), (128, 128)]
DEFAULT_TP_DIMS = [0, 1, -1, 1, 0]
# The community report's ~23M-parameter benchmark shapes.
REPORT_SHAPES = [(4096, 4096), (1024, 324), (456, 1024), (676, 876), (128, 128)]
REPORT_TP_DIMS = [0, 1, -1, 1, 0]
OPTIMIZERS = ("muon", "adamw", "hybrid")


def stack_shapes(layers: int = 12) -> tuple[list[tuple[int, int]], list[int]]:
    """A balanced transformer stack (d_model 512): per layer QKV 1536x512 and MLP-up 2048x512 split
    column-wise (rows, dim 0), the attention output 512x512 and MLP-down 512x2048 row-wise (dim 1)."""
    layer = [((1536, 512), 0), ((512, 512), 1), ((2048, 512), 0), ((512, 2048), 1)]
    return [s for _ in range(layers) for s, _ in layer], [d for _ in range(layers) for _, d in layer]


def default_tp_dims(n: int) -> list[int]:
    """The proof of concept's TP split dims for the first five shapes, -1 (not split) after that."""
    return (DEFAULT_TP_DIMS + [-1] * n)[:n]


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """'100x100,124x324,64' -> [(100, 100), (124, 324), (64,)]."""
    try:
        shapes = [tuple(int(d) for d in item.lower().split("x")) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"cannot read shapes {text!r}: write them like 100x100,124x324") from None
    if not shapes or any(d < 1 for s in shapes for d in s):
        raise ValueError(f"shapes {text!r}: every dimension must be a positive integer")
    return shapes


def parse_tp_dims(text: str) -> list[int]:
    """'0,1,none,1,0' -> [0, 1, -1, 1, 0]."""
    dims = []
    for item in text.split(","):
        item = item.strip().lower()
        dims.append(-1 if item in ("none", "-1", "") else int(item))
    return dims


def add_problem_args(parser, shapes: str | None = None, tp_dims: str | None = None) -> None:
    """The command-line arguments that describe a synthetic problem (shapes, TP dims, buckets, seed); ``shapes``
    and ``tp_dims`` (as typed on the command line) replace the proof of concept's defaults, help included."""
    from ..launch import arg_type
    from ..plan import DEFAULT_BUCKET_NUMEL

    parser.add_argument("--shapes", type=arg_type(parse_shapes),
                        default=DEFAULT_SHAPES if shapes is None else parse_shapes(shapes),
                        help="matrix shapes, e.g. 100x100,124x324 (default: "
                             + ("the proof of concept's five" if shapes is None else shapes) + ")")
    parser.add_argument("--tp-dims", type=arg_type(parse_tp_dims),
                        default=None if tp_dims is None else parse_tp_dims(tp_dims),
                        help=f"TP split dim per shape: 0, 1 or none (default: {tp_dims or '0,1,none,1,0'})")
    parser.add_argument("--bucket-numel", type=int, default=DEFAULT_BUCKET_NUMEL, help="elements per bucket")
    parser.add_argument("--seed", type=int, default=0)


def check_problem_args(parser, args, optimizer: str = "muon", n_groups: int = 1) -> None:
    """Fill in default TP dims and build the problem once, so bad input fails before any process starts."""
    if args.tp_dims is None:
        args.tp_dims = default_tp_dims(len(args.shapes))
    if args.bucket_numel < 1:
        parser.error("--bucket-numel must be at least 1")
    try:
        with forkable():  # the ranks are still forked from this process afterwards
            build_problem(optimizer, args.shapes, args.tp_dims, n_groups, args.seed, args.tp).param_groups(args.tp)
    except ValueError as e:
        parser.error(str(e))


def set_grads(param_groups: list[dict], grads: dict, grid) -> None:
    """Give a rank's optimizer groups its TP slice of ``grads`` (name -> full gradient, from ``Problem.grads``)."""
    for g in param_groups:
        for n, d, p in zip(g["names"], g["tp_split_dims"], g["params"]):
            p.grad = tp_shard(grads[n], d, grid.tp, grid.tp_rank, n).to(p.device)


@dataclass
class Problem:
    """Named full-size parameters in groups, with their TP split dims and hyperparameters."""

    groups: list[dict]                      # each: names, shapes, tp_split_dims, use_muon, hyper
    seed: int = 0
    full: dict = field(default_factory=dict)  # name -> full fp32 tensor

    def param_groups(self, tp: int = 1, tp_rank: int = 0, device=None) -> list[dict]:
        """Optimizer groups of fresh ``nn.Parameter``s on ``device``: whole (tp=1) or this TP rank's shards.
        Each call copies (a row shard would otherwise be a view of ``self.full``, shared by every optimizer
        built from the problem, and each optimizer's step starts from its parameters' current values)."""
        out = []
        for g in self.groups:
            params = [torch.nn.Parameter(tp_shard(self.full[n], d, tp, tp_rank, n).to(device, copy=True))
                      for n, d in zip(g["names"], g["tp_split_dims"])]
            out.append(dict(g["hyper"], params=params, names=list(g["names"]),
                            tp_split_dims=list(g["tp_split_dims"]), use_muon=g["use_muon"]))
        return out

    def _draw(self, step: int, stream: int) -> dict:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 1_009 + stream)
        return {n: (torch.randn(self.full[n].shape, generator=gen) * 2**10).round_().clamp_(-2**15 + 1, 2**15 - 1)
                .div_(2**12) for g in self.groups for n in g["names"]}

    def grads(self, step: int, dp_rank: int, dp: int = 1) -> dict:
        """DP rank ``dp_rank``'s full gradients at ``step``, of ``dp`` ranks: the step's global gradient
        plus a deviation of this rank's that sums to exactly zero over the ``dp`` ranks (dyadic, see the
        module docstring). So every rank sees other numbers, but their average, the gradient the
        optimizer steps with, is the same on every grid: a run resumed on another grid continues the
        same trajectory."""
        grads = self._draw(step, 0)
        if dp == 1:
            return grads
        if dp_rank < dp - 1:
            deviation = self._draw(step, 1 + dp_rank)
        else:
            others = [self._draw(step, 1 + r) for r in range(dp - 1)]
            deviation = {n: -sum(o[n] for o in others) for n in grads}
        return {n: g + deviation[n] for n, g in grads.items()}

    def mean_grads(self, step: int, dp: int) -> dict:
        """The DP average the reduce-scatter computes: the sum over ranks in order, divided by dp."""
        total = self.grads(step, 0, dp)
        for r in range(1, dp):
            for n, g in self.grads(step, r, dp).items():
                total[n] += g
        return {n: g / dp for n, g in total.items()}


def build_problem(optimizer: str, shapes=None, tp_dims=None, n_groups: int = 2, seed: int = 0,
                  tp: int = 1) -> Problem:
    """The verification problem: ``shapes`` as matrices in ``n_groups`` groups with different hyperparameters.

    "muon" and "adamw" put every matrix in Muon (or AdamW) groups. "hybrid" names them as hidden
    layers and adds what a real model has beside them: a bias per matrix (split with the matrix's
    rows, replicated otherwise) and a token embedding, then routes with ``hybrid_param_groups``.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {OPTIMIZERS}")
    shapes = list(shapes or DEFAULT_SHAPES)
    tp_dims = list(tp_dims if tp_dims is not None else default_tp_dims(len(shapes)))
    if len(tp_dims) != len(shapes):
        raise ValueError(f"{len(shapes)} shapes but {len(tp_dims)} TP split dims; give one per shape")
    gen = torch.Generator().manual_seed(seed)
    full, groups = {}, []
    if optimizer == "hybrid":
        named, dims = [], {}
        for i, (shape, d) in enumerate(zip(shapes, tp_dims)):
            for n, sh, dd in ((f"layers.{i}.weight", shape, d), (f"layers.{i}.bias", shape[:1], 0 if d == 0 else -1)):
                full[n] = torch.randn(sh, generator=gen) / shape[-1] ** 0.5
                named.append((n, full[n]))
                dims[n] = dd
        vocab = 264  # divides by 1, 2, 3, 4 and 8, so the embedding can be vocab-parallel on those grids
        full["embed.weight"] = torch.randn(vocab, 40, generator=gen)
        named.insert(0, ("embed.weight", full["embed.weight"]))
        dims["embed.weight"] = 0 if vocab % tp == 0 else -1
        for g in hybrid_param_groups(named, muon={"lr": 0.02}, adamw={"lr": 3e-3}):
            hyper = {k: v for k, v in g.items() if k not in ("params", "names", "use_muon")}
            groups.append(dict(names=g["names"], shapes=[tuple(full[n].shape) for n in g["names"]],
                               tp_split_dims=[dims[n] for n in g["names"]], use_muon=g["use_muon"], hyper=hyper))
    else:
        n_groups = max(1, min(n_groups, len(shapes)))
        per = -(-len(shapes) // n_groups)
        for g in range(n_groups):
            idx = range(g * per, min((g + 1) * per, len(shapes)))
            if not idx:
                continue
            names = [f"w{i}" for i in idx]
            for i in idx:
                full[f"w{i}"] = torch.randn(shapes[i], generator=gen) / shapes[i][-1] ** 0.5
            hyper = dict(lr=0.02 / (g + 1), weight_decay=0.1 * (g + 1)) if optimizer == "muon" else \
                dict(lr=3e-3 / (g + 1), weight_decay=0.1 * (g + 1))
            groups.append(dict(names=names, shapes=[shapes[i] for i in idx], tp_split_dims=[tp_dims[i] for i in idx],
                               use_muon=optimizer == "muon", hyper=hyper))
    return Problem(groups, seed, full)

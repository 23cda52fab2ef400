"""The step benchmark's models as parameters with gradients, and the step torch users run today (``step_bench.py``,
``stepcost``).

A benchmark model is a model of ``model_shapes.MODELS`` at some number of layers (``BENCH``): GPT-2 124M,
Llama-3.2-1B, and four layers of Llama-3-8B (its untied embedding and head: the stack chapter 13 prices). An
optimizer step needs only the shapes, so each is a list of parameters with gradients filled in; the Muon group is
``model_shapes``'s first group, AdamW's the second, and a parameter's TP split is its ``ParamSpec``'s (Megatron's:
the matrices that leave the residual stream colwise, split dim 0; the ones that return to it rowwise, 1; the
embeddings by vocabulary rows, 0; gains whole, -1).

    named = named_params("llama-1b", "meta")                  # [(name, nn.Parameter with .grad)]
    step = torch_hybrid(named)                                  # torch.optim.Muon + fused AdamW, as a user runs it
    opt = ours_hybrid(named, "meta")                            # DistributedMuon on one rank, as step_bench runs it
    named = named_params("llama-8b-4layers", "meta", tp=2)     # one TP rank's shards
    groups = hybrid_tp_groups("llama-8b-4layers", named, tp=2)  # DistributedMuon's groups, with tp_split_dims
"""
from __future__ import annotations

import torch

from . import model_shapes

# benchmark name -> (a key of model_shapes.MODELS, layers; None: all of them)
BENCH = {"gpt2-124m": ("gpt2-124m", None), "llama-1b": ("llama3.2-1b", None), "llama-8b-4layers": ("llama3-8b", 4)}


def specs(model: str, layers: int | None = None) -> tuple[list, list[bool]]:
    """(ParamSpec groups, muon flags) of benchmark ``model``; ``layers`` overrides its layer count."""
    if model not in BENCH:
        raise ValueError(f"unknown model {model!r}: choose from {', '.join(BENCH)}")
    name, bench_layers = BENCH[model]
    build, all_layers = model_shapes.MODELS[name]
    return build(layers or bench_layers or all_layers)


def named_params(model: str, device="meta", layers: int | None = None, seed: int = 0, tp: int = 1) -> list:
    """The model's parameters by name, each with a gradient; with ``tp`` > 1 one TP rank's shards. On ``meta``
    nothing is allocated; elsewhere values are small and random (seeded). Muon's matrices come first."""
    groups, _ = specs(model, layers)
    device = torch.device(device)
    gen = None if device.type == "meta" else torch.Generator(device=device).manual_seed(seed)

    def tensor(shape, scale):
        if device.type == "meta":
            return torch.empty(shape, device=device)
        return torch.randn(shape, device=device, generator=gen) * scale

    named = []
    for spec in (s for group in groups for s in group):
        shape = tuple(n // tp if d == spec.tp_split_dim and tp > 1 else n for d, n in enumerate(spec.full_shape))
        named.append((spec.name, torch.nn.Parameter(tensor(shape, 0.02) + (1 if len(shape) == 1 else 0))))
    for _, p in named:
        p.grad = tensor(p.shape, 1e-3)
    return named


def is_muon(name: str, p: torch.Tensor) -> bool:
    """Whether a benchmark parameter is in the Muon group (a matrix that is neither an embedding nor the head)."""
    return p.ndim == 2 and not name.startswith(("embed", "head"))


def hybrid_tp_groups(model: str | None, named, tp: int = 1, muon: dict | None = None, adamw: dict | None = None) -> list:
    """DistributedMuon's Muon and AdamW groups for these parameters (lr 0.02 and 1e-3 unless given), with their
    names and, when ``tp`` > 1, their ``tp_split_dims`` (``named`` made by ``named_params(..., tp=tp)``)."""
    dims = {s.name: s.tp_split_dim for group in specs(model)[0] for s in group} if tp > 1 else None
    groups = []
    for use_muon, hyper in ((True, muon or {"lr": 0.02}), (False, adamw or {"lr": 1e-3})):
        mine = [(n, p) for n, p in named if is_muon(n, p) == use_muon]
        group = dict(hyper, use_muon=use_muon, params=[p for _, p in mine], names=[n for n, _ in mine])
        if dims is not None:
            group["tp_split_dims"] = [dims[n] for n, _ in mine]
        groups.append(group)
    return groups


def ours_hybrid(named, device):
    """``DistributedMuon`` on one rank, as ``step_bench.py`` measures it: the owner layout, Newton-Schulz batched
    by shape (the GPU's defaults), Muon lr 0.02 and AdamW 1e-3."""
    from ..distributed import DistributedMuon
    from ..grid import Grid

    return DistributedMuon(hybrid_tp_groups(None, named), Grid.single(device), layout="owner", ns_batch=True)


def torch_hybrid(named, lr: float = 0.02, adamw_lr: float = 1e-3, weight_decay: float = 0.1):
    """``torch.optim.Muon`` on the matrices and fused AdamW on the rest: what a user runs today on one GPU.
    AdamW is called as ``torch.optim.AdamW(fused=True)`` calls it (a step-count add, then ``_fused_adamw_``),
    because that class refuses parameters on ``meta``. Returns ``step()``."""
    mats = [p for n, p in named if is_muon(n, p)]
    rest = [p for n, p in named if not is_muon(n, p)]
    muon = torch.optim.Muon(mats, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
    exp_avg = [torch.zeros_like(p) for p in rest]
    exp_avg_sq = [torch.zeros_like(p) for p in rest]
    steps = [torch.zeros((), device=p.device) for p in rest]

    def step():
        muon.step()
        torch._foreach_add_(steps, 1)
        torch._fused_adamw_(rest, [p.grad for p in rest], exp_avg, exp_avg_sq, [], steps, lr=adamw_lr, beta1=0.9,
                            beta2=0.999, weight_decay=weight_decay, eps=1e-8, amsgrad=False, maximize=False)
    return step

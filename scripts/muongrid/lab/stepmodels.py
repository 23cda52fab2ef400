"""Real models' optimizer shapes, and the step torch users run today, for ``step_bench.py`` and ``stepcost``.

Each model is its parameter shapes only (an optimizer step does not need the model): per layer the
matrices that Muon takes, one norm gain, and once the embedding (and an untied head); gradients are
filled in, so a step can run. Shapes are the published configurations': GPT-2 124M (fused QKV 768 x 2304,
MLP 3072, vocabulary 50,257, tied head), Llama-3.2-1B (hidden 2048, 16 layers, 8 KV heads of 64, MLP 8192,
vocabulary 128,256, tied head) and four layers of Llama-3-8B (hidden 4096, 8 KV heads of 128, MLP 14,336,
its untied embedding and head), the stack chapter 13 prices.

    named = named_params("llama-1b", "meta")            # [(name, nn.Parameter with .grad)]
    step = torch_hybrid(named)                            # torch.optim.Muon + fused AdamW, as a user runs it
    named = named_params("llama-8b-4layers", "meta", tp=2)   # one TP rank's shards (Megatron's split)
    groups = hybrid_tp_groups("llama-8b-4layers", named, tp=2)   # DistributedMuon's groups, with tp_split_dims

Under tensor parallelism a layer's matrices are split as Megatron splits them: the first ones of a block (GPT-2's
fused QKV and MLP up; Llama's q, k, v, gate, up) by rows (colwise, ``tp_split_dim`` 0), the ones that return
to the residual stream (attention out, MLP down) by columns (rowwise, 1); embeddings and the head by vocabulary
rows (0); norm gains whole (-1).
"""
from __future__ import annotations

import torch

ROWWISE = {"gpt2-124m": {1, 3}, "llama-1b": {3, 6}, "llama-8b-4layers": {3, 6}}   # per-layer matrices split by column

MODELS = {
    # name: (layers, per-layer Muon matrices (rows, cols), embedding-like tensors once)
    "gpt2-124m": (12, [(2304, 768), (768, 768), (3072, 768), (768, 3072)], [(50257, 768), (1024, 768)]),
    "llama-1b": (16, [(2048, 2048), (512, 2048), (512, 2048), (2048, 2048), (8192, 2048), (8192, 2048),
                      (2048, 8192)], [(128256, 2048)]),
    "llama-8b-4layers": (4, [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096), (14336, 4096),
                             (14336, 4096), (4096, 14336)], [(128256, 4096), (128256, 4096)]),
}


def tp_split_dim(model: str, name: str) -> int:
    """How tensor parallelism splits parameter ``name`` of ``model`` (see the module docstring)."""
    if name.startswith("embed"):
        return 0
    if name.endswith("norm.weight"):
        return -1
    return 1 if int(name.split(".w")[1].split(".")[0]) in ROWWISE.get(model, ()) else 0   # unknown: colwise


def named_params(model: str, device="meta", layers: int | None = None, seed: int = 0, tp: int = 1) -> list:
    """The model's parameters by name (``layers`` overrides the layer count), each with a gradient; with ``tp``
    > 1 one TP rank's shards (``tp_split_dim``). On ``meta`` nothing is allocated; elsewhere values are small and
    random (seeded)."""
    n_layers, mats, others = MODELS[model]
    device = torch.device(device)
    gen = None if device.type == "meta" else torch.Generator(device=device).manual_seed(seed)

    def tensor(*shape, scale=0.02, dim=-1):
        if dim != -1 and tp > 1:
            shape = tuple(n // tp if d == dim else n for d, n in enumerate(shape))
        if device.type == "meta":
            return torch.empty(shape, device=device)
        return torch.randn(shape, device=device, generator=gen) * scale

    named = []
    for layer in range(n_layers if layers is None else layers):
        for i, (r, c) in enumerate(mats):
            name = f"layers.{layer}.w{i}.weight"
            named.append((name, torch.nn.Parameter(tensor(r, c, dim=tp_split_dim(model, name)))))
        named.append((f"layers.{layer}.norm.weight", torch.nn.Parameter(tensor(mats[0][1]) + 1)))
    for i, (r, c) in enumerate(others):
        named.append((f"embed.{i}.weight", torch.nn.Parameter(tensor(r, c, dim=0))))
    for _, p in named:
        p.grad = tensor(*p.shape, scale=1e-3)
    return named


def hybrid_tp_groups(model: str, named, tp: int = 1, muon: dict | None = None, adamw: dict | None = None) -> list:
    """``hybrid_param_groups`` for these parameters (Muon lr 0.02, AdamW 1e-3 unless given), each group with its
    ``tp_split_dims`` when ``tp`` > 1 (``named`` made by ``named_params(..., tp=tp)``)."""
    from ..optim import hybrid_param_groups

    groups = hybrid_param_groups(named, muon=muon or {"lr": 0.02}, adamw=adamw or {"lr": 1e-3})
    if tp > 1:
        for g in groups:
            g["tp_split_dims"] = [tp_split_dim(model, n) for n in g["names"]]
    return groups


def is_muon(name: str, p: torch.Tensor) -> bool:
    return p.ndim == 2 and not name.startswith("embed")


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

"""What one rank stores to train a model, by parallel strategy and optimizer: a closed-form calculator.

Per parameter, with mixed precision (the usual LLM setting, as in the ZeRO paper):

    parameters  bf16      2 bytes
    gradients   bf16      2 bytes
    master      fp32      4 bytes   (the copy the optimizer updates)
    AdamW       fp32 x 2  8 bytes   (exp_avg, exp_avg_sq)
    Muon        fp32 x 1  4 bytes   (momentum)

and in plain fp32 (what this book's scripts use): parameters 4, gradients 4, no separate master,
AdamW 8, Muon 4. Tensor and pipeline parallelism split the model itself (every quantity divided by
``tp * pp``); then ZeRO stage 1 shards the optimizer state (master included) over ``dp``, stage 2
also the gradients, stage 3 (FSDP) also the parameters.

Left out, and said so in the book: activations (they depend on batch and sequence length),
temporary buffers, and Muon's transient gather of whole matrices during its step.
"""
from __future__ import annotations

STRATEGIES = {  # name -> (zero stage, description)
    "DP": (0, "every rank holds everything"),
    "ZeRO-1": (1, "optimizer state sharded over DP"),
    "ZeRO-2": (2, "optimizer state and gradients sharded"),
    "ZeRO-3 / FSDP": (3, "parameters too; gathered layer by layer when needed"),
}
STATE_BYTES = {"adamw": 8, "muon": 4}


def per_rank_bytes(n_params: float, optimizer: str = "adamw", zero: int = 0, dp: int = 1, tp: int = 1,
                   pp: int = 1, mixed_precision: bool = True) -> dict:
    """Bytes per rank for parameters, gradients, master weights and optimizer state."""
    if optimizer not in STATE_BYTES:
        raise ValueError(f"optimizer must be one of {sorted(STATE_BYTES)}")
    if zero not in (0, 1, 2, 3):
        raise ValueError("zero stage must be 0, 1, 2 or 3")
    local = n_params / (tp * pp)
    param_b, grad_b, master_b = (2, 2, 4) if mixed_precision else (4, 4, 0)
    out = dict(params=local * param_b / (dp if zero >= 3 else 1),
               grads=local * grad_b / (dp if zero >= 2 else 1),
               master=local * master_b / (dp if zero >= 1 else 1),
               optimizer_state=local * STATE_BYTES[optimizer] / (dp if zero >= 1 else 1))
    out["total"] = sum(out.values())
    return out

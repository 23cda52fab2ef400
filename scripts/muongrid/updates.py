"""The optimizer math as pure, in-place tensor functions, shared by every optimizer class (chapters 1 and 5).

Single-device and distributed optimizers call exactly these functions, on whole tensors or on shards, so
"distributed gives the same answer" reduces to "the same elementwise ops ran on the same numbers". Nothing here
knows about process groups. The conventions are ``torch.optim.Muon``'s and ``torch.optim.AdamW``'s (torch 2.13),
so the two agree bit for bit: Muon momentum is the EMA form ``buf = mu*buf + (1-mu)*g`` (Moonshot's sum form is it
times ``1/(1-mu)``, the same update after Newton-Schulz's normalisation); weight decay is decoupled, with the
unadjusted lr (``p *= 1 - lr*wd``); ``adjust_lr`` rescales Muon's lr per matrix.

Each function has a ``_foreach_`` twin over lists of tensors: one dispatched op per pass instead of one per tensor
(on a CPU torch runs it tensor by tensor with the same kernel, so the bits are the loop's). ``keep`` (a 0-dim
bool on the device, or None) makes a step that may be skipped with no host read (``finite.py``'s "defer"): where
it is False nothing changes. AdamW's twin runs torch's fused kernel off the CPU (on a CPU it rounds one ulp away
from ``torch.optim.AdamW``'s default path, so there it loops ``adamw_step_``).
"""
from __future__ import annotations

import math

import torch

LR_ADJUSTMENTS = ("match_rms_adamw", "original", "none")


def adjust_lr(lr, shape: tuple[int, ...], mode: str = "match_rms_adamw"):
    """Per-matrix Muon learning rate for a matrix of full (unsharded) ``shape`` = (A, B).

    "match_rms_adamw": lr * 0.2 * sqrt(max(A, B)) (Moonshot: an update RMS of about 0.2, like AdamW's).
    "original": lr * sqrt(max(1, A/B)) (Keller Jordan). "none": lr unchanged. ``lr`` may be a float64 0-dim
    tensor (``capturable=True``): the same products in the same order, so the same double, on the device.
    """
    A, B = shape[0], shape[1]
    if mode == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(A, B))
    if mode == "original":
        return lr * math.sqrt(max(1.0, A / B))
    if mode == "none":
        return lr
    raise ValueError(f"unknown lr adjustment {mode!r}; choose one of {LR_ADJUSTMENTS}")


def lr_key(shape: tuple[int, ...], mode: str = "match_rms_adamw"):
    """What ``adjust_lr``'s result depends on besides lr: shapes with equal keys get equal scaled lrs."""
    A, B = shape[0], shape[1]
    return (mode, max(A, B) if mode == "match_rms_adamw" else max(1.0, A / B) if mode == "original" else None)


def _decay(keep: torch.Tensor, lr_wd, like: torch.Tensor) -> torch.Tensor:
    """``1 - lr*wd`` where ``keep``, else 1: a device scalar in at least fp32 (as a Python number is applied)."""
    dtype = torch.promote_types(like.dtype, torch.float32)
    if isinstance(lr_wd, torch.Tensor):
        return torch.where(keep, (1 - lr_wd).to(dtype), 1.0)
    return torch.where(keep, torch.full((), 1 - lr_wd, dtype=dtype, device=keep.device), 1.0)


def _as(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A float64 hyperparameter tensor in the precision a Python number is applied in to ``like`` (a scalar
    argument is rounded to the tensor's floating type: fp32 for fp32 and bf16 tensors, fp64 for fp64 ones)."""
    return value.to(torch.promote_types(like.dtype, torch.float32))


def _kept(keep: torch.Tensor | None, grad: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    return grad if keep is None else torch.where(keep, grad, buf)


def muon_momentum_(buf: torch.Tensor, grad: torch.Tensor, momentum: float, nesterov: bool,
                   keep: torch.Tensor | None = None) -> torch.Tensor:
    """Update the momentum buffer in place and return the matrix to orthogonalise.

    Elementwise, so it runs unchanged on a whole matrix or on any flat shard of it.
    """
    grad = _kept(keep, grad, buf)
    buf.lerp_(grad, 1 - momentum)
    return grad.lerp(buf, momentum) if nesterov else buf


def muon_momentum_foreach_(bufs: list, grads: list, momentum: float,
                           nesterov: bool, keep: torch.Tensor | None = None) -> list:
    """``muon_momentum_`` on lists of tensors (each buffer with its gradient);
    returns the matrices (or pieces) to orthogonalise: new tensors with Nesterov,
    the buffers themselves without."""
    if not bufs:
        return []
    grads = [_kept(keep, g, b) for g, b in zip(grads, bufs)]
    if isinstance(momentum, torch.Tensor):   # capturable=True
        return _momentum_on_device_(bufs, grads, momentum, nesterov)
    torch._foreach_lerp_(bufs, grads, 1 - momentum)
    return torch._foreach_lerp(grads, bufs, momentum) if nesterov else list(bufs)


def apply_update_(param: torch.Tensor, update: torch.Tensor, lr: float, weight_decay: float,
                  scaled_lr: float, keep: torch.Tensor | None = None) -> None:
    """Decoupled weight decay with ``lr``, then ``param -= scaled_lr * update`` (in place)."""
    if keep is not None:
        param.mul_(_decay(keep, lr * weight_decay, param))
        param.add_(torch.where(keep, update, 0), alpha=-scaled_lr)
        return
    param.mul_(1 - lr * weight_decay)
    param.add_(update, alpha=-scaled_lr)


def apply_update_foreach_(params: list, updates: list, lr: float, weight_decay: float,
                          scaled_lr: float, keep: torch.Tensor | None = None) -> None:
    """``apply_update_`` on lists (one ``scaled_lr`` for all: the pieces of matrices
    of one shape). Without weight decay the multiplication by 1 is left out (it
    changes no bit)."""
    if not params:
        return
    if isinstance(lr, torch.Tensor):   # capturable=True
        return _apply_on_device_(params, updates, lr, weight_decay, scaled_lr, keep)
    decay = 1 - lr * weight_decay
    if keep is not None:   # a step that may be skipped: finite updates, x * 0 is 0
        updates = torch._foreach_mul(updates, keep.to(updates[0].dtype))
        decay = _decay(keep, lr * weight_decay, params[0])
    if lr * weight_decay != 0:
        torch._foreach_mul_(params, decay)
    torch._foreach_add_(params, updates, alpha=-scaled_lr)


def _momentum_on_device_(bufs: list, grads: list, momentum: torch.Tensor, nesterov: bool) -> list:
    """``muon_momentum_foreach_`` with a float64 0-dim ``momentum`` (``capturable=True``): the weights as device
    scalars in the buffers' precision (one per tensor, for the List overload), which round as the Python numbers do
    (tests/test_capturable.py)."""
    torch._foreach_lerp_(bufs, grads, [_as(1 - momentum, bufs[0])] * len(bufs))
    if not nesterov:
        return list(bufs)
    return torch._foreach_lerp(grads, bufs, [_as(momentum, bufs[0])] * len(bufs))


def _apply_on_device_(params: list, updates: list, lr: torch.Tensor, weight_decay: torch.Tensor,
                      scaled_lr: torch.Tensor, keep: torch.Tensor | None) -> None:
    """``apply_update_foreach_`` with float64 0-dim ``lr``, ``weight_decay`` and ``scaled_lr``
    (``capturable=True``). The decay always multiplies (x * 1 changes no bit, and the value is not known on
    the host); ``p + u * (-s)`` rounds as ``p.add_(u, alpha=-s)`` on the CPUs we checked."""
    if keep is not None:   # a step that may be skipped: finite updates, x * 0 is 0
        updates = torch._foreach_mul(updates, keep.to(updates[0].dtype))
        decay = _decay(keep, lr * weight_decay, params[0])
    else:
        decay = _as(1 - lr * weight_decay, params[0])
    torch._foreach_mul_(params, decay)
    torch._foreach_addcmul_(params, updates, [_as(-scaled_lr, params[0])] * len(params))


def _kept_step(step_, keep: torch.Tensor, param, grad, exp_avg, exp_avg_sq, *hyper) -> None:
    """``step_`` (an AdamW step), then the old values put back where the step is not ``keep``."""
    tensors = (param, exp_avg, exp_avg_sq)
    old = [t.clone() for t in tensors]
    step_(param, grad, exp_avg, exp_avg_sq, *hyper)
    for t, o in zip(tensors, old):
        t.copy_(torch.where(keep, t, o))


def adamw_step_(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                exp_avg_sq: torch.Tensor, step: int, lr: float, betas: tuple[float, float],
                eps: float, weight_decay: float, keep: torch.Tensor | None = None) -> None:
    """One AdamW step (``step`` counts from 1), in place, elementwise: whole tensor or shard."""
    if keep is not None:
        return _kept_step(adamw_step_, keep, param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, weight_decay)
    beta1, beta2 = betas
    param.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)


def adamw_tensor_step_(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                       step: torch.Tensor, lr: torch.Tensor, betas: tuple, eps: float, weight_decay: torch.Tensor,
                       keep: torch.Tensor | None = None) -> None:
    """``adamw_step_`` with float64 0-dim ``lr``, ``weight_decay`` and ``betas`` and a 0-dim step (``capturable=True``).
    Every product, power and quotient is ``adamw_step_``'s, in float64 on the device, a scalar argument a tensor
    factor where the kernel rounds alike, so on a CPU the bits are ``adamw_step_``'s (``tests/test_capturable.py``).
    ``eps`` stays a number. The powers are taken one 0-dim tensor at a time (a vectorised ``pow`` rounds
    differently from the C library's)."""
    if keep is not None:
        return _kept_step(adamw_tensor_step_, keep, param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps,
                          weight_decay)
    beta1, beta2 = betas
    step = step.to(torch.float64)
    param.mul_(_as(1 - lr * weight_decay, param))
    exp_avg.lerp_(grad, _as(1 - beta1, exp_avg))
    exp_avg_sq.mul_(_as(beta2, exp_avg_sq)).addcmul_(grad * _as(1 - beta2, grad), grad)
    bias_correction1 = 1 - torch.pow(beta1, step)
    bias_correction2_sqrt = torch.pow(1 - torch.pow(beta2, step), torch.full_like(step, 0.5))   # pow, not sqrt
    denom = (exp_avg_sq.sqrt() / _as(bias_correction2_sqrt, exp_avg_sq)).add_(eps)
    param.addcdiv_(exp_avg * _as(-lr / bias_correction1, exp_avg), denom)


def adamw_foreach_(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list, lr: float,
                   betas: tuple[float, float], eps: float, weight_decay: float, fused: bool | None = None,
                   keep: torch.Tensor | None = None) -> None:
    """``adamw_step_`` on lists; ``steps`` holds each tensor's step (Python numbers). Off the CPU, one fused
    kernel, each step a device scalar made by a fill (no host-to-device copy). ``fused`` forces either path (None:
    fused off the CPU; the tests run the fused path on a CPU, tests/test_precision.py)."""
    if not params:
        return
    if isinstance(lr, torch.Tensor):   # capturable=True: device scalars, tensor by tensor
        for p, g, m, v, s in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
            adamw_tensor_step_(p, g, m, v, s, lr, betas, eps, weight_decay, keep)
        return
    device = params[0].device
    if not (device.type != "cpu" if fused is None else fused):
        for p, g, m, v, s in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
            adamw_step_(p, g, m, v, s, lr, betas, eps, weight_decay, keep)
        return
    made = {s: torch.full((), float(s), device=device) for s in dict.fromkeys(steps)}   # one per distinct count
    device_steps = [made[s] for s in steps]
    torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], device_steps, lr=lr, beta1=betas[0],
                        beta2=betas[1], weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=False,
                        found_inf=None if keep is None else (~keep).float())   # 1: the kernel changes nothing

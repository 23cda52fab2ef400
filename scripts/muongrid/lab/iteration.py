"""The whole training iteration of a DDP user's options and of ours, run side by side: timed, broken down, counted.

A DDP user can shard Muon with torch alone. One job builds every option below from the same seed, gives each the
same batches (rank r takes its rows of each global batch) and runs them interleaved, one iteration each in turn
(the order rotating), so a busy moment of the machine falls on all of them alike:

    torch    DDP + torch.optim.Muon on the hidden matrices + torch.optim.AdamW on the rest (embeddings, the head,
             vectors: ``hybrid_param_groups``' routing, as ours): every rank steps every parameter
    zero     DDP + ZeroRedundancyOptimizer(torch.optim.Muon) + ZeroRedundancyOptimizer(torch.optim.AdamW): each
             whole parameter has an owner, which steps it and broadcasts it
    ddp      DDP + DistributedMuon(groups, grid, grad_reduce="ddp") (the aligned layout: step() reduces nothing,
             orthogonalises each whole matrix on the rank whose shard holds it, and all-gathers the parameters)
    bucket, owner, aligned, group    DistributedMuon(groups, grid, layout=...) on the bare model (no DDP)
    backward DistributedMuon(groups, grid, grad_reduce="backward") on the bare model: the owner layout, its
             gradient reduce-scatters launched from backward as each bucket's gradients land (``reducer.py``)

Each iteration is timed in parts (forward, backward, step), and the step inside (``Clock``): Newton-Schulz
(torch's kernel wrapped where torch.optim.Muon looks it up; our flows' ``newton_schulz`` on the optimizer's own
flow), ZeRO's parameter broadcast (its ``_sync_params``), and our ledger's seconds per phase (gradient
reduce-scatter, the exchange, the parameter all-gather, and the presence and NaN/Inf ballot, phase "contract":
the first collective of our step, where a rank waits for the slowest one's backward). DDP reduces under backward, so two probes after each run
say what that costs: the same backward under ``no_sync()`` (no reduction; the difference is what DDP adds to
backward: the reduction it leaves exposed, and its copies into and out of its buckets) and DDP's buckets
all-reduced alone (the whole reduction); ``backward`` gets the first probe too (its optimizer's ``no_sync()``),
and its reduction is the ledger's seconds in launching and waiting. One iteration per option, set
apart and untimed, is counted (``c10d_count.C10dCounter``: every collective, DDP's and ZeRO's too).

Models are built from configs (``transformers``, no download): a Llama, and GPT-2 (tied embeddings). The report
is ``iteration_report.py``; the entry point ``scripts/iteration_bench.py``.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.optim._muon as torch_muon
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from ..comm import Comm
from ..devices import Span
from ..distributed import DistributedMuon
from ..ledger import seconds as ledger_seconds
from ..newton_schulz import native_bf16_matmul, ns5_flops, zeropower_ns5
from ..optim import hybrid_param_groups
from .c10d_count import C10dCounter

# Our options: DistributedMuon's keywords for each (an option to add, e.g. a new grad_reduce, is one line here;
# iteration_report prices each by its layout). "ddp" is ours under DDP; the others run on the bare model.
OURS_KWARGS = dict(bucket=dict(layout="bucket"), owner=dict(layout="owner"), aligned=dict(layout="aligned"),
                   group=dict(layout="group"), backward=dict(layout="owner", grad_reduce="backward"))
DDP_KWARGS = dict(ddp=dict(grad_reduce="ddp"))
OURS = tuple(OURS_KWARGS)
VARIANTS = ("torch", "zero", *DDP_KWARGS, *OURS)
HYPER = dict(muon=dict(lr=0.02, weight_decay=0.01, momentum=0.95, nesterov=True),
             adamw=dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01))
EXCHANGE = ("ns_gather_dp", "ns_gather_tp", "ns_to_owner", "ns_from_owner")   # ns_group_gram runs inside NS


def build_model(kind: str, hidden: int, layers: int, vocab: int, seq: int, seed: int) -> torch.nn.Module:
    """A Llama (untied, MLP 2 x hidden, 4 heads, as many key-value heads) or GPT-2 (tied, no dropout), seeded."""
    import transformers
    transformers.logging.set_verbosity_error()   # its notes on configs built without a tokenizer
    torch.manual_seed(seed)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                                            max_position_embeddings=seq, tie_word_embeddings=False,
                                            bos_token_id=0, eos_token_id=0))
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=hidden, n_layer=layers,
                                          n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                          bos_token_id=0, eos_token_id=0))
    raise ValueError(f"unknown model {kind!r}: llama or gpt2")


class Clock:
    """Named intervals of one iteration (CUDA events on a GPU, read when the iteration ends), and NS counts."""

    active: "Clock | None" = None   # whose step is running: torch's Newton-Schulz wrapper charges it

    def __init__(self, device: torch.device):
        self.device, self.spans, self.ns_calls, self.ns_flops = device, {}, 0, 0

    @contextmanager
    def span(self, name: str):
        span = Span(self.device)
        try:
            yield
        finally:
            self.spans.setdefault(name, []).append(span.stop())

    def take(self) -> dict:
        out = {k: sum(s.seconds() for s in v) for k, v in self.spans.items()}
        out.update(ns_calls=self.ns_calls, ns_flops=self.ns_flops)
        self.spans, self.ns_calls, self.ns_flops = {}, 0, 0
        return out

    def wrap(self, obj, attr: str, name: str) -> None:
        """Time every call of ``obj.attr`` under ``name`` (an instance attribute shadows the method)."""
        inner = getattr(obj, attr)

        def timed(*a, **k):
            with self.span(name):
                return inner(*a, **k)
        setattr(obj, attr, timed)


def install_torch_ns(kernel: str, device: torch.device) -> str:
    """Wrap torch.optim.Muon's Newton-Schulz (it looks the function up in its module at each call): time and count
    it for ``Clock.active``. ``kernel``: "torch" (its own), "ours" (``zeropower_ns5``: the same bf16 rounding, in
    fp32 matmuls where bf16 ones are not native) or "auto" (torch's where bf16 matmuls are native). Returns which."""
    if kernel == "auto":
        kernel = "torch" if native_bf16_matmul(device) else "ours"
    inner = getattr(torch_muon._zeropower_via_newtonschulz, "__wrapped__", torch_muon._zeropower_via_newtonschulz)
    run = inner if kernel == "torch" else (lambda g, coefficients, steps, eps: zeropower_ns5(g, steps, coefficients, eps))

    def newton_schulz(grad, ns_coefficients, ns_steps, eps):
        clock = Clock.active
        if clock is None:
            return run(grad, ns_coefficients, ns_steps, eps)
        clock.ns_calls += 1
        clock.ns_flops += ns5_flops(*grad.shape, ns_steps)
        with clock.span("newton_schulz"):
            return run(grad, ns_coefficients, ns_steps, eps)
    newton_schulz.__wrapped__ = inner
    torch_muon._zeropower_via_newtonschulz = newton_schulz
    return kernel


@dataclass
class Variant:
    name: str
    model: torch.nn.Module               # what runs forward: the DDP wrapper or the bare model
    module: torch.nn.Module              # the model itself
    optimizers: list
    clock: Clock
    groups: list = field(default_factory=list)   # the parameter groups (the routing), for the cost model
    ddp: DDP | None = None
    ours: object = None                  # the DistributedMuon, if any

    @property
    def reduces_in_backward(self) -> bool:
        return self.ddp is not None or getattr(self.ours, "grad_reduce", "step") == "backward"

    def no_sync(self):
        """Backward without its reduction: DDP's ``no_sync()``, or our optimizer's under grad_reduce="backward"."""
        return self.ddp.no_sync() if self.ddp is not None else self.ours.no_sync()

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)


def make_variant(name: str, module: torch.nn.Module, grid, timeout: float) -> Variant:
    """Option ``name`` of ``VARIANTS`` around ``module`` (on the grid's device)."""
    clock = Clock(grid.device)
    groups = hybrid_param_groups(module, muon=HYPER["muon"], adamw=HYPER["adamw"])
    muon = [g for g in groups if g["use_muon"]]
    rest = [g for g in groups if not g["use_muon"]]
    ids = [grid.device.index] if grid.device.type == "cuda" else None
    if name in OURS_KWARGS or name in DDP_KWARGS:
        extra = {**OURS_KWARGS, **DDP_KWARGS}[name]
        opt = DistributedMuon(groups, grid, comm=Comm(grid, timeout_s=timeout, time_device=True), **extra)
        clock.wrap(opt.flow, "newton_schulz", "newton_schulz")
        if hasattr(opt.flow, "_group_ns"):   # the group layout's own Newton-Schulz (its collectives inside)
            clock.wrap(opt.flow, "_group_ns", "newton_schulz")
        ddp = DDP(module, device_ids=ids) if name in DDP_KWARGS else None
        return Variant(name, ddp or module, module, [opt], clock, groups, ddp, opt)
    ddp = DDP(module, device_ids=ids)
    muon_params, rest_params = [p for g in muon for p in g["params"]], [p for g in rest for p in g["params"]]
    if name == "torch":
        opts = [torch.optim.Muon(muon_params, adjust_lr_fn="match_rms_adamw", **HYPER["muon"]),
                torch.optim.AdamW(rest_params, **HYPER["adamw"])]
    elif name == "zero":
        opts = [ZeroRedundancyOptimizer(muon_params, optimizer_class=torch.optim.Muon,
                                        adjust_lr_fn="match_rms_adamw", **HYPER["muon"]),
                ZeroRedundancyOptimizer(rest_params, optimizer_class=torch.optim.AdamW, **HYPER["adamw"])]
        for z in opts:
            clock.wrap(z, "_sync_params", "param_gather")
    else:
        raise ValueError(f"unknown variant {name!r}: one of {VARIANTS}")
    return Variant(name, ddp, module, opts, clock, groups, ddp)


def now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def iterate(v: Variant, x: torch.Tensor, counter: C10dCounter | None = None) -> dict:
    """One training iteration of ``v`` on token rows ``x``: its parts' seconds, the loss, NS counts."""
    device = v.clock.device

    def stage(name):
        if counter is not None:
            counter.stage = name
        return now(device)
    t0 = stage("forward")
    loss = v.model(input_ids=x, labels=x, use_cache=False).loss
    t1 = stage("backward")
    loss.backward()
    t2 = stage("step")
    Clock.active = v.clock
    try:
        for opt in v.optimizers:
            opt.step()
    finally:
        Clock.active = None
    t3 = stage("zero_grad")
    v.zero_grad()
    t4 = now(device)
    out = dict(forward=t1 - t0, backward=t2 - t1, step=t3 - t2, whole=t4 - t0, loss=loss.item(), **v.clock.take())
    if v.ours is not None:
        ledger = v.ours.comm.ledger
        s = ledger.summary()
        phases = {k: p["seconds"] for k, p in s["phases"].items()}
        out.update(reduction=phases.get("grad_reduce_scatter", 0.0), param_gather=phases.get("param_all_gather", 0.0),
                   exchange=sum(phases.get(k, 0.0) for k in EXCHANGE), ns_calls=s["ns_calls"], ns_flops=s["ns_flops"],
                   ledger_bytes=s["bytes_sent"], ledger_calls=sum(p["calls"] for p in s["phases"].values()),
                   reduction_bytes=s["phases"].get("grad_reduce_scatter", {}).get("bytes_sent", 0),
                   ballot=ballot_seconds(ledger, s["step"]))
    # the rest of the step: momentum, the update, copies, the NaN/Inf norms (a reduction from backward is not in it)
    inside = ("exchange", "newton_schulz", "param_gather", "ballot") + (() if v.reduces_in_backward else ("reduction",))
    out["update"] = out["step"] - sum(out.get(k, 0.0) for k in inside)
    return out


def ballot_seconds(ledger, step: int) -> float:
    """Seconds this rank spent in step ``step``'s ballot (phase "contract", ``contract.vote``), which a ledger summary
    leaves out. Our step's first collective, it waits there for the slowest rank to finish backward: on a shared
    machine that skew, hundreds of ms at times, is the ranks' and not the step's work (DDP absorbs it inside backward,
    in its all-reduce), so it is a part of its own, not "update"."""
    return sum(ledger_seconds(r) for r in ledger.records if r.step == step and r.phase == "contract")


def probe_no_sync(v: Variant, x: torch.Tensor) -> float:
    """Seconds of ``v``'s backward with its reduction off (``no_sync``); the gradients are dropped after."""
    device = v.clock.device
    with v.no_sync():
        loss = v.model(input_ids=x, labels=x, use_cache=False).loss
        t0 = now(device)
        loss.backward()
        t1 = now(device)
    v.zero_grad()
    return t1 - t0


def probe_reduction(buckets: list[torch.Tensor]) -> float:
    """Seconds to all-reduce DDP's gradient buckets (their sizes as counted) on their own: all started, then waited."""
    device = buckets[0].device
    t0 = now(device)
    for work in [dist.all_reduce(b, async_op=True) for b in buckets]:
        work.wait()
    return now(device) - t0

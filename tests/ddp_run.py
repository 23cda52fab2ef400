"""Run by tests/test_ddp.py under the launcher: ``DistributedMuon(..., grad_reduce="ddp")`` inside a
``DistributedDataParallel`` model, on gloo, against one process given the same gradients.

The model is small and uneven (matrices that do not divide by 2 or 3 ranks, a bias, an embedding and a head for
AdamW, one frozen matrix). Each rank trains on its own rows of a seeded batch through DDP; a reference on every
rank (``muongrid.MuonW``, the same hyperparameters and groups) steps a copy of the model with the gradients DDP
left in ``p.grad`` (the DP mean, the same on every rank). Cases, every one compared bit for bit after each step:

* ``plain``: 3 steps, ``gradient_as_bucket_view`` off and on; also every rank's parameters equal;
* ``accumulate``: two micro-batches per step, the first under ``ddp.no_sync()`` (DDP's accumulation);
* ``clip``: ``opt.clip_grad_norm_`` (the same norm as one process: the shards' partial sums) and torch's
  ``clip_grad_norm_`` on ``p.grad`` (DDP's mean: every rank alike), each against the reference clipped alike;
* ``scaler``: ``torch.amp.GradScaler`` drives the step (unscaling the averaged gradients, the same on every
  rank) and equals the plain run; an Inf gradient makes every rank skip that step;
* ``refused``: a DDP model with ``grad_reduce="step"`` (the reason and the keyword), ``grad_reduce="ddp"`` with
  no DDP (refused on every rank, nothing changed);
* ``shards``: ``muongrid.shard_files`` saves every rank's shard after step 2 and a fresh optimizer resumes from it
  bit for bit; another world's folder and a missing file are refused on every rank, nothing changed; then a
  ``muongrid.checkpoint`` save and load print no deprecation warning;
* ``zero`` (2 ranks): bytes each rank sends per step and Newton-Schulz FLOPs per rank (from the plan) against
  DDP + ``ZeroRedundancyOptimizer(torch.optim.Muon)`` + ``ZeroRedundancyOptimizer(torch.optim.AdamW)`` on the same
  tiny Llama (DDP's own all-reduce is the same on both sides and is left out), and both runs' losses.

Prints one JSON line (rank 0) with every rank's results.

    python tests/ddp_run.py --dp 2 --cases plain,accumulate,clip,scaler,refused,shards,zero --folder /tmp/x
"""
import argparse
import copy
import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from muongrid import DistributedMuon, MuonW
from muongrid.clipping import clip_grad_norm_ as reference_clip
from muongrid.launch import add_launch_args, launch

STEPS, ROWS = 3, 6   # rows of the batch per rank
HYPER = dict(lr=0.02, weight_decay=0.1, momentum=0.9)
ADAMW = dict(lr=3e-3, weight_decay=0.01, betas=(0.9, 0.95))


class Tiny(torch.nn.Module):
    """Uneven matrices (none divides by 2 or 3 evenly into shards), a frozen one, a bias, an embedding, a head."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(23, 13)
        self.a = torch.nn.Linear(13, 17)
        self.b = torch.nn.Linear(17, 11, bias=False)
        self.frozen = torch.nn.Linear(11, 11, bias=False)
        self.c = torch.nn.Linear(11, 19, bias=False)
        self.head = torch.nn.Linear(19, 23, bias=False)
        self.frozen.weight.requires_grad_(False)

    def forward(self, ids):
        x = self.embed(ids)
        x = torch.tanh(self.a(x))
        x = torch.tanh(self.frozen(self.b(x)))
        return self.head(torch.tanh(self.c(x)))


def groups(model) -> list[dict]:
    muon = [n for n in ("a.weight", "b.weight", "frozen.weight", "c.weight")]
    named = dict(model.named_parameters())
    adamw = [n for n in named if n not in muon]
    return [dict(params=[named[n] for n in muon], names=muon, use_muon=True, **HYPER),
            dict(params=[named[n] for n in adamw], names=adamw, use_muon=False, **ADAMW)]


def batch(step: int, rank: int, micro: int = 0):
    gen = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    ids = torch.randint(0, 23, (ROWS, 5), generator=gen)
    return ids, torch.randint(0, 23, (ROWS, 5), generator=gen)


def loss_of(model, ids, targets):
    return torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), targets.flatten())


def pair(bucket_view: bool = False):
    """A DDP model with a DDP-mode optimizer, and its reference: a copy with MuonW."""
    torch.manual_seed(0)
    model = Tiny()
    ref = copy.deepcopy(model)
    return model, DDP(model, gradient_as_bucket_view=bucket_view), ref, MuonW(groups(ref))


def give_reference(model, ref) -> None:
    """The reference's gradients: what DDP left in ``p.grad`` (the DP mean)."""
    for p, q in zip(model.parameters(), ref.parameters()):
        q.grad = None if p.grad is None else p.grad.detach().clone()


def same(model, ref) -> bool:
    return all(torch.equal(p.detach(), q.detach()) for p, q in zip(model.parameters(), ref.parameters()))


def fingerprint(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def train(grid, bucket_view=False, accumulate=False, clip=None, scaler=None, inf_at=None) -> dict:
    model, ddp, ref, ref_opt = pair(bucket_view)
    opt = DistributedMuon(groups(model), grid, grad_reduce="ddp")
    equal, skipped, norms_equal = [], [], []
    for step in range(1, STEPS + 1):
        if accumulate:
            with ddp.no_sync():
                loss_of(ddp, *batch(step, grid.rank, 1)).backward()
        loss = loss_of(ddp, *batch(step, grid.rank))
        (scaler.scale(loss) if scaler else loss).backward()
        if step == inf_at:   # after DDP averaged, on every rank alike: as if the mean overflowed
            model.c.weight.grad[0, 0] = float("inf")
        give_reference(model, ref)
        if scaler is not None:
            before = [p.detach().clone() for p in model.parameters()]
            scaler.step(opt)
            scaler.update()
            skipped.append(all(torch.equal(a, p.detach()) for a, p in zip(before, model.parameters())))
            if skipped[-1]:
                ref_opt.zero_grad()
                opt.zero_grad()
                equal.append(same(model, ref))
                continue
            give_reference(model, ref)   # GradScaler unscaled p.grad in place: the reference reads that
        if clip == "ours":
            norm = opt.clip_grad_norm_(0.01)
            norms_equal.append(bool(torch.equal(norm, reference_clip(list(ref.parameters()), 0.01))))
        elif clip == "torch":
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.01)
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.01)
        if scaler is None:
            opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        equal.append(same(model, ref))
    return dict(equal=equal, skipped=skipped, norms_equal=norms_equal, fingerprint=fingerprint(model),
                frozen_kept=torch.equal(model.frozen.weight, ref.frozen.weight))


def plain(grid) -> dict:
    return {"bucket_view_off": train(grid), "bucket_view_on": train(grid, bucket_view=True)}


def accumulate(grid) -> dict:
    return train(grid, accumulate=True)


def clip(grid) -> dict:
    return {"ours": train(grid, clip="ours"), "torch": train(grid, clip="torch")}


def scaler(grid) -> dict:
    scale = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    out = train(grid, scaler=scale)
    out["same_as_plain"] = out["fingerprint"] == train(grid)["fingerprint"]
    out["inf"] = train(grid, scaler=torch.amp.GradScaler("cpu", init_scale=2.0 ** 10), inf_at=2)
    return out


def refused(grid) -> dict:
    def first_step(model, net, grad_reduce):
        opt = DistributedMuon(groups(model), grid, grad_reduce=grad_reduce)
        loss_of(net, *batch(1, grid.rank)).backward()
        try:
            opt.step()
            return None
        except RuntimeError as e:
            return str(e)
    model, ddp, _, _ = pair()
    out = dict(step_mode=first_step(model, ddp, "step"))   # a DDP model, the default grad_reduce
    del ddp
    torch.manual_seed(0)
    bare = Tiny()
    before = [p.detach().clone() for p in bare.parameters()]
    out["no_ddp"] = first_step(bare, bare, "ddp")   # no DDP: each rank would step on its own gradient
    out["no_ddp_unchanged"] = all(torch.equal(a, p.detach()) for a, p in zip(before, bare.parameters()))
    return out


def tiny_llama():
    import transformers
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    return transformers.LlamaForCausalLM(cfg)


def llama_batch(step: int, rank: int):
    gen = torch.Generator().manual_seed(100 * step + rank)
    ids = torch.randint(0, 96, (4, 16), generator=gen)
    return dict(input_ids=ids, labels=ids)


def zero(grid) -> dict:
    """Our DDP mode against DDP + torch's ZeroRedundancyOptimizer on the same batches: bytes each rank sends
    in a step (ours: the ledger, every record of the step; ZeRO: its broadcasts, counted as they are called: on
    2 ranks a broadcast's root sends the tensor once, the other rank sends nothing) and Newton-Schulz FLOPs per
    rank (ours: the plan's owners; ZeRO: its partition of the Muon parameters)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from muongrid import hybrid_param_groups
    from muongrid.newton_schulz import ns5_flops

    muon_hyper = dict(lr=0.02, weight_decay=0.1, momentum=0.95)
    adamw_hyper = dict(lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
    model = tiny_llama()
    twin = copy.deepcopy(model)
    ddp = DDP(model)
    opt = DistributedMuon(hybrid_param_groups(model, muon=muon_hyper, adamw=adamw_hyper), grid, grad_reduce="ddp")
    theirs = DDP(twin)
    muon_params, adamw_params = (g["params"] for g in hybrid_param_groups(twin))
    zeros = [ZeroRedundancyOptimizer(muon_params, optimizer_class=torch.optim.Muon, adjust_lr_fn="match_rms_adamw",
                                     **muon_hyper),
             ZeroRedundancyOptimizer(adamw_params, optimizer_class=torch.optim.AdamW, **adamw_hyper)]
    sent, real_broadcast = [0], dist.broadcast

    def counting_broadcast(tensor, src, *a, **kw):
        if src == dist.get_rank():
            sent[0] += tensor.numel() * tensor.element_size()
        return real_broadcast(tensor, src, *a, **kw)

    losses = {"ours": [], "zero": []}
    for step in range(1, STEPS + 1):
        for name, net in (("ours", ddp), ("zero", theirs)):
            loss = net(**llama_batch(step, grid.rank)).loss
            loss.backward()
            losses[name].append(float(loss.detach()))
        opt.step()
        sent[0] = 0
        dist.broadcast = counting_broadcast
        try:
            for z in zeros:
                z.step()
        finally:
            dist.broadcast = real_broadcast
        opt.zero_grad()
        for z in zeros:
            z.zero_grad()
    ledger = opt.comm.ledger
    ours_sent = sum(r.bytes_sent for r in ledger.records if r.step == ledger.step)
    plan, muon_group = opt.plan, 0
    ours_flops = [0] * grid.dp
    for meta in plan.metas[muon_group]:
        ours_flops[plan.owner_of(meta)] += ns5_flops(*meta.full_shape)
    zero_flops = [sum(ns5_flops(*p.shape) for g in rank_groups for p in g["params"])
                  for rank_groups in zeros[0]._partition_parameters()]
    return dict(ours_sent=ours_sent, zero_sent=sent[0], ours_flops=ours_flops, zero_flops=zero_flops,
                phases=sorted({r.phase for r in ledger.records if r.step == ledger.step}),
                ns_flops_ledger=ledger.summary()["ns_flops"], losses=losses)


def shards(grid, folder) -> dict:
    """``muongrid.shard_files``: saved after step 2 and loaded into a fresh model and optimizer (the model's
    weights restored as a trainer restores them), step 3 ends bit for bit where the straight run ends; a folder
    of another world size and a missing file are refused on every rank, nothing changed."""
    import os
    from pathlib import Path

    from muongrid import shard_files
    folder = Path(folder) / "shards"
    model, ddp, _, _ = pair()
    opt = DistributedMuon(groups(model), grid, grad_reduce="ddp")
    weights = None
    for step in range(1, STEPS + 1):
        loss_of(ddp, *batch(step, grid.rank)).backward()
        opt.step()
        opt.zero_grad()
        if step == 2:
            shard_files.save(opt, folder, extra=dict(step=step))
            weights = {k: v.clone() for k, v in model.state_dict().items()}
    straight = [p.detach().clone() for p in model.parameters()]
    model, ddp, _, _ = pair()
    opt = DistributedMuon(groups(model), grid, grad_reduce="ddp")
    model.load_state_dict(weights)
    extra = shard_files.load(opt, folder)
    loss_of(ddp, *batch(3, grid.rank)).backward()
    opt.step()
    out = dict(extra=extra, resumed_equal=all(torch.equal(a, p) for a, p in zip(straight, model.parameters())),
               files=sorted(os.listdir(folder)))
    before = [t.clone() for t in opt.state_dict()["state"][0].values() if isinstance(t, torch.Tensor)]
    for name, damage in (("other_world", "world"), ("missing", "missing")):
        bad = folder.parent / name
        if grid.rank == 0:
            bad.mkdir()
            for f in os.listdir(folder):
                if damage == "world":
                    (bad / f.replace(f"-of-{grid.dp}", "-of-4")).write_bytes((folder / f).read_bytes())
                elif f != shard_files.file_name(1, grid.dp):
                    (bad / f).write_bytes((folder / f).read_bytes())
        dist.barrier()
        try:
            shard_files.load(opt, bad)
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    after = [t for t in opt.state_dict()["state"][0].values() if isinstance(t, torch.Tensor)]
    out["refusals_changed_nothing"] = all(torch.equal(a, b) for a, b in zip(before, after))
    import warnings

    from muongrid import checkpoint
    with warnings.catch_warnings(record=True) as seen:   # DCP's ShardedTensor notice is muongrid.checkpoint's own
        warnings.simplefilter("always")
        checkpoint.save(opt, folder.parent / "dcp", step=3)
        checkpoint.load(opt, folder.parent / "dcp")
    out["dcp_warnings"] = [f"{w.category.__name__}: {w.message}"[:200] for w in seen
                           if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    return out


def worker(grid, comm, args):
    torch.set_num_threads(1)
    out = {}
    for case in args.cases.split(","):
        out[case] = shards(grid, args.folder) if case == "shards" else globals()[case](grid)
    everyone = comm.gather_objects(out, "report")
    if grid.rank == 0:
        print(json.dumps(dict(world=grid.dp * grid.tp, ranks=everyone)), flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_launch_args(p)
    p.add_argument("--cases", default="plain,accumulate,clip,scaler,refused")
    p.add_argument("--folder", default=None, help="a fresh folder for the shards case")
    sys.exit(launch(worker, p.parse_args()))

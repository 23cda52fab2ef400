"""Run by tests/test_hf_models.py under the launcher: small `transformers` models (random weights, built from
configs, no download) trained for a few steps under DistributedMuon (ZeRO-1, layout "owner") or FSDPMuon
(``fully_shard`` per decoder layer, then the root), each against single-device ``muongrid.MuonW`` in the
same process. Prints one JSON line (rank 0) with, per case, the largest parameter difference and the losses.

The reference computes what the layouts promise to match bit for bit (README, "against one process"): each
rank's gradient as one process computes it for that rank's rows (its slice of the step's global batch,
its micro-batches accumulated in order), then their mean over DP (summed in rank order, divided by dp),
then one MuonW step. Both models start from the same seeded weights and see the same seeded tokens.

Cases (``--cases``, comma-separated): ``<model>-<optimizer>[-accum][-compile]`` with model ``llama``,
``gpt2`` or ``mixtral`` (its experts are 3-D banks that Muon orthogonalises expert by expert), optimizer ``zero1`` or ``fsdp``; ``-accum``: 2 micro-batches per rank per step (FSDP2 syncs
gradients on the last only: ``set_requires_gradient_sync``); ``-compile``: both models
``torch.compile(backend="aot_eager")`` (AOT autograd's forward and backward graphs run by eager kernels;
inductor's C++ compile takes minutes on this project's 2-core CPUs); ``-tp`` (llama, zero1): the Llama made
tensor-parallel over the grid's "tp" by ``muongrid.tp_plans.parallelize_llama`` (q/k/v and MLP up/gate
``ColwiseParallel``, o_proj and MLP down ``RowwiseParallel``; embedding, norms and head replicated).

Under TP no one process computes the same gradients: a row-parallel layer sums partial products across
ranks, in another order than one matmul. So a ``-tp`` case holds the two checks apart: the optimizer bit
for bit, given the TP model's own gradients gathered whole and averaged over DP (summed in rank order, as
the reduce-scatter sums); and the TP model itself, whose loss on each step's rows must be within
``TP_LOSS_RTOL`` of the one-process model's on the same (equal) weights.

    python tests/hf_run.py --dp 2 --tp 1 --cases llama-zero1,gpt2-fsdp-accum --steps 3
    python tests/hf_run.py --dp 2 --tp 2 --cases llama-zero1-tp
"""
import argparse
import json
import sys

import torch
import torch.distributed as dist
import transformers

from muongrid import DistributedMuon, FSDPMuon, MuonW, hybrid_param_groups
from muongrid.launch import add_launch_args, launch
from muongrid.tp_plans import parallelize_llama

MUON, ADAMW = dict(lr=0.02, weight_decay=0.1), dict(lr=3e-3, weight_decay=0.1)
BATCH, SEQ, VOCAB = 2, 16, 100  # per rank: BATCH sequences (split into micro-batches with -accum)

transformers.logging.set_verbosity_error()   # the tiny GPT-2's default bos/eos ids lie outside VOCAB: harmless


def build(kind: str) -> torch.nn.Module:
    """A two-layer model with seeded random weights, the same on every rank and for the reference."""
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
        return transformers.LlamaForCausalLM(cfg)
    if kind == "gpt2":   # tied head, fused QKV (Conv1D), biases; dropout off so both runs see the same graph
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=SEQ,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return transformers.GPT2LMHeadModel(cfg)
    if kind == "mixtral":   # MoE: each layer's experts as two 3-D banks (experts x out x in), a router per layer
        cfg = transformers.MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                         num_experts_per_tok=2, max_position_embeddings=SEQ)
        return transformers.MixtralForCausalLM(cfg)
    raise ValueError(f"unknown model {kind!r}: llama, gpt2 or mixtral")


def decoder_layers(model) -> list:
    return list(model.model.layers) if hasattr(model, "model") else list(model.transformer.h)


def tokens(step: int, dp: int, micro: int) -> list[list[torch.Tensor]]:
    """[rank][micro-batch] token ids: the step's seeded global batch, rank r's rows r*BATCH..(r+1)*BATCH."""
    batch = torch.randint(VOCAB, (dp * BATCH, SEQ), generator=torch.Generator().manual_seed(step))
    return [list(batch[r * BATCH:(r + 1) * BATCH].chunk(micro)) for r in range(dp)]


def backward(model, micro_batches, before_last=None) -> float:
    """Forward and backward every micro-batch, the loss divided by their number (gradient accumulation)."""
    total = 0.0
    for i, x in enumerate(micro_batches):
        if before_last is not None:
            before_last(i == len(micro_batches) - 1)
        loss = model(input_ids=x, labels=x).loss / len(micro_batches)
        loss.backward()
        total += loss.item()
    return total


def reference_grads(ref, per_rank) -> float:
    """Each rank's gradient computed here in turn, then their mean over DP into ``ref``'s .grad."""
    total, losses = None, []
    for micro_batches in per_rank:
        ref.zero_grad(set_to_none=True)
        losses.append(backward(ref, micro_batches))
        grads = [p.grad.clone() for p in ref.parameters()]
        total = grads if total is None else [t + g for t, g in zip(total, grads)]
    for p, t in zip(ref.parameters(), total):
        p.grad = t / len(per_rank)
    return losses


def tensor_parallel(model, grid) -> None:
    """The Llama's decoder layers split over the grid's "tp" by the package's plan (muongrid/tp_plans.py)."""
    parallelize_llama(model, grid.mesh["tp"])


def gathered_grads(model, ref, grid) -> None:
    """The TP model's gradients, whole (gathered over TP) and averaged over DP, into ``ref``'s .grad."""
    want = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        g = (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
        dist.all_reduce(g, group=grid.dp_group)   # two ranks: a + b, the sum the reduce-scatter makes
        want[n].grad = g / grid.dp


def run_case(case: str, grid, comm, steps: int) -> dict:
    kind, optimizer, *flags = case.split("-")
    micro = 2 if "accum" in flags else 1
    model, ref = build(kind), build(kind)
    init = {n: p.detach().clone() for n, p in ref.named_parameters()}
    if "tp" in flags:
        if kind != "llama" or optimizer != "zero1" or grid.dp > 2:
            raise ValueError(f"{case}: -tp runs the Llama under zero1 on at most 2 DP ranks (a + b is exact)")
        tensor_parallel(model, grid)
    if optimizer == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=grid.mesh["dp"])
        fully_shard(model, mesh=grid.mesh["dp"])
    if "compile" in flags:
        model, ref = torch.compile(model, backend="aot_eager"), torch.compile(ref, backend="aot_eager")
    groups, table = hybrid_param_groups(model, muon=MUON, adamw=ADAMW, return_table=True)
    if optimizer == "zero1":
        opt = DistributedMuon(groups, grid, comm=comm, layout="owner")
    elif optimizer == "fsdp":
        opt = FSDPMuon(groups, grid, comm=comm)
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}: zero1 or fsdp")
    ref_opt = MuonW(hybrid_param_groups(ref, muon=MUON, adamw=ADAMW))
    sync = getattr(model, "set_requires_gradient_sync", None) if optimizer == "fsdp" and micro > 1 else None
    losses, ref_losses = [], []
    for step in range(1, steps + 1):
        per_rank = tokens(step, grid.dp, micro)
        losses.append(backward(model, per_rank[grid.dp_rank], sync))
        opt.step()
        if "tp" in flags:
            gathered_grads(model, ref, grid)
            with torch.no_grad():   # forward only: the TP model's check
                ref_losses.append(sum(ref(input_ids=x, labels=x).loss.item() for x in per_rank[grid.dp_rank]))
        else:
            ref_losses.append(reference_grads(ref, per_rank)[grid.dp_rank])
        opt.zero_grad(set_to_none=True)
        ref_opt.step()
    diff, moved = {}, {}
    want = dict(ref.named_parameters())
    for n, p in model.named_parameters():     # the same order on every rank: full_tensor's collectives match
        whole = p.full_tensor() if hasattr(p, "full_tensor") else p
        diff[n] = (whole.detach() - want[n].detach()).abs().max().item()
        moved[n] = (want[n].detach() - init[n.removeprefix("_orig_mod.")]).abs().max().item()
    return dict(max_diff=max(diff.values()), diff=diff, min_moved=min(moved.values()), losses=losses,
                ref_losses=ref_losses, muon=table.names("Muon"), adamw=table.names("AdamW"),
                muon_group=[n for g in opt.param_groups if g["use_muon"] for n in g["names"]])


def worker(grid, comm, args):
    torch.set_num_threads(1)
    out = {}
    for case in args.cases.split(","):
        out[case] = run_case(case, grid, comm, args.steps)
    everyone = comm.gather_objects(out, "report")
    if grid.rank == 0:
        report = {case: dict(everyone[0][case], max_diff=max(e[case]["max_diff"] for e in everyone),
                             losses=[e[case]["losses"] for e in everyone],
                             ref_losses=[e[case]["ref_losses"] for e in everyone]) for case in out}
        print(json.dumps(dict(dp=grid.dp, tp=grid.tp, cases=report)), flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    add_launch_args(p)
    p.add_argument("--cases", default="llama-zero1,gpt2-zero1,llama-fsdp,gpt2-fsdp")
    p.add_argument("--steps", type=int, default=3)
    sys.exit(launch(worker, p.parse_args()))

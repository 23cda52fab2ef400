"""How far a data-parallel run is from one process, and what "bit for bit" is measured against (issue 32).

    python scripts/exactness_gap.py                   # a tiny transformers Llama, 2 DP ranks, 10 steps
    python scripts/exactness_gap.py --model gpt       # the book's tiny GPT (no transformers needed)

One distributed run: each of ``--dp`` ranks computes the mean loss on its rows of a batch of the book's
corpus and its gradient, and ``DistributedMuon`` (Muon for the hidden matrices, AdamW for embeddings,
head and vectors) or ``DistributedAdamW`` takes the step. Two single-process references start from the
same weights and see the same batches:

* **rows**: one process computes each rank's gradient on that rank's rows and averages them as the DP
  reduce-scatter does (sum in rank order, then divide), so the same numbers reach the optimizer. This is
  what ``verify.py`` and the tests compare against, and where the parameters agree bit for bit.
* **whole**: one process takes the gradient of the mean loss on the whole batch in one backward. It is
  the same gradient in exact arithmetic, summed in another order, so it differs in the last bits; Muon's
  Newton-Schulz runs in bf16 and carries such differences into every update.

Prints, per optimizer, the largest elementwise difference from each reference after ``--steps`` steps and
the difference's norm relative to how far the parameters moved, then one JSON line. Rows and whole are
measured here, never assumed: a "rows" gap that is not 0.0 is printed as it is, and with 2 ranks (whose
sum is the same in either order) the exit code is then 1. With more ranks the backend may add in another
order than rank order, and "rows" is then only as close as that.
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

from muongrid import AdamW, DistributedAdamW, DistributedMuon, MuonW
from muongrid.lab.charlm import batch, load_corpus
from muongrid.launch import add_launch_args, launch

LR = dict(muon=0.02, adamw=3e-3)


def build(args, vocab: int) -> torch.nn.Module:
    """The model, seeded: the same weights in every process."""
    torch.manual_seed(args.seed)
    if args.model == "gpt":
        from muongrid.lab.tpgpt import head_major_gpt
        return head_major_gpt(vocab, d=args.width, n_layer=args.layers, n_head=4, context=args.context)
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        raise SystemExit("--model llama needs transformers (pip install transformers); --model gpt does not")
    config = LlamaConfig(vocab_size=vocab, hidden_size=args.width, intermediate_size=2 * args.width,
                         num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=args.context)
    return LlamaForCausalLM(config)


def loss_of(model, args, x, y) -> torch.Tensor:
    """The mean loss on these rows: a Hugging Face model computes it (``.loss``), the GPT returns logits."""
    if args.model == "gpt":
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    return model(input_ids=x, labels=x).loss


def param_groups(model, kind: str) -> list[dict]:
    """Moonshot's split: Muon for the hidden matrices; AdamW for the embeddings, the output head (found
    from the modules, not the names) and every vector. ``kind="adamw"`` puts everything in AdamW."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else model.head
    to_adamw = {id(head.weight)} | {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    named = list(model.named_parameters())
    muon = [(n, p) for n, p in named if kind == "hybrid" and p.ndim == 2 and id(p) not in to_adamw]
    rest = [(n, p) for n, p in named if all(p is not q for _, q in muon)]
    groups = [dict(params=[p for _, p in muon], names=[n for n, _ in muon], use_muon=True, lr=LR["muon"]),
              dict(params=[p for _, p in rest], names=[n for n, _ in rest], use_muon=False, lr=LR["adamw"])]
    return [g for g in groups if g["params"]]


def batches(data, args):
    """The global batch of every step, the same in every process."""
    gen = torch.Generator().manual_seed(args.seed + 1)
    return [batch(data["train"], args.batch, args.context, gen) for _ in range(args.steps)]


def rows(rank: int, args) -> slice:
    return slice(rank * args.batch // args.dp, (rank + 1) * args.batch // args.dp)


def distributed(grid, comm, args, data, kind: str) -> dict:
    model = build(args, data["vocab_size"]).to(grid.device)
    cls = DistributedMuon if kind == "hybrid" else DistributedAdamW
    opt = cls(param_groups(model, kind), grid, comm=comm, layout="owner")
    for x, y in batches(data, args):
        r = rows(grid.dp_rank, args)
        loss_of(model, args, x[r].to(grid.device), y[r].to(grid.device)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters()}   # all-gathered after each step


def single(args, data, kind: str, reference: str) -> tuple[dict, dict]:
    """One process from the same weights: ``reference`` "rows" averages per-rank gradients as DP does,
    "whole" takes one backward on the whole batch. Returns the initial and the final parameters."""
    model = build(args, data["vocab_size"])
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = MuonW(param_groups(model, kind)) if kind == "hybrid" else AdamW(param_groups(model, kind))
    params = [p for _, p in model.named_parameters()]
    for x, y in batches(data, args):
        if reference == "whole":
            loss_of(model, args, x, y).backward()
        else:
            per_rank = [torch.autograd.grad(loss_of(model, args, x[rows(r, args)], y[rows(r, args)]), params,
                                            allow_unused=True) for r in range(args.dp)]
            for i, p in enumerate(params):
                gs = [g[i] for g in per_rank if g[i] is not None]
                total = gs[0].clone()
                for g in gs[1:]:
                    total += g
                p.grad = total / args.dp if gs else None
        opt.step()
        opt.zero_grad(set_to_none=True)
    return init, {n: p.detach().clone() for n, p in model.named_parameters()}


def gap(ours: dict, ref: dict, init: dict) -> dict:
    """Largest elementwise difference, and ||ours - ref|| over ||ref - init|| (all parameters together)."""
    diff = max((ours[n] - ref[n]).abs().max().item() for n in ref)
    num = sum(float((ours[n] - ref[n]).double().norm() ** 2) for n in ref) ** 0.5
    moved = sum(float((ref[n] - init[n]).double().norm() ** 2) for n in ref) ** 0.5
    return dict(max_abs_diff=diff, rel_to_movement=num / moved)


def worker(grid, comm, args):
    torch.set_num_threads(1)  # the same kernels in the ranks and in the references
    if grid.tp != 1:
        raise SystemExit("exactness_gap.py measures data parallelism: give --tp 1")
    data = load_corpus()
    out = {}
    for kind in ("hybrid", "adamw"):
        ours = distributed(grid, comm, args, data, kind)
        if grid.rank != 0:
            continue
        init, by_rows = single(args, data, kind, "rows")
        _, whole = single(args, data, kind, "whole")
        out[kind] = dict(rows=gap(ours, by_rows, init), whole=gap(ours, whole, init))
    if grid.rank != 0:
        return 0
    n_params = sum(p.numel() for p in build(args, data["vocab_size"]).parameters())
    print(f"tiny {args.model} ({args.layers} layers, width {args.width}, {n_params:,} parameters), "
          f"{args.dp} DP ranks, {args.steps} steps, global batch {args.batch} x {args.context}:")
    names = dict(hybrid="DistributedMuon (Muon + AdamW)", adamw="DistributedAdamW (AdamW alone)")
    for kind, res in out.items():
        print(f"  {names[kind]}")
        for ref, words in (("rows", "one process, each rank's rows (DP's sum order)"),
                           ("whole", "one process, the whole batch in one backward")):
            g = res[ref]
            print(f"    against {words:48s} max |diff| {g['max_abs_diff']:.1e}   "
                  f"||diff|| / ||movement|| {g['rel_to_movement']:.1e}")
    print(json.dumps(dict(model=args.model, dp=args.dp, steps=args.steps, batch=args.batch, context=args.context,
                          n_params=n_params, gaps=out)), flush=True)
    exact = all(res["rows"]["max_abs_diff"] == 0.0 for res in out.values())
    return 0 if exact or args.dp != 2 else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_launch_args(p)
    p.set_defaults(dp=2)
    p.add_argument("--model", choices=("llama", "gpt"), default="llama")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=8, help="the global batch (rows), split over the DP ranks")
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    sys.exit(launch(worker, p.parse_args()))

# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,mystnb,jupyter,-all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 12. Use it in your training
#
# ```{admonition} What this chapter runs
# Both loops as real scripts on a 2 x 2 grid with bf16, two micro-batches a step and
# evaluation, each saved half-way and resumed on another grid (the template on 4 x 1, the FSDP2
# variant on 2 x 1), and a Hugging Face Llama's routing: about a minute in all.
# Reading: about 15 minutes, plus running it. Read first: {doc}`chapter 1 <01_muon>` and {doc}`chapter 8 <08_beyond_poc>`.
# ```
#
# The chapters so far explain distributed Muon and check it against one process. This one is the
# code you copy: **one template**, [`scripts/loop_zero1_tp.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/loop_zero1_tp.py) (`DistributedMuon`,
# ZeRO-1 x tensor parallel), with what a cluster run needs: bf16, gradient accumulation, a
# compiled model, evaluation and checkpoints that resume on any grid. Beside it,
# [`scripts/loop_fsdp.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/loop_fsdp.py) is the same loop for a model already under FSDP2
# (`fully_shard`): it imports the template's helpers and writes only the lines FSDP2 changes.
# [`scripts/train.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/train.py), which chapters 9 to 11 run, is the book's measuring harness (the
# ledger, profiles, state metrics, comparisons with `torch.optim`): read it, do not copy it.
# Then the commands that start the loop on one machine, one node or two, the learning rate and
# weight decay to use, and the few things that differ from a single-device optimizer, and why.
#
# **Learning goals.** After this chapter you can
#
# - put `DistributedMuon` or `FSDPMuon` into your own training loop, with bf16, gradient
#   accumulation, a compiled model, evaluation, a scheduler, clipping and checkpoints;
# - pick the learning rate and weight decay when you port from AdamW;
# - start it with `torchrun` on one node or several;
# - say what differs from `torch.optim.Muon` / `torch.optim.AdamW` and what to do about each difference.

# %% tags=["hide-cell"] jupyter={"source_hidden": true}
# Set-up (written by `python -m muongrid.lab.notebook sync`).
# In Colab: fetch the book's code and install what this chapter needs beyond Colab's
# image (never torch). Elsewhere nothing is installed here: `make setup` does it.
import importlib.util, os, subprocess, sys  # noqa: E401
REPOSITORY = "https://github.com/muongrid-book/distributed-muon"
HOME = "/content/distributed-muon"  # where Colab keeps the clone
if "google.colab" in sys.modules:
    if not os.path.isdir(HOME) and subprocess.run(
            ["git", "clone", "--quiet", "--depth", "1", REPOSITORY, HOME]).returncode:
        raise RuntimeError(
            f"could not clone {REPOSITORY}: this book's repository is not public "
            "yet (or this runtime cannot reach it). Run the book on your machine: "
            "in a copy of the repository, `make lab` sets up Python and opens the "
            "chapters in JupyterLab (`make book` builds all of them).")
    os.chdir(os.path.join(HOME, "notebooks"))
    install = [sys.executable, "-m", "pip", "install", "-q"]
    if importlib.util.find_spec("muongrid") is None:  # the book's package, not its deps
        subprocess.run([*install, "--no-deps", ".."], check=True)
    wanted = [('transformers', 'transformers==5.24.0')]
    missing = [pip for module, pip in wanted
               if importlib.util.find_spec(module) is None]
    if missing:
        subprocess.run([*install, *missing], check=True)
    importlib.invalidate_caches()
elif (importlib.util.find_spec("muongrid") is None
      or not os.path.isfile(os.path.join("..", "scripts", "verify.py"))):
    raise RuntimeError(
        "this chapter runs inside the book's repository, with its package installed: "
        "in a copy of the repository, `make lab` sets it up and opens JupyterLab on "
        "its notebooks/ folder; open the chapter there. In Colab, open it with the "
        "book's Colab button.")

# %% [markdown]
# ## The loop, ZeRO-1 x TP
#
# The template is the whole program: the grid, the tiny GPT made tensor-parallel with PyTorch's
# `parallelize_module` on `grid.mesh["tp"]`, the hybrid parameter groups (Muon for the hidden
# matrices, AdamW for embeddings, head and norms), `DistributedMuon(..., layout="owner")`, a
# `DataLoader` keyed by the DP rank, a warm-up then a cosine decay, clipping, evaluation and a
# checkpoint every N steps that any grid can resume. Each of bf16, accumulation and compilation is
# one flag (the docstring lists them); `--lr` has no default, because it is your recipe's. Replace
# the model and the dataset with yours; the rest stays.

# %%
from pathlib import Path

from IPython.display import Code

from muongrid.lab.notebook import last_json, run, table
from muongrid.lab.page import keep, listing, say

Code(Path("../scripts/loop_zero1_tp.py").read_text(), language="python")

# %% [markdown]
# A few lines differ from a single-device loop, each for a reason:
#
# - `opt.clip_grad_norm_(1.0)` instead of `torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)`:
#   under ZeRO-1 the gradients are averaged over the DP ranks *inside* `step()`, so `.grad` holds this
#   rank's own gradient; the optimizer clips the mean, by its norm over every rank's shards (a TP
#   shard counted once, a replicated parameter once) and returns that norm, as torch's function does.
# - `save_run(...)` on every rank: each rank holds only its shard of the optimizer state, so a save
#   is collective; it goes through `muongrid.checkpoint` (global coordinates), so it loads on any grid.
# - The data comes through a `torch.utils.data.DataLoader` whose sampler is keyed by the **DP rank**,
#   not the global rank (`muongrid.data`, below). The TP ranks of one replica compute one forward
#   together, each on its shard of the weights, so they must read the same rows; keyed by the
#   global rank they would each train other rows against shards of one model, and nothing would
#   fail. The replicas read disjoint slices of one global batch, so every grid trains on the same
#   rows step by step, and the loader's position (global batches taken, the same on any grid) is
#   saved with the checkpoint: a resume reads on where the run stopped.
# - Micro-batches need nothing from the optimizer: backward adds their gradients in `.grad`, and
#   `step()` averages over DP once. (Under FSDP2 the micro-batches before the last skip FSDP2's
#   reduce-scatter: `set_requires_gradient_sync`.)
# - `--precision bf16` casts the model's weights to bf16 before the optimizer is built; the
#   optimizer keeps an fp32 master of its shard, updates it and writes the rounded value back, so
#   small updates are not lost to bf16's 8 bits of mantissa. `--precision autocast` keeps fp32
#   weights and runs the matmuls in bf16.
# - `torch.compile` wraps the model for forward and backward only; the optimizer and the
#   checkpoints see the model itself.
#
# The sampler, the one part of the data to keep when you bring your own `Dataset`:

# %%
listing("data.py", pyobject="DPBatchSampler")

# %% [markdown]
# Now run it for real: 20 steps on a 2 x 2 grid with bf16 weights, two micro-batches a step and
# an evaluation every 10 steps, saving at steps 10 and 20; then the second half again from step
# 10 on a 4 x 1 grid.

# %%
import shutil  # noqa: E402

OUT = Path("_build/ch12")  # the scripts run in the repository's root folder
shutil.rmtree(".." / OUT, ignore_errors=True)
FLAGS = ["--lr", 0.01, "--precision", "bf16", "--accum", 2]  # both halves: 20 steps
first = last_json(run("loop_zero1_tp.py", "--dp", 2, "--tp", 2, *FLAGS,
                      "--save", OUT / "zero1"))
again = last_json(run("loop_zero1_tp.py", "--dp", 4, "--tp", 1, *FLAGS,
                      "--resume", OUT / "zero1" / "step10"))


def halves(first, again, a, b):
    """The second half of each run's losses and evaluations, side by side."""
    table(["step", a, b, "difference"],
          [[s, f"{x:.6f}", f"{y:.6f}", f"{y - x:+.1e}"]
           for s, x, y in zip(range(11, 21), first["losses"][10:], again["losses"])]
          + [[f"validation, step {s}", f"{x:.6f}", f"{y:.6f}", f"{y - x:+.1e}"]
             for (s, x), (_, y) in zip(first["evals"][1:], again["evals"])],
          align="lrrr")


halves(first, again, "2 x 2, uninterrupted", "4 x 1, resumed from step 10")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
assert [s for s, _ in first["evals"]] == [10, 20] and again["first_step"] == 11

# %% [markdown]
# The resumed run continues the curve on another grid: the model, the optimizer state (fp32
# masters, momentum, AdamW moments, step counts), the scheduler, the data loader's position and
# the RNG all came back, and the validation loss agrees too. The differences are in the last digits,
# larger than in fp32 since the weights are bf16: a 4 x 1 grid adds its numbers in another order
# than a 2 x 2 grid (the DP mean of four gradients instead of two, whole matmuls instead of TP
# partial sums), and a bf16 weight rounds that difference to its own 8 bits. [`tests/test_resume.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_resume.py) resumes on another layout of the same grid, where the order is the
# same, and requires the curves to be equal bit for bit.

# %% [markdown]
# ## The loop, FSDP2
#
# With `fully_shard` the parameters are row blocks (DTensors) and FSDP2 does the data-parallel
# communication itself; `FSDPMuon` sends each matrix's blocks to one owner for Newton-Schulz
# ({doc}`chapter 11 <11_fsdp2>`). The loop is the template's but for the lines marked `# FSDP2`:
# `fully_shard(model, mesh=grid.mesh["dp"])`, bf16 as FSDP2's `MixedPrecisionPolicy` (fp32
# shards, bf16 gathers, fp32 gradient reduction), `set_requires_gradient_sync` on micro-batches
# and `FSDPMuon(groups, grid)`; `save_run` and `load_run` take it as they are
# (`muongrid.checkpoint` saves the DTensors as FSDP2 places them, through DCP). Here it runs
# FSDP2 x TP on 2 x 2, and resumes on 2 x 1 (FSDP2 alone, on half the ranks).

# %%
Code(Path("../scripts/loop_fsdp.py").read_text(), language="python")

# %%
first = last_json(run("loop_fsdp.py", "--dp", 2, "--tp", 2, *FLAGS,
                      "--save", OUT / "fsdp"))
again = last_json(run("loop_fsdp.py", "--dp", 2, "--tp", 1, *FLAGS,
                      "--resume", OUT / "fsdp" / "step10"))
halves(first, again, "FSDP2 x TP 2 x 2, uninterrupted",
       "FSDP2 2 x 1, resumed from step 10")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
assert [s for s, _ in first["evals"]] == [10, 20] and again["first_step"] == 11

# %% [markdown]
# ## Starting it
#
# On a laptop or in Colab, `python scripts/loop_zero1_tp.py --dp 2 --tp 2` starts the four processes
# itself, on gloo. On GPUs, `torchrun` starts one process per GPU and the same script runs on NCCL:
#
# ```bash
# # one node, 8 GPUs: TP inside groups of 4, DP across them
# torchrun --standalone --nproc-per-node 8 scripts/loop_zero1_tp.py \
#     --dp 2 --tp 4 --compile inductor --steps 1000 --save ckpt --every 100
# # two nodes of 8 GPUs: run on each node (HOST is the first node's address)
# torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \
#     --rdzv-endpoint HOST:29500 scripts/loop_zero1_tp.py \
#     --dp 4 --tp 4 --compile inductor --steps 1000 --save ckpt --every 100
# # later, on another grid (here one node): the run continues from step 500
# torchrun --standalone --nproc-per-node 8 scripts/loop_zero1_tp.py \
#     --dp 8 --tp 1 --compile inductor --steps 1000 --resume ckpt/step500
# ```
#
# Keep a TP group inside one node (ranks are TP-fastest: ranks 0-3 are one TP group), where the links
# are fast; DP crosses nodes. On GPUs compile with `inductor`; this chapter's CPU runs leave
# compilation out, since on a 2-core machine inductor's C++ build of the kernels takes 20 to 50
# seconds a launch; [`tests/test_loops.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_loops.py) runs the template with `--compile inductor`
# on one rank and compares its losses with the uncompiled loop's.
#
# ## Your own model: a Hugging Face Llama (and a MoE)
#
# Replace the tiny GPT with the model you train. A `transformers` model built from its config (random
# weights, nothing downloaded) is what most readers bring; `hybrid_param_groups(model)` reads what each
# parameter is from the model's modules, not from its name: every `nn.Embedding` and the output head
# (`get_output_embeddings()`, or a head tied to the embedding) go to AdamW with norms, biases and MoE
# routers; hidden matrices and 3-D expert banks go to Muon. `routing_table` says which and why:

# %%
import transformers  # noqa: E402

from muongrid import hybrid_param_groups, routing_table  # noqa: E402

transformers.logging.set_verbosity_error()
llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
    vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2))


def show(table):   # the table's columns, names and reasons shortened to fit the page
    for r in table:
        shape = "x".join(map(str, r.shape))
        name, why = r.name.removeprefix("model."), r.why.split(" (")[0]
        print(f"{name:<41}{shape:>9}  {r.optimizer:<6}{why}")


show(routing_table(llama))
groups = hybrid_param_groups(llama, muon={"lr": 0.01}, adamw={"lr": 0.01})
print([(len(g["params"]), "Muon" if g["use_muon"] else "AdamW") for g in groups])

# %% [markdown]
# A Mixtral's experts are one 3-D tensor per projection (experts x out x in): Muon orthogonalises each
# expert on its own, and the router, a matrix, goes to AdamW:

# %%
mixtral = transformers.MixtralForCausalLM(transformers.MixtralConfig(
    vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=2, num_local_experts=4))
show(routing_table(mixtral))

# %% [markdown]
# ### The Llama, tensor-parallel
#
# The template splits its GPT with `parallelize_module` and a plan of module paths. A Hugging Face
# Llama (Mistral and Qwen2 name their layers the same) splits as Megatron-LM splits a transformer:
# q, k, v and the MLP's gate and up projections by rows (`ColwiseParallel`: each TP rank computes its
# own attention heads and its own hidden units), the attention output and the MLP's down projection
# by columns (`RowwiseParallel`: the partial products are summed over TP), and the embedding, the
# norms and the head whole on every TP rank. The plan is the package's, the one the tests train:

# %%
listing("tp_plans.py", pyobject="llama_layer_plan")
listing("tp_plans.py", pyobject="parallelize_llama")

# %% [markdown]
# In the template, `parallelize_llama(model, grid.mesh["tp"])` takes the place of
# `parallelize_module(model, grid.mesh["tp"], tp_plan(2))`, before the optimizer is built, which
# reads each matrix's split from its DTensor. The model's output is an object with `.loss`
# (`model(input_ids=x, labels=x).loss`); everything else is the template's. Without the split, a
# `Grid.build(dp=2, tp=4)` would run: the four TP ranks of a replica would each compute the whole
# model on the same rows, four times the work for one replica's result. [`tests/test_hf_models.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_hf_models.py) trains this Llama, a
# GPT-2 (tied head, fused QKV) and the Mixtral under `DistributedMuon` and `FSDPMuon` (`fully_shard`
# per decoder layer) on 2 x 1 ranks, the Llama also tensor-parallel on 2 x 2, with gradient
# accumulation and a compiled model, against one process, bit for bit.
#
# ## Learning rate and weight decay, porting from AdamW

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# The learning rates of chapter 9's recorded study, quoted below.
import json  # noqa: E402

study = json.loads(Path("../book/data/convergence_study.json").read_text())
best = study["summary"]["best_lr"]
assert best["hybrid"] > best["adamw"]
assert not any(study["summary"]["best_at_edge"].values())
keep("ch12-adamw-lr", f"{best['adamw']:g}")
keep("ch12-hybrid-lr", f"{best['hybrid']:g}")
keep("ch12-lr-ratio", f"{best['hybrid'] / best['adamw']:g}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
One rule, used by both loops, the README and this chapter: **one learning rate for both
groups, starting from AdamW's**. `DistributedMuon` and `FSDPMuon` scale each Muon matrix's step
by Moonshot's `match_rms_adamw` (lr x 0.2 x sqrt(max(A, B))), which brings Muon's update to the
size of an AdamW update, so AdamW's tuned lr is where to start for both groups. Then sweep that
one lr upwards: in {doc}`chapter 9 <09_training>`'s tuned study AdamW was best at
{{ch12-adamw-lr}} and the hybrid, both groups at one lr, at {{ch12-hybrid-lr}}
({{ch12-lr-ratio}} x AdamW's). The loops require `--lr`, one value for both groups; this
chapter passes 0.01, AdamW's best in that study. After `--warmup` steps the lr follows a cosine
down to a tenth of it at the last step.
""")

# %% [markdown]
# The rest, group by group, as the code applies it:
#
# | | AdamW alone | here (`hybrid_param_groups` + `DistributedMuon` / `FSDPMuon`) |
# |---|---|---|
# | which tensors | all | Muon: hidden matrices and MoE expert banks; AdamW: embeddings, the output head, norms, biases, routers (`print(muongrid.routing_table(model))` shows each and why) |
# | learning rate | yours | yours for both groups, then swept upwards together; Muon's is scaled per matrix by `match_rms_adamw` |
# | weight decay | yours | 0.1 on every group by default, norms and biases included (decoupled, `p *= 1 - lr * wd` with the unscaled lr); give a group `weight_decay=` to change it, e.g. `adamw=dict(lr=lr, weight_decay=0.0)` to spare norms and biases (and then embeddings and head too) |
# | betas, momentum | yours | AdamW group: `betas=(0.9, 0.999)` by default; Muon group: `momentum=0.95`, Nesterov |
# | schedule, warm-up | yours | the same scheduler on the one optimizer: it moves both groups' lr together |
# | clipping | `torch.nn.utils.clip_grad_norm_` | `opt.clip_grad_norm_` (below) |

# %% [markdown]
# ## What differs from a single-device optimizer, and why
#
# Everything else behaves as `torch.optim` documents, and [`tests/test_contract.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_contract.py) checks it against
# `torch.optim.Muon` and `torch.optim.AdamW` at world sizes 1 to 4: a step starts from the parameters'
# current values (load weights or clamp them whenever you like); a parameter whose gradient is None on
# every rank is skipped (frozen layers can stay in the groups), and None on only some ranks counts as
# zeros there; `OneCycleLR` and `CyclicLR` cycle Muon's momentum; the step and load hooks run;
# `copy.deepcopy` works; float64 parameters stay float64; negative lr, momentum or weight decay and
# complex or integer parameters are refused when the optimizer is built.
#
# What differs from a single-device (`torch.optim`) optimizer, each with why and what to do:
#
# - **Default lr scaling.** `torch.optim.Muon` (`adjust_lr_fn=None`): "original",
#   lr x sqrt(max(1, A/B)). Ours: "match_rms_adamw", lr x 0.2 x sqrt(max(A, B)), Moonshot's, so
#   a Muon step has an AdamW step's size and AdamW's lr is the starting point (the rule above).
#   Porting a `torch.optim.Muon` run with its lr: pass `adjust_lr_fn=None`.
# - **Clipping.** Single device: `torch.nn.utils.clip_grad_norm_(params, 1.0)`. Ours:
#   `opt.clip_grad_norm_(1.0)`. ZeRO-1 averages over DP inside `step()`, and FSDP2's `.grad` are
#   blocks, so the optimizer clips the DP mean by its global norm.
# - **`state_dict()`.** Single device: the whole state. Ours: this rank's shard; loading another
#   rank's is refused, saying so. Save on every rank, or use `muongrid.checkpoint` / `save_run` to
#   change grids.
# - **Pickling (`torch.save(opt)`).** Single device: works. Ours: refused, naming the fix, since
#   process groups cannot be pickled; `copy.deepcopy(opt)` works (`DistributedMuon`).
# - **`add_param_group`.** Single device: adds a group. Ours: refused, because the ZeRO-1 plan (and
#   FSDPMuon's owners) are fixed when the optimizer is built.
# - **A step without any gradient.** Single device: a no-op. Ours: a no-op plus one small
#   all-reduce of flags on the device (no host collective), because every rank must agree which
#   parameters to skip; only a rank that lacks a gradient reads the agreed flags back.
#
# ## Summary
#
# - Build the grid, make the model tensor-parallel (or `fully_shard` it), build `DistributedMuon`
#   (or `FSDPMuon`) from `hybrid_param_groups`, and train as with any torch optimizer.
# - Clip with `opt.clip_grad_norm_`, and checkpoint on every rank; a checkpoint resumes on any grid.
# - One lr for both groups, starting from AdamW's and swept upwards; weight decay 0.1 on every
#   group unless you set it. The default lr scaling is Moonshot's; pass `adjust_lr_fn=None` for
#   `torch.optim.Muon`'s step.
# - Copy [`scripts/loop_zero1_tp.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/loop_zero1_tp.py): bf16, accumulation, compilation and evaluation are flags, and
#   [`scripts/loop_fsdp.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/loop_fsdp.py) shows the lines that change under FSDP2.
#
# ## Exercises
#
# 1. You have two nodes of 8 GPUs and a model that needs TP 4. Write the `torchrun` line for the
#    first node. Which ranks form the first TP group and the first DP group, and does any TP group
#    cross a node?
# 2. Replace `opt.clip_grad_norm_(1.0)` in [`scripts/loop_zero1_tp.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/loop_zero1_tp.py) by
#    `torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)`. What is clipped then, and why is the
#    step no longer the single-device step?
# 3. Resume the run this chapter saved on 2 x 2 at step 10 in one process (`--dp 1 --tp 1`). Will
#    its losses equal the 2 x 2 run's bit for bit? Which command shows it?
# 4. A layer must stay frozen for the first 100 steps and train afterwards. How do you set that up
#    with `DistributedMuon`?
# 5. Your AdamW run used lr 3e-4 and weight decay 0.1 with no decay on norms and biases. Write the
#    `hybrid_param_groups` call for a first Muon run, and say what you sweep next.

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# The exercises' answers, computed and checked (the solutions below quote them).
from muongrid.grid import grid_layout

two_nodes = grid_layout(4, 4)  # --dp 4 --tp 4 on 2 nodes of 8: node = rank // 8
first_tp, first_dp = two_nodes[0]["tp_group"], two_nodes[0]["dp_group"]
assert all(len({r // 8 for r in row["tp_group"]}) == 1 for row in two_nodes)
assert len({r // 8 for r in first_dp}) == 2
keep("ch12-ex1-tp", f"{first_tp[0]}-{first_tp[-1]}")
keep("ch12-ex1-dp", ", ".join(map(str, first_dp[:-1])) + f" and {first_dp[-1]}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
:::{admonition} Solutions
:class: dropdown

1. `torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500
   scripts/loop_zero1_tp.py --dp 4 --tp 4 ...`, the same line on both nodes (the two-node command
   above). Ranks are TP-fastest, so the first TP group is ranks {{ch12-ex1-tp}} and the first DP
   group is ranks {{ch12-ex1-dp}} (every `tp`-th rank, as in {doc}`chapter 3 <03_grid>`). Node 0 holds ranks 0-7 and
   4 divides 8, so every TP group lies inside one node; the DP groups cross nodes.
2. Under ZeRO-1, `.grad` between `backward()` and `step()` holds this rank's own gradient; the
   DP mean is formed inside `step()` by the reduce-scatter. torch's function would clip each rank's
   own gradient by its own norm (and, under TP, by the norm of this rank's shards only), so ranks
   scale by different factors and the mean that `step()` forms is not the clipped mean gradient a
   single device would use. `opt.clip_grad_norm_` clips the DP mean by its norm over every rank's
   shards, a TP shard counted once ([`muongrid/clipping.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/clipping.py)).
3. No, only to rounding: one process adds the gradients and the TP partial sums in another order
   than the 2 x 2 grid, as the 4 x 1 resume above shows. Run `python scripts/loop_zero1_tp.py --dp 1
   --tp 1 --lr 0.01 --precision bf16 --accum 2 --steps 20 --resume <save dir>/step10` with the save
   directory of the 2 x 2 run (a resume must keep the batch, the precision and the schedule, and
   refuses otherwise); the JSON line it prints at the end (`first_step` 11, `losses`) is compared with the
   second half of the 2 x 2 run's `losses`. Bit-for-bit equality holds when the order is the same: another layout on
   the same grid ([`tests/test_resume.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_resume.py)).
4. Put the layer in the parameter groups from the start (`add_param_group` is refused: the ZeRO-1
   plan is fixed when the optimizer is built) and set `requires_grad_(False)` on it for the first 100
   steps: a parameter whose gradient is None on every rank is skipped. Turn `requires_grad` back on
   at step 100, on every rank.
5. `hybrid_param_groups(model, muon=dict(lr=3e-4), adamw=dict(lr=3e-4, weight_decay=0.0))`:
   the same lr for both groups (`match_rms_adamw` gives Muon's matrices AdamW's step size) and
   decay 0.1, the default, on the Muon matrices. The AdamW group's `weight_decay=0.0` spares the
   norms and biases, and also the embeddings and the head, which share that group; to decay those,
   split the AdamW group by hand. Then sweep the one lr upwards (1e-3, 3e-3): in
   {doc}`chapter 9 <09_training>` the hybrid's best lr was {{ch12-lr-ratio}} times AdamW's.
:::
""")

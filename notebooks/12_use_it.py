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
# variant on 2 x 1), a Hugging Face Llama's routing, and DDP with torch's
# `ZeroRedundancyOptimizer` against this package, timed and counted on 2 ranks: about a minute and
# a half in all.
# Reading: about 40 minutes at 200 words, 8 lines of code or one figure a minute, plus running it. Read first: {doc}`chapter 1 <01_muon>` and {doc}`chapter 8 <08_beyond_poc>`.
# ```
#
# This chapter is the code you copy: **one template**,
# [`scripts/loop_zero1_tp.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/loop_zero1_tp.py)
# (`DistributedMuon`, ZeRO-1 x TP) with bf16, gradient accumulation, a compiled model, evaluation
# and checkpoints that resume on any grid, and
# [`scripts/loop_fsdp.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/loop_fsdp.py),
# the lines FSDP2 changes. (`scripts/train.py` of chapters 9 to 11 is the measuring harness: read
# it, do not copy it.) Then how to start it, the learning rate and weight decay, and what differs
# from a single-device optimizer.
#
# **Learning goals.** After this chapter you can
#
# - put `DistributedMuon` or `FSDPMuon` into your own training loop, with bf16, gradient
#   accumulation, a compiled model, evaluation, a scheduler, clipping and checkpoints;
# - pick the learning rate and weight decay when you port from AdamW;
# - start it with `torchrun` on one node or several;
# - run it inside HF Trainer, Accelerate or Lightning, resuming from their own checkpoints;
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
# The template is the whole program: the grid, the tiny GPT under `parallelize_module`, the hybrid
# parameter groups, `DistributedMuon(..., layout="owner")`, a `DataLoader` keyed by the DP rank,
# warm-up and cosine decay, clipping, evaluation and checkpoints. bf16, accumulation and
# compilation are flags; `--lr` has no default, because it is your recipe's. Replace the model and
# the dataset; the rest stays.

# %%
from pathlib import Path

from IPython.display import Code

from muongrid.lab.notebook import last_json, run, table
from muongrid.lab.page import keep, listing, say

Code(Path("../scripts/loop_zero1_tp.py").read_text(), language="python")

# %% [markdown]
# A few lines differ from a single-device loop, each for a reason:
#
# - `opt.clip_grad_norm_(1.0)`, not torch's: under ZeRO-1 `.grad` holds this rank's own gradient
#   (the DP mean is formed *inside* `step()`), so the optimizer clips the mean by its norm over
#   every rank's shards and returns that norm.
# - `save_run(...)` on every rank: each holds only its shard, so a save is collective; it goes
#   through `muongrid.checkpoint`, so it loads on any grid.
# - The `DataLoader`'s sampler is keyed by the **DP rank** (`muongrid.data`, below): the TP ranks of
#   a replica compute one forward together and must read the same rows; keyed by the global rank
#   they would silently train other rows against shards of one model. Its position is saved with
#   the checkpoint.
# - Micro-batches need nothing from the optimizer: `step()` averages over DP once. (Under FSDP2,
#   `set_requires_gradient_sync` skips the reduce-scatter before the last.)
# - `--precision bf16` casts the weights to bf16; the optimizer keeps an fp32 master of its shard,
#   so small updates are not lost. `--precision autocast` keeps fp32 weights, bf16 matmuls.
# - `torch.compile` wraps the model for forward and backward only.
#
# The sampler, the one part of the data to keep when you bring your own `Dataset`:

# %%
listing("data.py", pyobject="DPBatchSampler")

# %% [markdown]
# 20 steps on a 2 x 2 grid (bf16, two micro-batches, evaluation every 10 steps, saves at 10 and
# 20); then the second half again from step 10 on a 4 x 1 grid.

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
# The resumed run continues the curve on another grid, validation loss included: model, optimizer
# state, scheduler, loader position and RNG all came back. It differs in the last digits: another
# grid adds in another order ({doc}`chapter 9 <09_training>`), and bf16 weights round that up.
# [`tests/test_resume.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_resume.py)
# resumes on another layout of the same grid, same order, and requires bit-for-bit equality.

# %% [markdown]
# ## The loop, FSDP2
#
# The FSDP2 loop ({doc}`chapter 11 <11_fsdp2>`) is the template's but for the lines marked
# `# FSDP2`: `fully_shard(model, mesh=grid.mesh["dp"])`, bf16 as a `MixedPrecisionPolicy` (fp32
# shards, bf16 gathers, fp32 gradient reduction), `set_requires_gradient_sync` on micro-batches and
# `FSDPMuon(groups, grid)`; `save_run` and `load_run` are unchanged. FSDP2 x TP on 2 x 2, resumed on
# 2 x 1:

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
# Keep a TP group inside one node (ranks are TP-fastest: ranks 0-3 are one TP group); DP crosses
# nodes. This chapter's CPU runs leave out `inductor` (20 to 50 s of C++ build a launch on 2 cores);
# [`tests/test_loops.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_loops.py)
# checks a compiled run's losses against the uncompiled loop's.
#
# ## Inside a trainer: HF Trainer, Accelerate, Lightning
#
# HF `Trainer`, Accelerate and Lightning (Fabric, and its `Trainer`) wrap the model in
# `DistributedDataParallel`, which averages the gradients during backward. So the optimizer is built
# with `grad_reduce="ddp"`: data parallel only, ZeRO-1's sharded state, each matrix whole on the
# rank whose shard holds it (one Newton-Schulz each), and no second reduction in `step()`. Each of
# them also saves the optimizer from rank 0 alone, which under ZeRO-1 is one shard of several; one
# hook of each carries every rank's shard, and a resume on the same number of ranks then ends where
# the run would have:
#
# - HF `Trainer`: `callbacks=[muongrid.hf.ShardedCheckpoint(opt)]`; the recipe is in
#   [the README](https://github.com/muongrid-book/distributed-muon/blob/main/README.md#under-hf-trainer-accelerate-or-lightning-ddp).
# - Accelerate: `muongrid.accelerate.ShardedState(accelerator, opt)`, after `prepare`; the recipe is
#   [`scripts/loop_accelerate.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/loop_accelerate.py).
# - Lightning Fabric: `Fabric(strategy=muongrid.lightning.FabricShardedDDPStrategy())`; the recipe is
#   [`scripts/loop_fabric.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/loop_fabric.py).
# - Lightning `Trainer`: `Trainer(strategy=muongrid.lightning.ShardedDDPStrategy())`; the recipe is
#   [`scripts/loop_lightning.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/loop_lightning.py).
#
# Accelerate's hooks (`register_save_state_pre_hook` and its load twin) run on every rank and are
# given the folder; Lightning calls its `CheckpointIO` plugins on rank 0 only and gives callbacks no
# path, so there the hook is the strategy. The Accelerate recipe's loop, with `prepare`,
# `accumulate`, `backward`, `clip_grad_norm_`, `save_state` and `load_state`:

# %%
listing("scripts/loop_accelerate.py", pyobject="train")

# %% [markdown]
# Fabric's recipe is the same loop with Fabric's names (`setup`, `no_backward_sync`, `backward`,
# `clip_gradients`, `save`, `load`). The Lightning `Trainer` runs its own loop; its recipe gives it
# the module, the data and the strategy:

# %%
listing("scripts/loop_lightning.py", pyobject="TinyLM")
listing("scripts/loop_lightning.py", pyobject="train")

# %% [markdown]
# [`tests/test_trainers.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_trainers.py)
# runs the three recipes as they are on 2 gloo processes (one launch for Accelerate, one for
# Lightning): 4 steps of 2 micro-batches, saved after step 2 with the trainer's own save, resumed
# from it with the trainer's own load, and run again with the single-device `MuonW` on every rank in
# place of `DistributedMuon`. The resumed runs end bit for bit where the straight runs end, the
# ranks end equal, and they equal `MuonW` bit for bit: both step DDP's averaged gradient with the
# same functions. These have run on a CPU only; on GPUs, under `torchrun` with NCCL, they are
# written for it and have not run. Another number of ranks is refused, by name: only the HF
# callback also keeps a resharded copy.
#
# A model Accelerate shards with FSDP2 takes `FSDPMuon`: build it on the plain model, before
# `prepare`, and it plans at its first step on the parameters FSDP2 made (on any one-dimensional
# mesh: `Grid.from_mesh`). Accelerate does this on GPUs only (on a CPU it uses DDP, whatever its
# FSDP2 plugin says, and `FSDPMuon` then stops naming `grad_reduce="ddp"`);
# [`tests/test_fsdp.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_fsdp.py)
# runs its FSDP2 `prepare` on 3 CPU processes with its state set to FSDP2 by hand, bit for bit with
# `MuonW`.
#
# ## Your own model: a Hugging Face Llama (and a MoE)
#
# A `transformers` model built from its config (random weights, nothing downloaded):
# `hybrid_param_groups(model)` sorts parameters by module, not name. Embeddings, the output head
# (tied or not), norms, biases and MoE routers go to AdamW; hidden matrices and 3-D expert banks to
# Muon. `routing_table` says which and why:

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
# A Hugging Face Llama (Mistral and Qwen2 name their layers the same) splits as the tiny GPT does
# in {doc}`chapter 9 <09_training>`: q, k, v, gate and up `ColwiseParallel`, the attention output
# and down projection `RowwiseParallel`, embedding, norms and head whole. The package's plan:

# %%
listing("tp_plans.py", pyobject="llama_layer_plan")
listing("tp_plans.py", pyobject="parallelize_llama")

# %% [markdown]
# In the template, `parallelize_llama(model, grid.mesh["tp"])` replaces the `parallelize_module`
# call, before the optimizer is built; the loss is `model(input_ids=x, labels=x).loss`. Forget the
# split and a `dp=2, tp=4` grid still runs, at four times the work.
# [`tests/test_hf_models.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_hf_models.py)
# trains this Llama, a GPT-2 and the Mixtral under `DistributedMuon` and `FSDPMuon` on 2 x 1, the
# Llama also on 2 x 2 with TP, against one process, bit for bit.
#
# ## Already on DDP: against torch's ZeroRedundancyOptimizer
#
# Hugging Face Trainer, Accelerate and Lightning wrap the model in `DistributedDataParallel`,
# and torch alone then gives sharded, correct Muon:
#
# ```python
# model = DistributedDataParallel(model)   # all-reduces every gradient in backward
# muon = ZeroRedundancyOptimizer(matrices, optimizer_class=torch.optim.Muon)
# adamw = ZeroRedundancyOptimizer(the_rest, optimizer_class=torch.optim.AdamW)
# ```
#
# Each whole parameter has one owner, which holds its whole averaged gradient, runs
# Newton-Schulz on it and broadcasts the result.
# [`scripts/iteration_bench.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/iteration_bench.py)
# runs that, DDP with an unsharded `torch.optim.Muon`, and `DistributedMuon` in each layout, interleaved in one job on
# the same batches (a Llama from its config, here a small one on 2 ranks: about 30 s), checks that
# their losses agree, and counts every collective each one runs, DDP's and ZeRO's included:

# %%
from muongrid.lab.iteration_report import count_rows, time_rows  # noqa: E402

ddp = last_json(run("iteration_bench.py --dp 2 --models llama:128x2 --seq 64 "
                    "--runs 3 --iters 6", log="collapsed"))
vs = ddp["results"][0]
table(["per rank and iteration", "bytes sent", "collectives fwd / bwd / step",
       "busiest NS GFLOP", "bytes at dp 1,024", "busiest NS GFLOP at 1,024"],
      count_rows(vs), align="lrrrrr")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# The counts the prose quotes, and what it claims about them (they cannot flip with load).
o, z, t = (vs["options"][k] for k in ("owner", "zero", "torch"))
assert ddp["ok"] and max(o["bytes_per_rank"]) < min(z["bytes_per_rank"])
assert z["buckets"] == t["buckets"] and "step" not in t["by_stage"]
assert z["closed_form_at"]["1024"] > o["closed_form_at"]["1024"]
keep("ch12-zero-bytes", f"{max(z['bytes_per_rank']):,}")
keep("ch12-owner-bytes", f"{max(o['bytes_per_rank']):,}")
keep("ch12-bytes-ratio", f"{max(z['bytes_per_rank']) / max(o['bytes_per_rank']):.2f}")
keep("ch12-zero-calls", z["by_stage"]["step"]["calls"])
at_scale = z["closed_form_at"]["1024"] / o["closed_form_at"]["1024"]
keep("ch12-at-scale", f"{at_scale:.2f}")
gap = max(r["loss_gap"] for r in vs["options"].values())
keep("ch12-loss-gap", "exactly" if gap == 0 else f"to {gap:.0e}")
d = vs["options"]["ddp"]
keep("ch12-ddp-bytes", f"{max(d['bytes_per_rank']):,}")
fewer = max(d["bytes_per_rank"]) < min(z["bytes_per_rank"])
keep("ch12-ddp-fewer", "fewer" if fewer else "more")
ddp_scale = d["closed_form_at"]["1024"] / z["closed_form_at"]["1024"]
keep("ch12-ddp-scale", f"{ddp_scale:.2f}")
zero_ns = z["busiest_ns_at"]["1024"] / vs["options"]["group"]["busiest_ns_at"]["1024"]
assert zero_ns > 1
keep("ch12-ns-at-scale", f"{zero_ns:.0f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
Counted, so no busy machine can change it: each rank sends {{ch12-zero-bytes}} bytes an
iteration under DDP + ZeRO and {{ch12-owner-bytes}} under ours (owner layout), {{ch12-bytes-ratio}}
times less. DDP's all-reduce is a reduce-scatter and an all-gather of every gradient, and ZeRO then
broadcasts every parameter once more ({{ch12-zero-calls}} broadcasts in `step()`); ours
reduce-scatters the gradients, moves only the pieces of a matrix that are not on its owner (bf16),
and all-gathers the parameters. The closed form, which these counts equal, keeps the ratio at
1,024 ranks ({{ch12-at-scale}} x). ZeRO gives a matrix to the rank holding the fewest elements,
whole; ours to the rank with the least Newton-Schulz work, and `layout="group"` shares a large
matrix over several ranks: at 1,024 ranks ZeRO's busiest rank orthogonalises {{ch12-ns-at-scale}}
times more than ours under `group`. Every option's loss agreed with ZeRO's {{ch12-loss-gap}} at
every iteration.

Keeping DDP, `DistributedMuon(groups, grid, grad_reduce="ddp")` reads the gradients DDP averaged
and reduces nothing itself; each rank orthogonalises the whole matrices of its shard, and the
parameters are all-gathered where ZeRO broadcasts them: {{ch12-ddp-bytes}} bytes, {{ch12-ddp-fewer}}
than ZeRO's here. Its shards are cut on matrix boundaries, so they are uneven, and the all-gather
carries the padding: at 1,024 ranks the closed form gives it {{ch12-ddp-scale}} x ZeRO's bytes on
this small model.
""")

# %% [markdown]
# The clock, on the machine that built this page (milliseconds, the slowest rank; the whole
# iteration as the median of three runs and their range, then its ratio to ZeRO's run by run).
# The exposed reduction is, under DDP and ours with `grad_reduce="backward"`, how much longer backward
# takes than under `no_sync()`; for ours otherwise, the gradient reduce-scatter in `step()`:

# %%
table(["option", "whole iteration", "/ DDP + ZeRO", "backward", "exposed reduction",
       "Newton-Schulz", "step"], time_rows(vs), align="lrrrrrr")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
from muongrid.lab.iteration_report import time_verdict  # noqa: E402
from muongrid.lab.verdicts import fastest  # noqa: E402

keep("ch12-verdict", time_verdict(vs, "owner"))
winners = fastest({n: vs["options"][n]["whole_runs"] for n in ("owner", "zero")})
keep("ch12-clock", {2: "where, as here, the clock cannot tell the two apart",
                    1: "and here it was faster by the clock" if winners == ["zero"] else
                    "though even here ours was faster by the clock"}[len(winners)])
keep("ch12-load", f"{ddp['load_before']:.1f}")
keep("ch12-ddp-exposed", f"{t['parts']['exposed'] * 1e3:.0f}")
keep("ch12-ddp-reduction", f"{t['parts']['reduction'] * 1e3:.0f}")
keep("ch12-ours-reduction", f"{o['parts']['reduction'] * 1e3:.0f}")
b = vs["options"]["backward"]   # grad_reduce="backward": the same owner layout, reduced under backward
keep("ch12-bwd-exposed", f"{b['parts']['exposed'] * 1e3:.0f}")
keep("ch12-bwd-verdict", time_verdict(vs, "backward", "owner"))
keep("ch12-bwd-bytes", "the same bytes" if b["bytes_per_rank"] == o["bytes_per_rank"] else "other bytes")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
By the clock: {{ch12-verdict}} (load average {{ch12-load}} when it started; on two shared cores a
verdict needs the whole range of one option below the other's). DDP's all-reduce runs under
backward and takes {{ch12-ddp-reduction}} ms on its own; with it on, backward takes
{{ch12-ddp-exposed}} ms longer than under `no_sync()` (its bucket copies and its waits, and noise
that can even make it negative). Ours reduces in `step()` by default, after backward: all
{{ch12-ours-reduction}} ms of it in sight. With `grad_reduce="backward"` each bucket's reduce-scatter is
launched from backward as its last gradient lands ({{ch12-bwd-bytes}}, and the same parameters bit for bit):
its backward took {{ch12-bwd-exposed}} ms longer than under `opt.no_sync()`, and by the clock
{{ch12-bwd-verdict}}.

So: **`ZeroRedundancyOptimizer(torch.optim.Muon)` is enough** for DP alone, a few equal matrices,
and a few ranks, {{ch12-clock}}. **This package pays** where the counts
do: bytes per rank (every iteration, on every link), Newton-Schulz balanced by work rather than by
size (ZeRO cannot split a matrix), tensor parallelism and FSDP2, which ZeRO does not shard, and a
checkpoint that reshards onto another grid. Record it on GPUs with
`torchrun --standalone --nproc-per-node 2 scripts/iteration_bench.py --dp 2` (not run there yet).
""")

# %% [markdown]
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
One rule: **one learning rate for both groups, starting from AdamW's**. Moonshot's
`match_rms_adamw` scale (lr x 0.2 x sqrt(max(A, B))) gives a Muon step an AdamW step's size, so
AdamW's tuned lr is the start; then sweep it upwards. In {doc}`chapter 9 <09_training>`'s study
AdamW was best at {{ch12-adamw-lr}} and the hybrid at {{ch12-hybrid-lr}}
({{ch12-lr-ratio}} x AdamW's). This chapter passes 0.01, AdamW's best there; after `--warmup`
steps the lr follows a cosine down to a tenth.
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
# Everything else behaves as `torch.optim` documents, checked against `torch.optim.Muon` and
# `torch.optim.AdamW` at world sizes 1 to 4 by
# [`tests/test_contract.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_contract.py):
# frozen parameters (gradient None on every rank) are skipped, None on some ranks counts as zeros,
# schedulers, hooks and `copy.deepcopy` work, and bad hyperparameters are refused at build time.
# What differs, and what to do:
#
# - **Default lr scaling**: ours is Moonshot's `match_rms_adamw` (the rule above), torch's
#   "original" lr x sqrt(max(1, A/B)); to port a `torch.optim.Muon` run with its lr, pass
#   `adjust_lr_fn=None`.
# - **Clipping**: `opt.clip_grad_norm_(1.0)`, as above (FSDP2's `.grad` are blocks too).
# - **`state_dict()`**: this rank's shard; loading another rank's is refused. Use
#   `muongrid.checkpoint` / `save_run` to change grids.
# - **Pickling (`torch.save(opt)`)**: refused, naming the fix (process groups cannot be pickled).
# - **`add_param_group`**: refused; the ZeRO-1 plan and FSDPMuon's owners are fixed at build time.
# - **A step without any gradient**: a no-op plus one small on-device all-reduce of flags, since
#   every rank must agree which parameters to skip.
#
# ## Summary
#
# - Build the grid, split the model (or `fully_shard` it), build `DistributedMuon` (or
#   `FSDPMuon`) from `hybrid_param_groups`, and train as with any torch optimizer.
# - Clip with `opt.clip_grad_norm_`; checkpoint on every rank, resume on any grid.
# - Under a trainer that wraps the model in DDP: `grad_reduce="ddp"`, and the trainer's hook that
#   keeps every rank's shard (`ShardedCheckpoint`, `ShardedState`, the two Lightning strategies).
# - One lr for both groups, from AdamW's, swept upwards; weight decay 0.1 unless you set it.
# - Copy [`scripts/loop_zero1_tp.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/loop_zero1_tp.py)
#   (or [`scripts/loop_fsdp.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/loop_fsdp.py)).
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

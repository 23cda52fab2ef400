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
# # 11. Muon on FSDP2 models
#
# ```{admonition} What this chapter runs
# Four short trainings of the tiny GPT, launched as separate processes on a 2 x 2
# and a 2 x 1 grid (a few seconds each).
# Reading: about 25 minutes at 200 words, 8 lines of code or one figure a minute, plus running it. Read first: {doc}`chapter 2 <02_distributed_map>` and {doc}`chapter 8 <08_beyond_poc>`.
# ```
#
# "Does it work with FSDP2?" is the question asked most in every Muon repository. PyTorch's
# `torch.optim.Muon` takes a `fully_shard` model and gets the right result, but {term}`FSDP2`
# {cite:p}`pytorch2025fsdp2` gives every rank a block of rows, so {term}`DTensor` quietly gathers
# each matrix on every rank and every rank orthogonalises every matrix. This chapter sets ZeRO-1 x
# TP, FSDP2 and FSDP2 x TP side by side and measures `muongrid.fsdp.FSDPMuon`, one owner per matrix,
# against `torch.optim.Muon` on the same FSDP2 model and batches.
#
# **Learning goals.** After this chapter you can
#
# - say what ZeRO-1, FSDP2 and FSDP2 x TP each shard, and what each moves per step for Muon and
#   for AdamW;
# - explain why `torch.optim.Muon` on FSDP2 parameters is correct but moves far more than it needs;
# - read `train.py --compare-torch-muon`'s report, and pick a layout for a model of your own.

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
    wanted = []
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
# ## What each one shards
#
# | | parameters (the model's weights) | gradients | optimizer state | who assembles a matrix for Newton-Schulz |
# |---|---|---|---|---|
# | **ZeRO-1 x TP** (`DistributedMuon`) | whole on every DP rank (TP shards) | reduce-scattered into flat shards by the optimizer | flat shards, cut anywhere | its owner (layout "owner"), from the flat pieces |
# | **FSDP2** (`fully_shard` on "dp") | row blocks (`Shard(0)`), gathered by FSDP2 for forward and backward | reduce-scattered by FSDP2 into row blocks | row blocks, like the parameter | its owner, from the row blocks |
# | **FSDP2 x TP** (`parallelize_module` on "tp", then `fully_shard` on "dp") | row blocks of each TP shard | row blocks of each TP shard | the same blocks | its owner, from blocks split both ways |
#
# Under ZeRO-1 the optimizer moves gradients in and parameters out itself. Under FSDP2, FSDP2 does
# both; the optimizer gets its blocks already averaged and moves only what Newton-Schulz needs
# (for AdamW, nothing).
#
# DTensor's `compute_local_shape_and_global_offset` gives every rank's rectangle of each matrix,
# uneven rows and FSDP2-over-TP's `_StridedShard` included. {term}`FSDPMuon` collects them once and
# sends each matrix's blocks to its owner (chosen as in {doc}`chapter 8 <08_beyond_poc>`) in one bf16
# all-to-all, and the results back in another. {numref}`fig-ch11-holders` draws a 2 x 2 grid.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-ch11-holders", "caption": "Two matrices, `w0` (64 x 64) and `w1` (192 x 64), both split by rows over TP (dashed line), on a 2 x 2 grid: what each rank holds of them. ZeRO-1 x TP (top, from `build_plan` with the owner layout) keeps every weight's whole TP shard on each DP rank, and cuts the optimizer state as one flat buffer: `w0` falls whole into DP rank 0's shard, only `w1` is cut. FSDP2 x TP (bottom, row blocks as `torch.chunk` cuts them; owners from `fsdp_routes.routes`, as `FSDPMuon` picks them) keeps only a block of rows of every weight at rest (it gathers the TP shard for forward and backward) and the state in the same blocks, so every matrix is cut over DP. Under both, one owner per matrix (red) runs Newton-Schulz on the whole matrix; every block not on the owner travels there and back."}} jupyter={"source_hidden": true}
import matplotlib.pyplot as plt
from muongrid.lab.page import keep, listing, say, show

from muongrid.lab.diagrams import book_style, holders_diagram

book_style()
show(holders_diagram(((64, 64), (192, 64)), dp=2, tp=2))
plt.close("all")

# %%
from muongrid.lab.notebook import last_json, run, table
from muongrid.lab.page import keep, listing, say, show

TINY = ("--width 64 --layers 2 --heads 4 --context 32 --batch 8 --steps 4 "
        "--eval-every 4 --eval-batches 1 --eval-batch 8 --metrics-every 0 --threads 1 "
        "--lr 0.01")
GRIDS = {
    "ZeRO-1 x TP, Muon (2x2)": "--dp 2 --tp 2 --layout owner",
    "ZeRO-1 x TP, AdamW (2x2)": "--dp 2 --tp 2 --optimizer adamw",
    "FSDP2 x TP (2x2)": "--fsdp --dp 2 --tp 2 --compare-torch-muon",
    "FSDP2 (2x1)": "--fsdp --dp 2 --tp 1 --compare-torch-muon",
}
runs = {name: last_json(run(f"train.py {grid} {TINY}", log="collapsed"))
        for name, grid in GRIDS.items()}

# %% [markdown]
# Each run trains the hybrid tiny GPT on the same four batches; the FSDP2 runs also train a copy
# with `torch.optim.Muon` (and `torch.optim.AdamW`) beside ours. The FSDP2 x TP run's placements:
# a `ColwiseParallel` matrix is `_StridedShard` on "dp" and `Shard(0)` on "tp"; the replicated head
# `Shard(0)` on "dp" only.

# %%
placements = runs["FSDP2 x TP (2x2)"]["tp_split_dims"]
table(
    ["parameter", "placements (dp, tp)"],
    [
        [n, ", ".join(p)]
        for n, p in placements.items()
        if n.startswith("blocks.0") or "head" in n or "tok" in n
    ],
)

# %% [markdown]
# ## What each one moves per step
#
# The optimizer's own traffic per rank and step, from the ledger. Under FSDP2 the gradient
# reduce-scatter and parameter all-gather are FSDP2's, the same for any optimizer, and not in it.

# %%
phase_rows = []
for name, r in runs.items():
    for phase, p in r["ledger"]["phases"].items():
        phase_rows.append([name, phase, p["dtype"], p["calls"], p["bytes_sent"]])
    if not r["ledger"]["phases"]:
        phase_rows.append([name, "(nothing)", "", 0, 0])
table(
    ["run", "phase", "dtype", "calls", "bytes sent (rank 0)"], phase_rows, align="lllrr"
)
zero1_muon = runs["ZeRO-1 x TP, Muon (2x2)"]["ledger"]["phases"]
zero1_adamw = runs["ZeRO-1 x TP, AdamW (2x2)"]["ledger"]["phases"]
fsdp_ns = runs["FSDP2 x TP (2x2)"]["ledger"]["phases"]
same_owner_traffic = {
    k: zero1_muon[k]["bytes_sent"] for k in ("ns_to_owner", "ns_from_owner")
}
print("ZeRO-1 AdamW's phases:", sorted(zero1_adamw))
print("Muon's extra under ZeRO-1 (to and from the owners):", same_owner_traffic)
print(
    "FSDPMuon's whole traffic under FSDP2 x TP:",
    {k: v["bytes_sent"] for k, v in fsdp_ns.items()},
)
owner_bytes = {
    "zero1": sum(same_owner_traffic.values()),
    "fsdp": sum(fsdp_ns[k]["bytes_sent"] for k in ("ns_to_owner", "ns_from_owner")),
}

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
# The text below: the owner trips are larger under FSDP2, whose Shard(0) cuts every
# matrix over DP.
assert owner_bytes["fsdp"] > owner_bytes["zero1"], owner_bytes
keep("ch11-owner-zero1", f"{owner_bytes['zero1']:,}")
keep("ch11-owner-fsdp", f"{owner_bytes['fsdp']:,}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
The owner trips are the same kind under both (bf16 blocks of each Muon matrix not already on its
owner); their size is set by the sharding. FSDP2's `Shard(0)` cuts every matrix over DP, while
ZeRO-1's flat buffer leaves a matrix inside one rank's shard whole. On the same 2 x 2 grid rank 0's
owner trips move {{ch11-owner-fsdp}} bytes under FSDP2 against {{ch11-owner-zero1}} under
ZeRO-1.
""")

# %% [markdown]
# ## FSDPMuon against torch.optim.Muon, on the same FSDP2 model
#
# `train.py --compare-torch-muon` trains both in one run; torch's traffic is counted by
# `CommDebugMode` and priced with our ledger's formulas
# ([`muongrid/lab/dtensor_comm.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/lab/dtensor_comm.py)).

# %%
rows, ratios = [], {}
for name in ("FSDP2 x TP (2x2)", "FSDP2 (2x1)"):
    c = runs[name]["compare"]
    for key, label in (
        ("bytes_per_step", "bytes per step (rank 0)"),
        ("bytes_per_step_all_ranks", "bytes per step (all ranks)"),
        ("collectives_per_step", "collectives per step (rank 0)"),
        ("ns_calls_per_step_all_ranks", "Newton-Schulz calls per step (all ranks)"),
        ("optimizer_ms", "optimizer ms (rank 0, mean)"),
        ("step_ms", "step ms (rank 0, mean)"),
        ("final_loss", "loss at the last step"),
    ):
        a, b = c[key]["muongrid"], c[key]["torch"]
        fmt = (
            (lambda v: f"{v:.4f}")
            if key == "final_loss"
            else (lambda v: f"{v:,.1f}") if key.endswith("ms") else (lambda v: f"{v:,}")
        )
        rows.append([name, label, fmt(a), fmt(b)])
    ratios[name] = c
table(["grid", "per step", "muongrid FSDPMuon", "torch.optim.Muon"], rows, align="llrr")
c22 = ratios["FSDP2 x TP (2x2)"]
loss_pairs = zip(c22["step_loss_torch"], runs["FSDP2 x TP (2x2)"]["step_loss"])
print("torch's collectives by op, rank 0, 2x2:", c22["torch_by_op"])

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
keep(
    "ch11-bytes-ratio",
    f"{c22['bytes_per_step']['torch'] / c22['bytes_per_step']['muongrid']:.0f}",
)
keep("ch11-coll-torch", f"{c22['collectives_per_step']['torch']:,}")
keep("ch11-coll-ours", f"{c22['collectives_per_step']['muongrid']:,}")
keep("ch11-ns-ours", f"{c22['ns_calls_per_step_all_ranks']['muongrid']}")
keep("ch11-ns-torch", f"{c22['ns_calls_per_step_all_ranks']['torch']}")
keep("ch11-time-ratio", f"{c22['optimizer_time_ratio']:.1f}")
keep("ch11-loss-gap", f"{max(abs(a - b) for a, b in loss_pairs):.1e}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
On the 2 x 2 grid torch's step sends {{ch11-bytes-ratio}} times our bytes from rank 0, in
{{ch11-coll-torch}} collectives against {{ch11-coll-ours}}, and runs Newton-Schulz
{{ch11-ns-torch}} times per step against our {{ch11-ns-ours}} (once per matrix). It took
{{ch11-time-ratio}} times as long (noisy on a shared 2-core CPU; the counts are not). The loss
curves differ by at most {{ch11-loss-gap}} nats per step: the same method, summed in another
order ([`tests/test_fsdp.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_fsdp.py)
checks FSDPMuon bit for bit against single-device Muon on 2x1, 4x1, 2x2 and after resharding).
""")

# %% [markdown]
# Why so many collectives? Each `X @ X.T` on a row-sharded `X` needs the other rows and each norm
# an all-reduce, in every iteration, on every rank, for every matrix: correct, and the most
# expensive way.

# %% [markdown]
# ## Orthogonalise the shard? Another optimizer
#
# FSDPMuon's owner trips exist because Newton-Schulz needs each matrix whole. A shortcut skips
# them: run Newton-Schulz on each rank's block as if it were the matrix, with the learning rate
# adjusted for the block's shape, which is what a Muon optimizer computes when it is handed the
# local shard of a sharded parameter. Call it **shard-local Newton-Schulz**. It needs no
# communication at all (no all-to-all, no owner), and each rank orthogonalises small blocks
# instead of whole matrices. But the blocks of an orthogonalised matrix are not the
# orthogonalised blocks, so it is a different optimizer, not a cheaper way to run Muon.
# [`muongrid/lab/shard_ortho.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/lab/shard_ortho.py)
# holds it as pure functions and as a `MuonW` that trains with it (with one shard, both are Muon
# bit for bit: `tests/test_shard_ortho.py`). Here it runs in this process, on a smaller tiny GPT,
# beside Muon on whole matrices: how far the update moves as the shard count grows (rows cut as
# FSDP2 cuts them, columns as a row-wise TP split does), and what it does to a short training
# from the same start on the same batches.

# %%
import time

import torch
from muongrid.lab.charlm import TinyGPT, load_corpus, train
from muongrid.lab.shard_ortho import ShardMuonW, muon_direction, relative_difference
from muongrid.optim import MuonW, hybrid_param_groups

data = load_corpus()
SHARD_STEPS, SHARDS, CUTS = 150, (1, 2, 4, 8), {"rows": 0, "columns": 1}
hyper = dict(lr=0.01, weight_decay=0.1)
optimizers = {  # name -> how each Muon matrix is orthogonalised
    "whole": lambda groups: MuonW(groups),
    "rows, 4 shards": lambda groups: ShardMuonW(groups, shards=4, dim=0),
    "columns, 4 shards": lambda groups: ShardMuonW(groups, shards=4, dim=1),
}
started, shard_runs = time.perf_counter(), {}
for name, make in optimizers.items():
    torch.manual_seed(0)  # the same start; train() draws the same batches
    net = TinyGPT(data["vocab_size"], d=64, n_layer=2, n_head=4, context=32)
    opt = make(hybrid_param_groups(net, muon=hyper,
                                   adamw=dict(hyper, betas=(0.9, 0.95))))
    shard_runs[name] = train(net, opt, data, steps=SHARD_STEPS, batch_size=16,
                             eval_every=SHARD_STEPS // 3)
    if name == "whole":  # the momentum of each Muon matrix at the end of Muon's run
        momenta = [opt.state[p]["momentum_buffer"] for p in net.parameters()
                   if "momentum_buffer" in opt.state.get(p, {})]
        diffs = {(cut, n): [relative_difference(m, n, dim) for m in momenta]
                 for cut, dim in CUTS.items() for n in SHARDS}
seconds = time.perf_counter() - started
table(["cut", "shards", "least", "mean", "most"],
      [[cut, n, f"{min(d):.3f}", f"{sum(d) / len(d):.3f}", f"{max(d):.3f}"]
       for (cut, n), d in diffs.items()], align="lrrrr")
for name, h in shard_runs.items():
    print(f"{name}: validation loss {h['val_loss'][-1]:.3f} after {SHARD_STEPS} steps")
print(f"{len(momenta)} Muon matrices; the three trainings and the differences took "
      f"{seconds:.1f} s here")

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-ch11-shard-ortho", "caption": "Newton-Schulz on shards against Muon on whole matrices, for the smaller tiny GPT trained in this process. Left: how far each Muon matrix's update moves, |shard-local update - Muon's| / |Muon's| on the momentum at the end of Muon's run (mean over the matrices, bars from least to most), as the matrix is cut into blocks of rows (as FSDP2 cuts it) or of columns; one shard is Muon exactly. Right: validation loss of three trainings from the same start on the same batches: Muon, and shard-local Newton-Schulz on 4 blocks of rows or of columns."}} jupyter={"source_hidden": true}
from muongrid.lab import palette

fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.6))
for cut in CUTS:
    mean = [sum(diffs[cut, n]) / len(diffs[cut, n]) for n in SHARDS]
    low = [m - min(diffs[cut, n]) for m, n in zip(mean, SHARDS)]
    high = [max(diffs[cut, n]) - m for m, n in zip(mean, SHARDS)]
    left.errorbar(SHARDS, mean, yerr=[low, high], marker="o", capsize=3,
                  label=f"{cut} cut", color=palette.SHARD_CUT[cut])
left.set(xscale="log", xlabel="shards per matrix", title="the update, against Muon's",
         ylabel="relative difference of the update")
left.set_xticks(SHARDS, [str(n) for n in SHARDS])
left.minorticks_off()
for name, h in shard_runs.items():
    right.plot(h["val_steps"], h["val_loss"], marker="o", label=name,
               color=palette.SHARD_CUT[name.split(",")[0]])
right.set(xlabel="step", ylabel="nats per character", title="validation loss")
for ax in (left, right):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
fig.tight_layout()
show(fig)
plt.close(fig)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert all(d == 0.0 for cut in CUTS for d in diffs[cut, 1])  # one shard: Muon, bit for bit
rounding = [float((muon_direction(m, dtype=torch.float32) - muon_direction(m)).norm()
                  / muon_direction(m).norm()) for m in momenta]
# the least a cut moves any matrix is more than fp32 Newton-Schulz moves the most-moved one
assert min(min(diffs[cut, n]) for cut in CUTS for n in SHARDS[1:]) > max(rounding)


def mean_diff(cut, n):
    return f"{sum(diffs[cut, n]) / len(diffs[cut, n]):.2f}"


means = {cut: [sum(diffs[cut, n]) for n in SHARDS[1:]] for cut in CUTS}
grows = all(a < b for m in means.values() for a, b in zip(m, m[1:]))

final = {name: h["val_loss"][-1] for name, h in shard_runs.items()}
keep("ch11-shard-steps", SHARD_STEPS)
keep("ch11-shard-matrices", len(momenta))
keep("ch11-shard-rows-2", mean_diff("rows", 2))
keep("ch11-shard-cols-2", mean_diff("columns", 2))
keep("ch11-shard-rows-8", mean_diff("rows", 8))
keep("ch11-shard-cols-8", mean_diff("columns", 8))
keep("ch11-shard-rounding", f"{max(rounding):.3f}")
keep("ch11-shard-whole", f"{final['whole']:.3f}")
keep("ch11-shard-rows", f"{final['rows, 4 shards']:.3f}")
keep("ch11-shard-cols", f"{final['columns, 4 shards']:.3f}")
keep("ch11-shard-seconds", f"{seconds:.0f}")
keep("ch11-shard-trend", "grows with every further cut" if grows
     else "does not go away as the cuts multiply")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
Cut into two blocks of rows, the update of the {{ch11-shard-matrices}} Muon matrices moves by
{{ch11-shard-rows-2}} of its norm on average ({{ch11-shard-cols-2}} for two blocks of columns),
and by {{ch11-shard-rows-8}} and {{ch11-shard-cols-8}} at eight. Running Newton-Schulz in fp32
instead of bf16, which nobody would call another optimizer, moves it by at most
{{ch11-shard-rounding}}. The difference comes with the first cut and {{ch11-shard-trend}}, so
it depends on how many ranks hold a matrix: the same model trained on 2 or on 8 ranks would
follow different paths. After
{{ch11-shard-steps}} steps from the same start, Muon reached a validation loss of
{{ch11-shard-whole}}, shard-local Newton-Schulz {{ch11-shard-rows}} (rows) and
{{ch11-shard-cols}} (columns): one seed and one learning rate, so this shows that the two
optimizers differ, not by how much in general. What the shortcut saves is real: every owner
trip, which on the 2 x 2 grid above was {{ch11-owner-fsdp}} bytes a step from rank 0, and each
whole matrix's Newton-Schulz on its owner. What it costs is Muon itself. (These runs added
{{ch11-shard-seconds}} s to this chapter here.)
""")

# %% [markdown]
# ## Checkpoints
#
# `muongrid.checkpoint.save` and `load` take an FSDPMuon too. Its state is torch's
# (`momentum_buffer`, `exp_avg`, `exp_avg_sq`, `step`) as DTensors placed like the parameters, so
# DCP reshards it: the tests save on 2 x 2 and continue on 3 x 1, on 2 x 1 and continue on 1 x 1 or
# 2 x 2, bit for bit with an uninterrupted run.

# %% [markdown]
# ## When to pick which
#
# - **ZeRO-1 x TP** when the weights fit on every DP rank (with TP): gradients and parameters
#   travel once per step, and the layouts trade Newton-Schulz work against bytes.
# - **FSDP2** when the weights do not fit, or your code is built on `fully_shard`: FSDP2 gathers the
#   weights for forward and backward (more traffic than ZeRO-1's one all-gather), and FSDPMuon adds
#   only the owner trips.
# - **FSDP2 x TP** when one layer is too large for one device, or to keep the DP group small.
#
# In every case, orthogonalise each whole matrix once, on one rank: not on every rank (that is
# `torch.optim.Muon` on DTensors), and not a block alone (another optimizer, measured above).

# %% [markdown]
# ## Summary

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
- {term}`FSDPMuon` sends each Muon matrix's blocks, wherever DTensor placed them, to one owner
  and back, one bf16 all-to-all each way; under FSDP2 that is all its ledger holds.
- `torch.optim.Muon` on the same model is correct but sent {{ch11-bytes-ratio}} times the bytes
  and ran Newton-Schulz {{ch11-ns-torch}} times against {{ch11-ns-ours}}.
- DCP reshards FSDPMuon's checkpoints. Pick ZeRO-1 x TP when the weights fit on every DP rank,
  FSDP2 (+ TP) when they do not; {doc}`chapter 13 <13_what_to_pick>` prices the choice.
""")

# %% [markdown]
# ## Exercises
#
# 1. Run `python scripts/train.py --fsdp --dp 3 --tp 1 --batch 12 --steps 6 --compare-torch-muon` (uneven rows).
#    How do the bytes per rank differ between the three ranks, and why?
# 2. In the FSDP2 x TP run, which matrices are sent by only one of two TP ranks, and why is that
#    enough? (Hint: [`muongrid/fsdp_routes.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/fsdp_routes.py), "senders".)
# 3. With `--optimizer muon`, the embeddings and the head join Muon. On `--fsdp --dp 2 --tp 1`,
#    predict how each rank's owner traffic changes, then measure it.

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# The exercises' answers, computed and checked (the solutions below quote them).
import torch
from muongrid import hybrid_param_groups
from muongrid.fsdp_routes import Piece, routes
from muongrid.lab.charlm import TinyGPT, load_corpus


def matrix_shapes(width, optimizer="hybrid"):
    with torch.device("meta"):
        net = TinyGPT(load_corpus()["vocab_size"], d=width, n_layer=2, n_head=4)
    if optimizer == "muon":  # every matrix, the embeddings and the head too
        return [tuple(p.shape) for p in net.parameters() if p.ndim == 2]
    return [tuple(p.shape) for g in hybrid_param_groups(net.named_parameters())
            if g["use_muon"] for p in g["params"]]


def owner_trips(shapes, dp):
    """Each rank's bytes to and from the owners (bf16), and its Newton-Schulz calls, from
    FSDP2's cut alone: torch.chunk over the rows, as fully_shard does."""
    def cut(rows, cols, r):
        chunks = torch.arange(rows).chunk(dp)
        mine = chunks[r] if r < len(chunks) else torch.arange(0)
        start = int(mine[0]) if len(mine) else rows
        return Piece((start, 0), (len(mine), cols))

    plan = routes(shapes, [[cut(*s, r) for s in shapes] for r in range(dp)], tp=1)
    out = []
    for r in range(dp):
        sent, back = plan.send_counts(r), plan.back_counts(r)
        out.append(2 * (sum(sent) - sent[r] + sum(back) - back[r]))
    return out, [len(plan.owned(r)) for r in range(dp)]


# the geometry prices what the chapter's own FSDP2 run sent (rank 0, width 64, dp = 2)
phases = runs["FSDP2 (2x1)"]["ledger"]["phases"]
assert owner_trips(matrix_shapes(64), 2)[0][0] == sum(
    phases[k]["bytes_sent"] for k in ("ns_to_owner", "ns_from_owner"))
uneven, calls3 = owner_trips(matrix_shapes(128), 3)
assert uneven[0] == uneven[1] > uneven[2]
keep("ch11-ex1-bytes", ", ".join(f"{b:,}" for b in uneven))
keep("ch11-ex1-calls", calls3)
hybrid, h_calls = owner_trips(matrix_shapes(128), 2)
everything, m_calls = owner_trips(matrix_shapes(128, "muon"), 2)
assert all(m > h for m, h in zip(everything, hybrid))
keep("ch11-ex3-hybrid", ", ".join(f"{b:,}" for b in hybrid))
keep("ch11-ex3-muon", ", ".join(f"{b:,}" for b in everything))
keep("ch11-ex3-calls", f"{m_calls} against {h_calls}")
keep("ch11-ex3-matrices", f"{sum(m_calls)} matrices against {sum(h_calls)}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
:::{admonition} Solutions
:class: dropdown

1. The owner trips (`ns_to_owner` plus `ns_from_owner` in the JSON's ledger) come to
   {{ch11-ex1-bytes}} bytes on ranks 0, 1 and 2: byte counts of the plan, the same on any
   machine, which the build computes from FSDP2's cut and `fsdp_routes.routes` alone (and checks
   against the FSDP2 run above). FSDP2 cuts rows with
   `torch.chunk`, so when a matrix's rows do not divide by 3 the last rank holds fewer rows, and it
   sends (and gets back) fewer elements. Newton-Schulz is uneven too: `ns_calls_per_step` is
   `{{ch11-ex1-calls}}`, the 8 matrices of the two blocks over 3 owners.
2. In the hybrid run, none: every Muon matrix (qkv, proj, fc, out) is split over TP, so the two TP
   ranks hold different rectangles and both send. Only a matrix replicated over TP is sent once per
   TP pair: both TP ranks hold the same rectangle, and `routes` picks one sender per distinct
   rectangle (the TP rank in the owner's TP column, else the lowest). With `--optimizer muon` that
   is the head and the two embeddings: computed with `fsdp_routes.routes` for a head `Shard(0)` on
   "dp" of a 2 x 2 grid, its senders are ranks {1, 3} for owner 1, where a qkv matrix has all four.
   Sending both copies would move the same bytes twice; every rank still gets its own rectangle back.
3. Prediction: the three new matrices add their pieces that are not on their owner, there and
   back, and their Newton-Schulz runs. Measure it with `python scripts/train.py --fsdp --dp 2 --tp 1
   --batch 8 --steps 2 --optimizer muon` against the same command with `--optimizer hybrid`
   (`ns_to_owner` plus `ns_from_owner` in the JSON's ledger). The plan gives
   {{ch11-ex3-muon}} bytes on ranks 0 and 1 against {{ch11-ex3-hybrid}}, and Newton-Schulz
   calls `{{ch11-ex3-calls}}` ({{ch11-ex3-matrices}}). The increase is small because the
   tiny GPT's vocabulary and context are small next to its block matrices.
:::
""")

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
# # 9. Training a model with DP x TP
#
# ```{admonition} What this chapter runs
# [`scripts/train.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/train.py) on four grids, the convergence study's script at a short
# length, and [`scripts/profile_step.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/profile_step.py) on three grids. The full study is too long to rerun on
# every build; its recorded result is read from `book/data/`, with the command that made it.
# Reading: about 35 minutes at 200 words, 8 lines of code or one figure a minute, plus running it. Read first: {doc}`chapter 1 <01_muon>` and {doc}`chapter 8 <08_beyond_poc>`.
# ```
#
# So far every step ran on synthetic matrices. Two questions remain: does Distributed Muon work on
# a model split with PyTorch's own tensor-parallel layers, and is it worth it once AdamW is tuned as
# carefully? This chapter trains {doc}`chapter 1 <01_muon>`'s tiny GPT on four grids, looks inside
# the optimizer, weighs Muon against AdamW with tuned learning rates and several seeds, and
# profiles whole steps on three 4-rank grids.
#
# **Learning goals.** After this chapter you can
#
# - make a model tensor-parallel with `parallelize_module` and hand it to `DistributedMuon`, which
#   reads each matrix's split from its {term}`DTensor` placement {cite:p}`pytorch2025dtensor`;
# - explain why four grids trained on the same data agree only up to the order of floating-point
#   sums, not bit for bit;
# - read Muon's optimizer-state metrics: what Newton-Schulz does to the spectrum of the momentum;
# - judge an optimizer comparison: tuned learning rates, several seeds, equal tokens;
# - say which of the paper's and the report's claims hold for a real model on this machine.

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
# ## The model, split with PyTorch's own layers

# %% [markdown]
# `DistributedMuon` reads each matrix's split from its DTensor placement (`Shard(0)`: rows,
# `Shard(1)`: columns, `Replicate()` or a plain tensor: not split) and gathers split matrices whole
# for Newton-Schulz, as in {doc}`chapter 5 <05_distributed_step>`. The first run: 20 steps on a
# 2 x 2 grid, the hybrid optimizer (Muon for the block matrices, AdamW for embeddings, head and
# norms), the owner layout of {doc}`chapter 8 <08_beyond_poc>`, state metrics every 10 steps:

# %%
import matplotlib.pyplot as plt
from muongrid.lab.page import keep, listing, say, show

from muongrid.lab.notebook import last_json, run, table

COMMON = "--optimizer hybrid --steps 20 --eval-every 10 --threads 1"
runs = {(2, 2): last_json(run(f"train.py --dp 2 --tp 2 --layout owner {COMMON}"))}

# %%
first = runs[(2, 2)]
table(["parameter", "placement the plan read", "TP split dim"],
      [[name,
        {0: "Shard(0): rows", 1: "Shard(1): columns"}.get(dim,
                                                           "whole on every TP rank"),
        dim]
       for name, dim in first["tp_split_dims"].items() if name.startswith("blocks.0.")])

# %% jupyter={"source_hidden": true} tags=["remove-cell"]
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
keep("ch9-model", f"{first['layers']} transformer blocks, width {first['width']}, "
     f"{first['heads']} heads, {first['n_params']:,} parameters")

# %% jupyter={"source_hidden": true} tags=["remove-input"]
say(r"""
The model is {doc}`chapter 1 <01_muon>`'s character-level GPT ({{ch9-model}}), made
tensor-parallel by [`muongrid/lab/tpgpt.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/lab/tpgpt.py)
with `parallelize_module` on the grid's "tp" mesh dimension, in Megatron-LM's split
{cite:p}`shoeybi2019megatron`: the fused query-key-value projection and the first MLP matrix are
`ColwiseParallel` (each TP rank holds some output rows: whole heads, a slice of the hidden units),
the attention output and the second MLP matrix `RowwiseParallel` (the matching input columns, the
partial outputs summed by one all-reduce per sub-layer). Embeddings, norms and head stay whole.
""")

# %% jupyter={"source_hidden": true} mystnb={"figure": {"caption": "The four matrices of one block, drawn to scale, and what each of the two TP ranks holds, as the optimizer read it from the placements: the column-parallel `qkv` and `fc` are cut into rows, the row-parallel `proj` and `out` into columns.", "name": "fig-ch9-tp-plan"}} tags=["hide-input"]
from muongrid.lab import palette
from muongrid.lab.charlm import TinyGPT

shapes = {n: tuple(p.shape) for n, p in TinyGPT(vocab_size=96).named_parameters()
          if n.startswith("blocks.0.")}
matrices = [n for n in shapes if len(shapes[n]) == 2]
tp = first["tp"]
fig, ax = plt.subplots(figsize=(7.2, 3.0))
x = 0.0
for name in matrices:  # side by side, drawn to one scale
    rows_, cols = shapes[name]
    dim = first["tp_split_dims"][name]
    for r in range(tp):
        x0, y0 = (x, r * rows_ / tp) if dim == 0 else (x + r * cols / tp, 0)
        w, h = (cols, rows_ / tp) if dim == 0 else (cols / tp, rows_)
        ax.add_patch(plt.Rectangle((x0, y0), w, h,
                                   facecolor=palette.rank(r),
                                   edgecolor="white", lw=2))
        ax.text(x0 + w / 2, y0 + h / 2, f"TP {r}", ha="center", va="center",
                color="white", fontsize=8, rotation=90 if w < h and w < 100 else 0)
    ax.text(x + cols / 2, -20, f"{name.split('.')[-2]}\n{rows_} x {cols}\nShard({dim})",
            ha="center", va="bottom", fontsize=8)
    x += cols + 60
ax.set(xlim=(-10, x), ylim=(max(shapes[n][0] for n in matrices) + 10, -150),
       aspect="equal")
ax.axis("off")
fig.tight_layout()
show(fig)
plt.close(fig)

# %% [markdown]
# ## Same data, four grids, one loss curve
#
# Every rank draws the same global batch from one seeded generator; each DP replica trains on its
# slice, and the reduce-scatter averages the replicas' gradients, so every grid follows the same
# global mean loss. One process, two DP ranks and two TP ranks against the 2 x 2 run:

# %%
for dp, tp_ in [(1, 1), (2, 1), (1, 2)]:
    runs[(dp, tp_)] = last_json(run(f"train.py --dp {dp} --tp {tp_} --layout owner "
                                    f"{COMMON} --metrics-every 0", log="collapsed"))

# %% mystnb={"figure": {"caption": "Training loss per step of the same run on four grids (top) and each grid's distance from the one-process run (bottom, log scale).", "name": "fig-ch9-grids"}}
ref = runs[(1, 1)]["step_loss"]
fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 4.4), sharex=True,
                                  height_ratios=[2, 1])
drift = {}
for (dp, tp_), r in runs.items():
    steps = range(1, len(r["step_loss"]) + 1)
    top.plot(steps, r["step_loss"], label=f"{dp} x {tp_}", lw=1.5,
             ls="-" if (dp, tp_) == (1, 1) else "--")
    if (dp, tp_) != (1, 1):
        diff = [abs(a - b) for a, b in zip(r["step_loss"], ref)]
        drift[f"{dp} x {tp_}"] = max(diff)
        bottom.semilogy(steps, [max(d, 1e-9) for d in diff], label=f"{dp} x {tp_}")
top.set(ylabel="training loss (nats)")
top.legend(title="DP x TP", fontsize=8)
bottom.set(xlabel="step", ylabel="|loss - 1 x 1|")
fig.tight_layout()
show(fig)
plt.close(fig)

# %%
worst = max(drift.values())
table(["grid", "largest |loss - 1 x 1| over 20 steps"],
      [[g, f"{d:.1e}"] for g, d in drift.items()])

# %% jupyter={"source_hidden": true} tags=["remove-cell"]
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert worst < 2e-3, drift  # tests/test_train.py's tolerance, justified there
keep("ch9-grid-drift", f"{worst:.0e}")
keep("ch9-loss-fall", f"{ref[0]:.2f} to {ref[-1]:.2f}")

# %% jupyter={"source_hidden": true} tags=["remove-input"]
say(r"""
The curves lie on top of each other (the loss falls from {{ch9-loss-fall}} nats in 20
steps) and differ by at most {{ch9-grid-drift}} nats. Unlike the synthetic runs of chapters 5
and 8 they are not bit for bit equal, and should not be: DP and TP add the same numbers in
another order, and Newton-Schulz in bf16 can round a last-bit difference up to a bf16 step.
[`tests/test_train.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_train.py)
allows 2e-3 nats, far below what a real fault does (exercise 4 breaks the data split).
""")

# %% [markdown]
# ## What Newton-Schulz does to the momentum
#
# `train.py` can measure, for every Muon matrix, what enters Newton-Schulz (the momentum) and what
# leaves it (the update), on the owner, sending only scalars
# ([`muongrid/lab/statemetrics.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/lab/statemetrics.py)).
# The **effective rank** is the exponential of the normalised singular values' entropy: the number
# of directions that carry weight (the rank when all are equal, 1 when one dominates).
# **Largest / median** says how lopsided the spectrum is.

# %%
measured = first["state_metrics"]
last = measured[-1]
rows = []
for name, m in last["matrices"].items():
    if name.startswith("blocks.0."):
        rows.append([name.split(".")[-2], f"{m['momentum_norm']:.3f}",
                     f"{m['update_rms']:.3f}",
                     f"{m['in_effective_rank']:.1f} -> {m['out_effective_rank']:.1f}",
                     f"{m['in_top_median']:.1f} -> {m['out_top_median']:.2f}"])
print(f"step {last['step']}, block 0 (the 2 x 2 run; Newton-Schulz input -> output):")
table(["matrix", "momentum norm", "update RMS", "effective rank", "largest / median"],
      rows)

# %% mystnb={"figure": {"caption": "Every Muon matrix of the 2 x 2 run, measured every 10 steps: the effective rank (left) and the largest over the median singular value (right, log scale) of the momentum that enters Newton-Schulz (dashed) and of the update that leaves it (solid).", "name": "fig-ch9-spectra"}}
fig, axes = plt.subplots(1, 2, figsize=(7.0, 3.4), sharex=True)
kinds = sorted({name.split(".")[-2] for name in last["matrices"]})  # qkv, proj, ...
for name in sorted(last["matrices"]):
    kind = name.split(".")[-2]
    steps = [row["step"] for row in measured]
    line, = axes[0].plot(steps, [row["matrices"][name]["in_effective_rank"]
                                 for row in measured], "--", lw=1,
                         color=palette.matrix(kinds.index(kind)))
    axes[0].plot(steps, [row["matrices"][name]["out_effective_rank"]
                         for row in measured],
                 "-", lw=1.5, color=line.get_color())
    axes[1].semilogy(steps, [row["matrices"][name]["in_top_median"]
                             for row in measured],
                     "--", lw=1, color=line.get_color())
    axes[1].semilogy(steps, [row["matrices"][name]["out_top_median"]
                             for row in measured],
                     "-", lw=1.5, color=line.get_color())
axes[0].set(xlabel="step", ylabel="effective rank")
axes[1].set(xlabel="step", ylabel="largest / median")
# one legend for both panels: colour = kind of matrix (every block), line = in or out
key = [plt.Line2D([], [], color=palette.matrix(i), lw=2, label=k)
       for i, k in enumerate(kinds)]
key += [plt.Line2D([], [], color="black", ls="--", lw=1, label="into NS (momentum)"),
        plt.Line2D([], [], color="black", lw=1.5, label="out of NS (update)")]
fig.legend(handles=key, loc="lower center", ncol=3, fontsize=8, frameon=False)
fig.tight_layout(rect=(0, 0.2, 1, 1))
show(fig)
plt.close(fig)
rms = [m["update_rms"] for m in last["matrices"].values()]
gain = min(m["out_effective_rank"] / m["in_effective_rank"]
           for m in last["matrices"].values())

# %% jupyter={"source_hidden": true} tags=["remove-cell"]
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
keep("ch9-update-rms", f"{min(rms):.2f} to {max(rms):.2f}")
keep("ch9-rank-gain", f"{gain:.1f}")
# the text says Newton-Schulz raises every matrix's effective rank several-fold
assert gain > 1.5, gain

# %% jupyter={"source_hidden": true} tags=["remove-input"]
say(r"""
The momentum is lopsided, as {doc}`chapter 1 <01_muon>` showed for gradients. Newton-Schulz
multiplies every matrix's effective rank by at least {{ch9-rank-gain}} and brings largest /
median towards 1 (not exactly: the quintic's coefficients leave singular values spread around 1).
After Moonshot's scale `0.2 * sqrt(max(A, B))` the update RMS is {{ch9-update-rms}} for every
matrix, near AdamW's typical 0.2 {cite:p}`liu2025muonscalable`, so one learning rate is a sound
start for both.
""")

# %% [markdown]
# ## Is Muon better here? A study with tuned learning rates
#
# The paper reports that Muon needs about half of AdamW's compute for the same loss
# {cite:p}`liu2025muonscalable`; the Muon tutorial measured 34% lower loss than AdamW on MNIST after
# 3 epochs {cite:p}`wei2025muontutorial`. A poorly tuned AdamW makes anything look good, so
# [`scripts/convergence_study.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/convergence_study.py)
# sweeps each optimizer's learning rate (the hybrid's groups share one), takes each best by final
# validation loss and repeats it with more seeds, with the same tokens, schedule, weight decay and
# validation for both. It runs on one process (the grids follow the same curve); the book reads its
# recorded result:

# %%
import json
from pathlib import Path

study = json.loads(Path("../book/data/convergence_study.json").read_text())
s = study["summary"]
cfg = study["settings"]
print(f"command: {study['command']}\ncommit:  {study['commit']}  (uncommitted changes: "
      f"{study['uncommitted_changes']})\nmachine: {study['cpu']}, "
      f"{study['cores']} cores, torch {study['torch']}, "
      f"recorded {study['recorded_at']}")
print(f"{len(study['runs'])} runs, "
      f"{sum(r['seconds'] for r in study['runs']) / 60:.0f} minutes of runs in all")
print(f"model: width {cfg['width']}, {cfg['layers']} layers, {cfg['heads']} heads; "
      f"{cfg['steps']} steps of {cfg['batch']} x {cfg['context']} characters = "
      f"{s['total_tokens']:,} tokens; warm-up {cfg['warmup']}, cosine")
table(["learning rate", *(f"{o} final val loss" for o in ("AdamW", "hybrid Muon"))],
      [[f"{lr:g}", *(next((f"{r['final_val_loss']:.4f}" for r in s["sweep"][o]
                           if r["lr"] == lr), "-")
                     for o in ("adamw", "hybrid"))]
       for lr in sorted({r["lr"] for o in ("adamw", "hybrid") for r in s["sweep"][o]})])

# %% jupyter={"source_hidden": true} tags=["remove-cell"]
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert study["complete"]

# %% jupyter={"source_hidden": true} mystnb={"figure": {"caption": "The recorded study. Left: final validation loss of each learning rate (seed 0). Right: validation loss against tokens at each optimizer's best learning rate, the mean of the seeds and a band of one standard deviation; the dotted lines mark AdamW's final loss and where the hybrid's mean first reaches it.", "name": "fig-ch9-study"}} tags=["hide-input"]
NAMES = {"adamw": "AdamW", "hybrid": "hybrid Muon"}
COLORS = {"adamw": palette.OPTIMIZER["adamw"], "hybrid": palette.OPTIMIZER["muon"]}
fig, (left, right) = plt.subplots(1, 2, figsize=(7.2, 3.0), width_ratios=[1, 1.6])
for opt in ("adamw", "hybrid"):
    sweep = s["sweep"][opt]
    left.semilogx([r["lr"] for r in sweep], [r["final_val_loss"] for r in sweep], "o-",
                  color=COLORS[opt], label=NAMES[opt])
    c = s["curves"][opt]
    tokens = [t / 1e6 for t in c["tokens"]]
    right.plot(tokens, c["mean"], color=COLORS[opt],
               label=f"{NAMES[opt]}, lr {c['lr']:g}")
    right.fill_between(tokens, [m - d for m, d in zip(c["mean"], c["std"])],
                       [m + d for m, d in zip(c["mean"], c["std"])], color=COLORS[opt],
                       alpha=0.25, lw=0)
target = s["curves"]["adamw"]["mean"][-1]
right.axhline(target, color=palette.NEUTRAL["reference"], lw=0.8, ls=":")
if s["hybrid_tokens_to_adamw_final"] is not None:
    reached = s["hybrid_tokens_to_adamw_final"] / 1e6
    right.axvline(reached, color=palette.NEUTRAL["reference"], lw=0.8, ls=":")
    # the point the text quotes: the hybrid's mean first reaches AdamW's final loss
    right.plot([reached], [target], "o", color=COLORS["hybrid"], ms=6, mec="black")
    right.annotate(f"{s['hybrid_fraction_of_adamw_tokens']:.0%} of\nAdamW's tokens",
                   xy=(reached, target), xytext=(0.45, 0.55),
                   textcoords="axes fraction",
                   fontsize=8, arrowprops=dict(arrowstyle="->", lw=0.8))
left.set(xlabel="learning rate", ylabel="final validation loss", title="sweep (seed 0)")
right.set(xlabel="tokens (millions)", ylabel="validation loss",
          title=f"best lr, mean and spread of {len(s['curves']['adamw']['seeds'])} "
                "seeds",
          ylim=(min(s["curves"]["hybrid"]["mean"]) - 0.1,
                max(c["mean"][len(c["mean"]) // 5] for c in s["curves"].values())))
left.legend(fontsize=8)
right.legend(fontsize=8)
for ax in (left, right):
    ax.title.set_fontsize(9)
fig.tight_layout()
show(fig)
plt.close(fig)

# %% jupyter={"source_hidden": true} tags=["hide-input"]
a, h = s["curves"]["adamw"], s["curves"]["hybrid"]
gap, frac = s["final_gap"], s["hybrid_fraction_of_adamw_tokens"]
table(["", "AdamW", "hybrid Muon"],
      [["best learning rate"
        + (" (at the sweep's edge!)" if any(s["best_at_edge"].values()) else ""),
        f"{a['lr']:g}", f"{h['lr']:g}"],
       ["final validation loss, mean +- std",
        f"{a['mean'][-1]:.4f} +- {a['std'][-1]:.4f}",
        f"{h['mean'][-1]:.4f} +- {h['std'][-1]:.4f}"],
       ["seeds' final losses", ", ".join(f"{x:.4f}" for x in a["final"]),
        ", ".join(f"{x:.4f}" for x in h["final"])]])
from muongrid.lab.charlm import load_corpus
from muongrid.optim import hybrid_param_groups

gpt = TinyGPT(vocab_size=load_corpus()["vocab_size"], d=cfg["width"],
              n_layer=cfg["layers"])
routed = sum(p.numel() for g in hybrid_param_groups(gpt.named_parameters())
             if g["use_muon"] for p in g["params"])

# %% jupyter={"source_hidden": true} tags=["remove-cell"]
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
# a best at the edge would need a wider sweep
assert not any(s["best_at_edge"].values()), s["best_at_edge"]
assert gap > 0, ("the text below and the summary say the hybrid ended lower: rewrite "
                 "them if it did not")
keep("ch9-gap", f"{gap:+.3f}")
keep("ch9-gap-rel", f"{gap / a['mean'][-1]:.1%}")
keep("ch9-fraction", "never, within this budget" if frac is None else f"{frac:.0%}")
keep("ch9-tokens", f"{s['total_tokens'] / 1e6:.2f} million")
keep("ch9-params", f"{sum(p.numel() for p in gpt.parameters()) / 1e3:.0f} thousand")
keep("ch9-muon-share", f"{routed / sum(p.numel() for p in gpt.parameters()):.0%}")
keep("ch9-separated", "every hybrid seed ended below every AdamW seed"
     if max(h["final"]) < min(a["final"])
     else ("every AdamW seed ended below every hybrid seed"
           if max(a["final"]) < min(h["final"])
           else "the seeds' final losses overlap"))

# %% jupyter={"source_hidden": true} tags=["remove-input"]
say(r"""
At equal tokens ({{ch9-tokens}}), AdamW's final validation loss minus the hybrid's is
{{ch9-gap}} nats ({{ch9-gap-rel}} of AdamW's loss), and
{{ch9-separated}}. The hybrid reaches AdamW's final loss after
{{ch9-fraction}} of the tokens AdamW needed.

It is one small model ({{ch9-params}} parameters, {{ch9-muon-share}} of them in Muon
matrices), one character dataset, a short run and a few seeds: it agrees in direction with the
paper's "about half the compute" and says nothing about how the gap grows with size. It does
show the gain is not a poorly tuned baseline: both got the same sweep, each best inside it.
""")

# %% [markdown]
# ## What it means for porting a run from AdamW

# %% jupyter={"source_hidden": true} tags=["remove-cell"]
# The porting rule's evidence, quoted above: the seed-0 sweep at AdamW's best lr,
# and the hybrid's best lr (both groups of the hybrid took one lr in the study).
sweep0 = {o: {r["lr"]: r["final_val_loss"] for r in s["sweep"][o]} for o in s["sweep"]}
assert sweep0["hybrid"][a["lr"]] < sweep0["adamw"][a["lr"]] and h["lr"] > a["lr"]
keep("ch9-port-lr", f"{a['lr']:g}")
keep("ch9-port-hybrid", f"{sweep0['hybrid'][a['lr']]:.3f}")
keep("ch9-port-adamw", f"{sweep0['adamw'][a['lr']]:.3f}")
keep("ch9-port-best", f"{h['lr']:g}")
keep("ch9-port-ratio", f"{h['lr'] / a['lr']:g}")

# %% jupyter={"source_hidden": true} tags=["remove-input"]
say(r"""
This is the evidence for {doc}`chapter 12 <12_use_it>`'s learning-rate rule. At AdamW's best
learning rate ({{ch9-port-lr}}) the hybrid already ended at {{ch9-port-hybrid}} against
AdamW's {{ch9-port-adamw}} (seed 0), and it was best at {{ch9-port-best}},
{{ch9-port-ratio}} times AdamW's: start from AdamW's rate and sweep upwards, both groups
together. On a new model, sweep again.
""")

# %% [markdown]
# ## Watch it happen
#
# The same script, live, at the recorded best learning rates, one seed, 40 steps (a shorter cosine
# schedule, so not the recorded curves cut short):

# %%
live = last_json(run(f"convergence_study.py --lrs-adamw {a['lr']} "
                     f"--lrs-hybrid {h['lr']} --seeds 1 --steps 40 --eval-every 20"))

# %% jupyter={"source_hidden": true} mystnb={"figure": {"caption": "The short comparison run while this page was built: one seed each, at the recorded best learning rates.", "name": "fig-ch9-live"}} tags=["hide-input"]
fig, ax = plt.subplots(figsize=(6.0, 2.8))
for opt in ("adamw", "hybrid"):
    c = live["summary"]["curves"][opt]
    ax.plot([t / 1e6 for t in c["tokens"]], c["mean"], "o-", ms=3, color=COLORS[opt],
            label=f"{NAMES[opt]}, lr {c['lr']:g}")
ax.set(xlabel="tokens (millions)", ylabel="validation loss", ylim=(None, 3.0))
ax.legend(fontsize=8)
fig.tight_layout()
show(fig)
plt.close(fig)

# %% jupyter={"source_hidden": true} tags=["remove-cell"]
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
keep("ch9-live-gap", f"{live['summary']['final_gap']:+.3f}")

# %% jupyter={"source_hidden": true} tags=["remove-input"]
say(r"""
After 40 steps, AdamW's validation loss minus the hybrid's is {{ch9-live-gap}} nats
in this live run.
""")

# %% [markdown]
# ## Where the time of a real step goes
#
# `profile_step.py` ({doc}`chapter 7 <07_profiling>`) now takes the tensor-parallel model, so the
# report's three 4-rank grids {cite:p}`wei2025muonreproducibility` run on a real model: DP4, TP4
# and DP2 x TP2, 64 sequences per step. Each rank alternates a Muon and an AdamW step, and the
# profiler splits each into forward and backward, waiting, communication, Newton-Schulz and the
# rest:

# %%
grids = last_json(run("profile_step.py --grids 4x1,1x4,2x2 --global-batch 64 "
                      "--steps 3 --warmup 1 --layout owner", log="collapsed"))

# %% jupyter={"source_hidden": true} tags=["hide-input", "hide-output"] mystnb={"code_prompt_show": "Measured on this machine: show", "code_prompt_hide": "Measured on this machine: hide"}
parts = ["forward_backward", "waiting", "communication", "newton_schulz",
         "optimizer_compute"]
labels = ["forward + backward", "waiting", "communication", "Newton-Schulz",
          "other optimizer work"]
colors = [palette.STEP[p] for p in ("forward_backward", "waiting", "communication",
                                     "newton_schulz", "optimizer")]


def shown(b, p):
    """Part ``p`` of a step as the bar draws it: optimizer_compute includes
    Newton-Schulz, so the bar shows the rest of it, as chapter 7's does."""
    return b[p] - b["newton_schulz"] if p == "optimizer_compute" else b[p]


rows, bars = [], []
for g in grids["grids"]:
    rows.append([g["grid"], f"{g['muon_step_ms']:.0f}", f"{g['adamw_step_ms']:.0f}",
                 f"{g['muon_over_adamw']:.2f}", f"{g['muon_optimizer_share']:.1%}"])
    for kind in ("muon", "adamw"):
        n = len(g["ranks"])
        bars.append((f"{g['grid']} {'Muon' if kind == 'muon' else 'AdamW'}",
                     [sum(shown(r[kind], p) for r in g["ranks"]) / n for p in parts]))
table(["grid", "Muon step (ms)", "AdamW step (ms)", "Muon / AdamW, same fwd-bwd",
       "Muon's optimizer share"], rows)

# %% jupyter={"source_hidden": true} mystnb={"figure": {"caption": "A training step of the tiny GPT on three 4-rank grids, Muon (owner layout) and AdamW, split by the profiler (each part: the mean over ranks of each rank's median over 3 steps).", "name": "fig-ch9-profile"}} tags=["hide-input"]
fig, ax = plt.subplots(figsize=(6.4, 3.2))
for i, (label, values) in enumerate(bars):
    left = 0.0
    for v, c, lab in zip(values, colors, labels):
        ax.barh(i, v, left=left, color=c, edgecolor=palette.NEUTRAL["edge"], lw=0.3,
                label=lab if i == 0 else None)
        left += v
ax.set(yticks=range(len(bars)), yticklabels=[b[0] for b in bars],
       xlabel="ms per step (mean over ranks of medians)")
ax.invert_yaxis()
ax.legend(ncol=3, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22),
          frameon=False)
fig.tight_layout()
show(fig)
plt.close(fig)

# %% jupyter={"source_hidden": true} tags=["remove-cell"]
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
# the text below says forward + backward is the largest part of every step: check it
assert all(values[0] == max(values) for _, values in bars), bars

# %% [markdown]
# Forward and backward dominate every step; four processes share two cores, so this locates the
# time on a crowded laptop and predicts no cluster. Traces: `_build/traces/<grid>/trace_rank<r>.json`.
#
# ## The claims, on a real model
#
# Five of the claims {doc}`chapter 7 <07_profiling>` checked, measured again on this model and
# study; {doc}`the claims appendix <../book/claims>` sets them beside chapter 7's (code folded below).

# %% jupyter={"source_hidden": true} tags=["hide-input"]
from muongrid.lab import claims
from muongrid.lab.verdicts import beats, fastest_text, spread_text, versus_claim

by_grid = {g["grid"]: g for g in grids["grids"]}
muon_steps = {k: g["muon_step_ms_all"] for k, g in by_grid.items()}
shares = ", ".join(f"{k} {g['muon_optimizer_share']:.0%}" for k, g in by_grid.items())
ratios = ", ".join(f"{k} {g['muon_over_adamw']:.2f}x" for k, g in by_grid.items())
times = ", ".join(f"{k} {spread_text(v, scale=1)}" for k, v in muon_steps.items())
PROFILE = ("profile_step.py --grids 4x1,1x4,2x2 --global-batch 64 --steps 3 "
           "--warmup 1 --layout owner")
STUDY = "convergence_study.py, recorded"
claim_rows = {
    "optimizer_share": (f"Muon {shares}",
     PROFILE,
     "A model this small does little forward work per step on 2 shared CPU cores; the "
     "share falls as the model and batch grow (chapter 7)."),
    "step_ratio": (ratios, PROFILE,
     ("Close on every grid: "
      if all(1.0 <= g["muon_over_adamw"] <= 1.3 for g in by_grid.values()) else "")
     + "Newton-Schulz is cubic in the matrix size, forward-backward linear in the "
       "tokens: the ratio depends on both."),
    "fastest_grid": (
     f"{fastest_text(muon_steps)} for Muon (whole step, median (min-max) of 3: "
     f"{times})", PROFILE,
     versus_claim(muon_steps, "2x2")
     + (" TP4 is slowest: on 2 cores, TP's all-reduces in every layer's forward and "
        "backward cost more than splitting the matrices saves; on GPUs TP splits "
        "memory-bound work that DP repeats."
        if all(beats(muon_steps[k], muon_steps["1x4"])
               for k in muon_steps if k != "1x4") else "")),
    "half_compute": (
     "the hybrid reached AdamW's final loss after "
     f"{'never' if frac is None else f'{frac:.0%}'} of the tokens",
     STUDY, "One tiny model and dataset; the paper's figure comes from scaling-law "
            "fits over many sizes."),
    "loss_gap": (
     f"{gap / a['mean'][-1]:.1%} below, at AdamW's and Muon's best learning rates",
     STUDY,
     "Another task and model; here both learning rates were tuned over the same sweep, "
     f"with {len(a['seeds'])} seeds."),
}

# %% jupyter={"source_hidden": true} tags=["remove-cell"]
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
claims.glue_checks("09_training", claim_rows)   # shown in the claims appendix

# %% [markdown]
# ## Keeping attention logits in check: MuonClip
#
# Kimi K2, trained with Muon, saw some heads' largest attention logits grow without bound; its fix,
# QK-clip {cite:p}`kimi2025k2`, runs after each step: for every head whose largest logit
# $S_h = \max q_i \cdot k_j / \sqrt{d}$ exceeded $\tau$, it scales the head's query and key rows by
# $\sqrt{\tau / S_h}$ each. [`muongrid/qk_clip.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/qk_clip.py)
# does it on the shards with one MAX all-reduce of the per-head maxima per step (DP ranks saw other
# rows, TP ranks other heads), and matches one process bit for bit on five grids
# ([`tests/test_qk_clip.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_qk_clip.py)).
# In your model it is one argument and one line in the attention:
#
# ```python
# layers = [QKLayer("layers.0.qkv.weight", "layers.0.qkv.weight",
#                   q_rows_per_head, k_rows_per_head), ...]
# clip = QKClip(threshold=100.0, layers=layers)
# opt = DistributedMuon(groups, grid, qk_clip=clip)
# # in the attention of layer i, after computing q and k:
# clip.record(i, max_logits(q, k))
# ```
#
# The book's GPT on a 2 x 1 grid, at a learning rate that makes logits grow, watching only
# (`QKClip(None, ...)`) and clipping at 8:

# %%
qk = last_json(run("qk_clip_demo.py --dp 2 --steps 60 --threshold 8",
                   log="collapsed"))

# %% jupyter={"source_hidden": true} mystnb={"figure": {"caption": "The largest attention logit over every head of the book's GPT at each step (what the step's forward saw, before the clip), watching only and clipping at 8 (dashed), while this page was built.", "name": "fig-ch9-qk"}} tags=["hide-input"]
fig, ax = plt.subplots(figsize=(6.0, 2.6))
for (name, r), color in zip(qk["runs"].items(), (COLORS["adamw"], COLORS["hybrid"])):
    ax.plot(range(1, len(r["max_logit"]) + 1), r["max_logit"], color=color, label=name)
ax.axhline(qk["threshold"], color="0.4", lw=0.8, ls="--")
ax.set(xlabel="step", ylabel="largest attention logit")
ax.legend(fontsize=8)
fig.tight_layout()
show(fig)
plt.close(fig)
watch, clipped = qk["runs"].values()

# %% jupyter={"source_hidden": true} tags=["remove-cell"]
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
keep("ch9-qk-watch", f"{max(watch['max_logit']):.0f}")
keep("ch9-qk-clip", f"{max(clipped['max_logit'][20:]):.1f}")

# %% jupyter={"source_hidden": true} tags=["remove-input"]
say(r"""
Left alone, the largest logit reached {{ch9-qk-watch}}; clipped, it stayed near the threshold
after step 20 (at most {{ch9-qk-clip}}: an update can overshoot before the clip). One run each,
one seed: this shows what the clip does to the logits, not whether it helps the loss.
""")

# %% [markdown]
# ## Run it on a cluster
#
# Under `torchrun` with NCCL, `train.py` reads its rank and world size from the environment:
#
# ```bash
# torchrun --standalone --nproc-per-node 4 scripts/train.py --dp 2 --tp 2 \
#     --optimizer hybrid --layout owner --steps 50
# torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \
#     --rdzv-endpoint $HOST:29500 scripts/train.py --dp 4 --tp 4 \
#     --optimizer hybrid --steps 1000 --width 512 --layers 8 --heads 8
# ```
#
# Keep TP within a node (its all-reduces run on every layer); let DP cross nodes. For your model:
# build the grid, `parallelize_module` your blocks on `grid.mesh["tp"]`, give `DistributedMuon`
# the hybrid parameter groups, and train.
#
# ## Summary
#
# - `DistributedMuon` reads each matrix's split from its `parallelize_module` placement.
# - On a real model grids agree to reduction-order noise, not bit for bit.
# - Newton-Schulz raises the momentum's effective rank several-fold; update RMS is near AdamW's.
# - Tuned and over several seeds, the hybrid beat AdamW at equal tokens on this model; how much
#   carries to large models is the paper's evidence, not ours.
# - On two CPU cores forward and backward dominate the step.
#
# ## Exercises
#
# 1. Train on a 1 x 4 grid. Why does `train.py` refuse `--heads 2` there?
# 2. Run `convergence_study.py --tiny --lrs-adamw 0.01 --lrs-hybrid 0.01` twice. Are the results
#    the same? Then with `--jobs 1` and `--jobs 2`. Why is that allowed to matter, or not?
# 3. In the state metrics, which matrix's momentum is the most lopsided, and is it still after 20
#    steps?
# 4. Break the data split: in `train.py`'s `worker`, make every DP rank train on the first slice
#    (`mine = slice(0, rows)`), rerun the 1 x 1 and 2 x 1 grids, and compare their loss curves.
# 5. By hand: the study's model keeps the share of its parameters in Muon matrices that the study
#    section states (the rest go to AdamW). Under the bucket layout on a 2 x 1 grid, how many times AdamW's bytes does a
#    hybrid step send? ({doc}`Chapter 6 <06_communication>`: a Muon bucket costs (4 + 2 + 4) / (4 + 4) of an AdamW one.)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# The exercises' answers, computed and checked (the solutions below quote them).
from muongrid.lab.costmodel import bytes_ratio
from muongrid.plan import DEFAULT_BUCKET_NUMEL

total = sum(p.numel() for p in gpt.parameters())
muon_share = routed / total
predicted = 1 + 0.25 * muon_share  # (4 + 2 + 4) / (4 + 4) on the Muon share, 1 elsewhere
study_groups = [dict(shapes=[tuple(p.shape) for p in g["params"]],
                     tp_split_dims=[-1] * len(g["params"]), use_muon=g["use_muon"])
                for g in hybrid_param_groups(gpt.named_parameters())]
exact = bytes_ratio(study_groups, 2, 1, DEFAULT_BUCKET_NUMEL, "bucket")
assert abs(exact - predicted) < 0.01, (exact, predicted)  # padding is all that differs
def most_lopsided(measurement):
    block0 = {n.split(".")[-2]: m["in_top_median"]
              for n, m in measurement["matrices"].items() if n.startswith("blocks.0.")}
    name = max(block0, key=block0.get)
    return name, f"{block0[name]:.1f}", measurement["step"]


(first_name, first_value, first_step), (last_name, last_value, last_step) = (
    most_lopsided(measured[0]), most_lopsided(measured[-1]))
keep("ch9-ex3-first", f"`{first_name}` ({first_value} at step {first_step})")
keep("ch9-ex3-last", f"`{last_name}` ({last_value} at step {last_step})")
keep("ch9-ex3-same", "the same matrix" if first_name == last_name else "another matrix")
keep("ch9-ex5-share", f"{muon_share:.1%}")
keep("ch9-ex5-predicted", f"{predicted:.3f}")
keep("ch9-ex5-exact", f"{exact:.3f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
:::{admonition} Solutions
:class: dropdown

1. Each TP rank computes whole attention heads: four TP ranks need at least four heads, and
   `--heads` must divide by `--tp` (the check is in `train.py`'s argument parsing).
2. Yes: each run is one process with a fixed seed and a fixed number of threads, so the
   arithmetic is the same whichever runs beside it; `--jobs` only changes how many run at once.
   (With `--threads` above 1 a matrix product may split its sums differently, and results can
   move in the last bits.)
3. The answer is the matrix with the largest value before the arrow in the "largest / median"
   column of the table in "What Newton-Schulz does to the momentum" (the momentum's; after the
   arrow is the update's), for the step printed above that table (block 0 of the 2 x 2 run). For
   the other measured steps, `first["state_metrics"]` holds one entry per measurement (its `step`
   and, per matrix, `in_top_median`), and the dashed lines of {numref}`fig-ch9-spectra` show the
   same at the first and last measurement. In the run this page was built from, the most
   lopsided momentum of block 0 was {{ch9-ex3-first}} at the first measurement and
   {{ch9-ex3-last}} at the last: {{ch9-ex3-same}}. A run on another machine draws the same
   data but may round differently, so check yours against the table.
4. The 2 x 1 run now averages two gradients of the same half batch: it trains on half the data
   of each step (and reports that half's loss), so its curve is off the 1 x 1 one from the first
   step, by several times the 2e-3 nats [`tests/test_train.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_train.py) allows, and the gap grows as the
   run goes on (undo the change afterwards).
5. $1 + 0.25 \times$ {{ch9-ex5-share}} = {{ch9-ex5-predicted}}: only the Muon share pays the
   extra bf16 gather. The closed form of {doc}`chapter 6 <06_communication>` (`costmodel.bytes_ratio` on this model's groups)
   gives {{ch9-ex5-exact}}; what differs is the buckets' padding. The build checks the two agree
   to 0.01.
:::
""")

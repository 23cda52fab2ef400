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
# # 2. A map of distributed training
#
# ```{admonition} What this chapter runs
# [`scripts/collectives.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/collectives.py) on 4 processes over gloo; everything else is closed-form arithmetic.
# About 15 seconds on a 2-core laptop.
# Reading: about 25 minutes at 200 words, 8 lines of code or one figure a minute, plus running it. Read first: nothing but PyTorch.
# ```

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
# A map before we distribute Muon: the ways a training job is split across processes
# ("ranks"), what each rank then stores, and the collectives they use to talk.
#
# **Learning goals.** After this chapter you can
#
# - say what data parallel (DP), tensor parallel (TP), pipeline parallel (PP), ZeRO-1/2/3 and
#   FSDP split, and what each rank then stores;
# - compute per-rank memory for parameters, gradients, master weights and optimizer state, for
#   AdamW and for Muon;
# - define all-gather, reduce-scatter and all-reduce by what each rank sends and receives, and
#   count their bytes;
# - say why Muon is harder to distribute than AdamW.

# %% [markdown]
# ## Why one device is not enough
#
# Training keeps four things per parameter: the parameter, its gradient, an fp32 master copy that
# the optimizer updates, and the optimizer's state. With mixed precision (bf16 parameters and
# gradients) and AdamW that is 2 + 2 + 4 + 8 = 16 bytes, as
# [`muongrid/lab/memory.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/lab/memory.py) computes:

# %%
from muongrid.lab.memory import STRATEGIES, per_rank_bytes
from muongrid.lab.notebook import table

GB = 1e9
table(
    ["parameters", "AdamW, GB on one device", "Muon, GB on one device"],
    [
        [
            f"{n / 1e9:g}B",
            f"{per_rank_bytes(n, 'adamw')['total'] / GB:,.0f}",
            f"{per_rank_bytes(n, 'muon')['total'] / GB:,.0f}",
        ]
        for n in (1e9, 7e9, 70e9)
    ],
    align="lrr",
)

# %% [markdown]
# (Activations are not included.) A 7B-parameter model needs more than one 80 GB accelerator holds. Muon's one state tensor
# (momentum) against AdamW's two saves 4 of the 16 bytes: not enough.
#
# ## The strategies
#
# **Data parallel (DP).** Every rank holds the whole model and processes a different part of the
# batch; the ranks average their gradients, so every replica takes the same step. Memory per rank
# does not shrink.
#
# **ZeRO** {cite:p}`rajbhandari2020zero` removes DP's redundancy in stages. *ZeRO-1* shards the
# optimizer state (and master weights): each of the `dp` ranks updates only its `1/dp` slice of
# the parameters, then the updated slices are all-gathered. *ZeRO-2* also shards the gradients
# (each rank only needs the gradient of its own slice). *ZeRO-3* shards the parameters too,
# gathering each layer just before it is used; PyTorch's implementation of that is *FSDP*
# {cite:p}`zhao2023fsdp`.
#
# **Tensor parallel (TP)** {cite:p}`shoeybi2019megatron` splits the weight matrices of each layer
# across ranks. A linear layer's weight can be split by rows (dimension 0, "column-parallel" in
# Megatron's terms: each rank computes some output features) or by columns (dimension 1,
# "row-parallel"); we call that dimension `tp_split_dim`. TP needs fast links: the ranks exchange
# activations inside every layer.
#
# **Pipeline parallel (PP)** puts consecutive layers on different ranks and streams
# micro-batches through them.
#
# These compose: Moonshot's Distributed Muon runs TP inside each model replica and ZeRO-1 across
# replicas. What one rank stores for a 7B model on 8 devices (mixed precision), in GB:

# %%
import matplotlib.pyplot as plt
from muongrid.lab.page import keep, listing, say, show

from muongrid.lab.diagrams import book_style

book_style()

N = 7e9
layouts = [
    ("DP x8", dict(dp=8)),
    ("ZeRO-1 x8", dict(zero=1, dp=8)),
    ("ZeRO-2 x8", dict(zero=2, dp=8)),
    ("ZeRO-3 / FSDP x8", dict(zero=3, dp=8)),
    ("TP x8", dict(tp=8)),
    ("ZeRO-1 DP2 x TP4", dict(zero=1, dp=2, tp=4)),
]
parts = ["params", "grads", "master", "optimizer_state"]
rows = [
    (label, opt, per_rank_bytes(N, opt, **kw))
    for label, kw in layouts
    for opt in ("adamw", "muon")
]
table(
    ["layout", "optimizer", "params", "grads", "master", "opt. state", "total"],
    [
        [label, opt, *(f"{b[p] / GB:.2f}" for p in parts + ["total"])]
        for label, opt, b in rows
    ],
    align="llrrrrr",
)

# %% mystnb={"figure": {"caption": "Training state per rank of a 7B-parameter model on 8 devices, by layout and optimizer (mixed precision, no activations): the table above, drawn. The dotted line is an 80 GB accelerator.", "name": "fig-ch2-memory"}}
from muongrid.lab import palette

DEVICE_GB = 80
fig, ax = plt.subplots(figsize=(6.4, 5.6))
labels = [f"{lab} · {opt}" for lab, opt, _ in rows]
left = [0.0] * len(rows)
for part in parts:
    vals = [b[part] / GB for _, _, b in rows]
    ax.barh(labels, vals, left=left, label=part, color=palette.MEMORY[part])
    left = [x + y for x, y in zip(left, vals)]
ax.axvline(DEVICE_GB, color="black", ls=":", lw=1, label=f"{DEVICE_GB} GB device")
ax.invert_yaxis()
ax.set(xlabel="GB per rank")
# below the axes, so no bar or the device line hides under it
ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize=10,
          frameon=False)
fig.tight_layout()
show(fig)
plt.close(fig)

# %% [markdown]
# In {numref}`fig-ch2-memory`, ZeRO-1 shrinks the optimizer state, the biggest item under DP, and
# Muon's is half of AdamW's. ZeRO-1 also leaves each rank the whole (TP-local) parameters and
# gradients, which Muon's update needs: Newton-Schulz works on whole matrices.
#
# ## The collectives, run for real
#
# Three collective operations carry all of ZeRO-1's traffic:
#
# - **{term}`all-gather`**: every rank contributes a shard; every rank receives all of them, in rank order;
# - **{term}`reduce-scatter`**: every rank contributes a full tensor; rank $r$ receives the sum of
#   everyone's $r$-th shard;
# - **{term}`all-reduce`**: every rank contributes a full tensor and receives the full sum. It is a
#   reduce-scatter followed by an all-gather.
#
# A fourth, **broadcast**, copies one rank's tensor to all. [`scripts/collectives.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/collectives.py) runs all four
# on 4 processes over gloo. Rank $r$'s values are $100r + i$, so every number shows where it came
# from; {numref}`fig-ch2-collectives` draws the (folded) printout.

# %%
from muongrid.lab.diagrams import collectives_diagram
from muongrid.lab.notebook import last_json, run

demo = last_json(run("collectives.py --dp 4 --numel 8", log="collapsed"))

# %% mystnb={"figure": {"caption": "The four collectives as they ran on 4 gloo processes: each rank's tensor before (left) and after (right). Colours say which rank an element came from; grey elements are sums over all ranks. The script also checked that the all-reduce equals a reduce-scatter followed by an all-gather.", "name": "fig-ch2-collectives"}}
show(collectives_diagram(demo))
plt.close("all")

# %% jupyter={"source_hidden": true} tags=["remove-cell"]
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert demo["allreduce_is_rs_plus_ag"]

# %% [markdown]
# The script's own calls, on every rank (`full` is the rank's whole tensor, `shard` its quarter).
# `comm` ([`muongrid/comm.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/comm.py)) is the book's thin wrapper around `torch.distributed`: each method
# makes one call, such as `dist.reduce_scatter_single` (`reduce_scatter_tensor` before torch
# 2.13), and records its bytes in a *ledger*. Chapter 5 writes a whole distributed Muon step with
# such calls and no wrapper.

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing("scripts/collectives.py", start_after="BOOK-START collectives",
        end_before="BOOK-END collectives")

# %% [markdown]
# ZeRO-1 averages gradients with a reduce-scatter (each rank gets the average for its own slice,
# all it needs to update it) and gives every rank the updated parameters with an all-gather.
# Together they move the same bytes as plain DP's all-reduce.
#
# **Counting bytes.** In the ring algorithm that NCCL uses for large tensors, an all-gather over
# $n$ ranks with shards of $s$ elements has each rank send (and receive) $(n-1)s$ elements; a
# reduce-scatter is the same; an all-reduce is twice that. The ledger records these counts. For
# the run above (fp32, 4 bytes per element):

# %%
n = demo["world"]
for op, rec in demo["ledger"].items():
    if op == "broadcast":  # not part of ZeRO-1's traffic
        continue
    factor = 2 if op == "all_reduce" else 1
    formula = factor * (n - 1) * rec["elements_in_shard"] * 4
    print(
        f"{op:<15} ledger: {rec['bytes_sent']:>3} bytes sent per rank;  "
        f"{factor if factor > 1 else ''}{'*' if factor > 1 else ''}(n-1)*s*4 = "
        f"{formula}"
    )

# %% [markdown]
# A caveat for later: gloo, the CPU backend, has no native reduce-scatter and runs an all-reduce
# of the whole input instead, twice the ring's bytes. So on gloo this book's `Comm` sends an
# all-to-all (each rank gets every other rank's values for its shard, the ring's bytes) and adds the
# rows itself; the ledger counts what the ring moves (what NCCL does on GPUs). Chapter 6 times both.
#
# ## A memory calculator
#
# Move the slider of {numref}`fig-ch2-explorer` to change the model size (every position was
# computed with `per_rank_bytes` when the page was built).

# %% mystnb={"figure": {"caption": "GB per rank on 8 devices for each layout of the table above, as the model grows; the dotted line is an 80 GB accelerator. The title counts the rows that fit. The axis stays at 0-240 GB for every size, so the line keeps its place; a longer bar stops at the edge, its total written inside (\u25b6).", "name": "fig-ch2-explorer"}}
from muongrid.lab.explorers import Figure, memory_explorer

show(Figure(memory_explorer()))

# %% [markdown]
# {numref}`fig-ch2-grid` fixes the model at 7B parameters and moves the grid (DP and TP sizes)
# instead; `per_rank_bytes(n, optimizer, zero=..., dp=..., tp=...)` gives any other point.

# %% mystnb={"figure": {"caption": "GB per rank for a 7B model under each ZeRO stage, AdamW and Muon, on the grid (dp x tp) set by the slider; the dotted line is an 80 GB accelerator, on the same fixed 0-240 GB axis.", "name": "fig-ch2-grid"}}
from muongrid.lab.explorers import grid_memory_explorer

show(Figure(grid_memory_explorer(billions=7)))

# %% [markdown]
# ## Why Muon is harder to distribute than AdamW
#
# AdamW's update is *elementwise*, so under ZeRO-1 each rank updates its slice with no extra
# communication.
#
# Muon's update is *matrix-wise*: Newton-Schulz multiplies the whole momentum matrix by itself.
# Under ZeRO-1 a rank holds the momentum of a slice of the flat parameter buffer, which may cut a
# matrix in two; under TP the matrix is also split across ranks. Before
# orthogonalising, the pieces must be brought together, and afterwards each rank keeps only its
# piece of the result. That is Moonshot's Distributed Muon, which the rest of this book takes
# apart. (Under FSDP, `torch.optim.Muon` works only because the sharded tensor type gathers the
# matrix inside every product: correct, not efficient; {doc}`chapter 11 <11_fsdp2>` measures it.)
#
# ## Summary
#
# - DP replicates; TP and PP split the model; ZeRO-1/2/3 shard optimizer state, gradients and
#   parameters over DP ranks (FSDP is ZeRO-3).
# - Mixed precision: AdamW needs 16 bytes a parameter, Muon 12; ZeRO-1 divides the master and
#   optimizer part by `dp`.
# - All-gather and reduce-scatter each move $(n-1)/n$ of the tensor per rank; all-reduce is both.
# - Muon needs whole matrices, so distributing it costs extra gathers (chapters 3-6).
#
# ## Exercises
#
# 1. Run `collectives.py --dp 3 --numel 6`. Which rank receives the sum of elements 2 and 3?
# 2. With `per_rank_bytes`: how many ranks does a 70B model need under ZeRO-3 for its training
#    state to fit in 80 GB per rank, with AdamW? With Muon?
# 3. Show that ZeRO-1's reduce-scatter plus all-gather moves the same bytes as DP's all-reduce.

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# The exercises' answers, computed and checked (the solutions below quote them).
def fewest_ranks(optimizer, budget=80e9, n=70e9):
    return next(dp for dp in range(1, 1024)
                if per_rank_bytes(n, optimizer, zero=3, dp=dp)["total"] <= budget)


fit = {opt: fewest_ranks(opt) for opt in ("adamw", "muon")}
# by hand: 16 and 12 bytes a parameter, all of it divided by dp under ZeRO-3
assert fit == {"adamw": -(-16 * 70 // 80), "muon": -(-12 * 70 // 80)}
for opt, dp in fit.items():
    keep(f"ch2-ex2-{opt}", dp)
    keep(f"ch2-ex2-{opt}-gb", f"{per_rank_bytes(70e9, opt, zero=3, dp=dp)['total'] / 1e9:.1f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
:::{admonition} Solutions
:class: dropdown

1. With 3 ranks and 6 elements each shard has 2 elements; rank 1 receives the sums of elements
   2 and 3 (shard 1). Run the command to see it.
2. Under ZeRO-3 everything is divided by `dp`: AdamW needs 16 bytes x 70e9 / dp <= 80e9, so
   dp >= {{ch2-ex2-adamw}}; Muon needs 12 bytes, so dp >= 10.5, i.e. {{ch2-ex2-muon}}
   (before activations). Check both: `per_rank_bytes(70e9, "adamw", zero=3,
   dp={{ch2-ex2-adamw}})["total"]` is {{ch2-ex2-adamw-gb}} GB and `per_rank_bytes(70e9,
   "muon", zero=3, dp={{ch2-ex2-muon}})["total"]` is {{ch2-ex2-muon-gb}} GB.
3. A ring reduce-scatter and a ring all-gather over $n$ ranks each send $(n-1)s$ elements per
   rank, for shards of $s$ elements; a ring all-reduce is exactly those two phases, $2(n-1)s$.
:::
""")

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
# # 3. The 2-D grid
#
# ```{admonition} What this chapter runs
# [`scripts/inspect_grid.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/inspect_grid.py) on 8 processes (a 2 x 4 grid), and one launch of [`scripts/verify.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/verify.py)
# that is meant to fail before starting. About 20 seconds on a 2-core laptop.
# Reading: about 10 minutes at 200 words, 8 lines of code or one figure a minute, plus running it. Read first: {doc}`chapter 2 <02_distributed_map>`.
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
# Distributed Muon runs on a grid of `dp x tp` processes: `tp` ranks share the work of one
# model replica (tensor parallel), and `dp` such replicas see different data (data parallel,
# with ZeRO-1).
#
# **Learning goals.** After this chapter you can
#
# - number the ranks of a DP x TP grid and name each rank's DP group and TP group;
# - explain why the TP ranks are the consecutive ones, and what that means for placing ranks on nodes;
# - say which slice of each matrix a rank holds (TP) and which part of the optimizer state it
#   keeps (DP);
# - recognise the error when a matrix cannot be split over TP.

# %% [markdown]
# ## Numbering the ranks
#
# With `world_size = dp * tp` processes, rank `r` is TP rank `r % tp` of DP replica `r // tp`:
#
# $$ r = \mathit{dp\_rank} \cdot tp + \mathit{tp\_rank}. $$
#
# So the TP groups are runs of consecutive ranks ($\{0,1,2,3\}, \{4,5,6,7\}$ for a 2 x 4 grid) and
# the DP groups are the ranks `tp` apart ($\{0,4\}, \{1,5\}, \ldots$): the order of PyTorch's
# `init_device_mesh(device, (dp, tp), mesh_dim_names=("dp", "tp"))`. Our groups are built in one
# place, [`muongrid/grid.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/grid.py).
#
# `torchrun` starts consecutive ranks on the same node, so each TP group stays inside a node, on
# its fast links (NVLink): TP talks in every layer and, for Muon, once per matrix in every
# optimizer step. DP talks once per bucket per step and can cross the slower network between
# nodes.
#
# ## The grid of a real run
#
# [`scripts/inspect_grid.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/inspect_grid.py) starts 8 processes as a 2 x 4 grid ({term}`data parallel (DP)` x
# {term}`tensor parallel (TP)`). Each builds its groups and its optimizer, then reports its DP
# and TP group *as the process groups list them*, the optimizer state it owns, and its bytes.

# %%
from muongrid.lab.notebook import last_json, run

grid_run = last_json(run("inspect_grid.py --dp 2 --tp 4"))

# %% [markdown]
# The drawing is made from the reported groups; the cell checks them against `grid_layout`.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-ch3-grid", "caption": "The 2 x 4 grid of the run above, drawn from the groups the processes reported: blue boxes are TP groups (one model replica each), orange lines are DP groups."}} jupyter={"source_hidden": true}
import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch
from muongrid.lab.page import keep, listing, say, show

from muongrid.grid import grid_layout
from muongrid.lab import palette
from muongrid.lab.diagrams import book_style

book_style()

ranks = grid_run["ranks"]
dp, tp = grid_run["dp"], grid_run["tp"]
expected = grid_layout(dp, tp)
print("the groups of the launched run match grid_layout(dp, tp)")


def draw_grid(ranks, dp, tp, ax):
    pos = {r["rank"]: (r["tp_rank"], dp - 1 - r["dp_rank"]) for r in ranks}
    for group in {tuple(r["tp_group"]) for r in ranks}:
        ys = {pos[m][1] for m in group}
        ax.add_patch(
            FancyBboxPatch(
                (-0.42, min(ys) - 0.38),
                tp - 0.16,
                0.76,
                boxstyle="round,pad=0.02",
                fc=palette.PARALLEL["tp_fill"],
                ec=palette.PARALLEL["tp"],
                lw=1.5,
            )
        )
    for group in {tuple(r["dp_group"]) for r in ranks}:
        x = pos[group[0]][0]
        ax.plot(
            [x, x],
            [pos[group[-1]][1], pos[group[0]][1]],
            color=palette.PARALLEL["dp"],
            lw=3,
            alpha=0.7,
            zorder=1,
        )
    for r in ranks:
        x, y = pos[r["rank"]]
        ax.add_patch(
            FancyBboxPatch(
                (x - 0.3, y - 0.25),
                0.6,
                0.5,
                boxstyle="round,pad=0.02",
                fc="white",
                ec="k",
                zorder=2,
            )
        )
        ax.text(
            x,
            y + 0.07,
            f"rank {r['rank']}",
            ha="center",
            va="center",
            zorder=3,
            fontsize=12,
        )
        ax.text(
            x,
            y - 0.12,
            f"dp {r['dp_rank']}, tp {r['tp_rank']}",
            ha="center",
            va="center",
            zorder=3,
            fontsize=10,
        )
    ax.set(
        xlim=(-0.6, tp - 0.4),
        ylim=(-0.6, dp - 0.4),
        xticks=range(tp),
        yticks=range(dp),
        xticklabels=[f"tp {t}" for t in range(tp)],
        yticklabels=[f"replica {dp - 1 - d}" for d in range(dp)],
    )


fig, ax = plt.subplots(figsize=(6.4, 3.2))
draw_grid(ranks, dp, tp, ax)
fig.tight_layout()
show(fig)
plt.close(fig)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert all(
    r["dp_group"] == e["dp_group"] and r["tp_group"] == e["tp_group"]
    for r, e in zip(ranks, expected)
)

# %% [markdown]
# ## What each rank holds
#
# **Along TP**, a rank holds a slice of every matrix that is split: rows
# (`tp_split_dim = 0`) or columns (`tp_split_dim = 1`), `1/tp` of them; matrices that are not
# split are held whole by every TP rank. The proof of concept's five matrices on TP rank 0:

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from muongrid.lab.notebook import table

rank0 = ranks[0]
table(
    ["matrix", "full shape", "tp_split_dim", "held by a TP rank"],
    [
        [
            p["name"],
            "x".join(map(str, p["full_shape"])),
            p["tp_split_dim"],
            "x".join(map(str, p["held_shape"])),
        ]
        for p in rank0["params"]
    ],
    align="llrl",
)

# %% [markdown]
# **Along DP**, the ranks of a DP group hold the same TP slices (they are replicas) but split the
# optimizer state between them: ZeRO-1. Each keeps the momentum and fp32 master weights for only
# its shard of the flat parameter buffer (chapter 4 looks at the shards). How much each keeps:

# %%
rows = []
for r in ranks:
    owned = sum(p["local_range"][1] - p["local_range"][0] for p in r["params"])
    whole = sum(p["global_range"][1] - p["global_range"][0] for p in r["params"])
    rows.append(
        [
            r["rank"],
            r["dp_rank"],
            r["tp_rank"],
            owned,
            whole,
            f"{owned / whole:.0%}",
            sum(r["state_bytes"].values()),
        ]
    )
table(
    ["rank", "dp", "tp", "owned elements", "TP-local elements", "share", "state bytes"],
    rows,
)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert (
    len({row[-1] for row in rows}) == 1
), "ranks keep different amounts of optimizer state"
assert all(
    2 * row[3] == row[4] for row in rows
), "with dp = 2 each rank should own half of its TP-local elements"

# %% [markdown]
# Every rank owns half of its TP-local elements because `dp = 2`, and the same amount of state
# because the buffer is padded to a multiple of `dp` (here no padding was needed; chapter 4 shows
# a case where the last DP rank's shard holds some).
#
# ## When a matrix cannot be split
#
# TP needs the split dimension to divide by `tp`. The proof of concept's first matrix is
# 100 x 100, split on rows; 100 does not divide by 3. The scripts check before starting any
# process:

# %%
run("verify.py --dp 1 --tp 3", expect_failure=True);

# %% [markdown]
# ## Summary
#
# - Rank `r` is TP rank `r % tp` of replica `r // tp`; TP groups are consecutive ranks (keep
#   them inside a node), DP groups are `tp` apart. `Grid.build` makes them with a device mesh.
# - A rank holds `1/tp` of every split matrix and the optimizer state for `1/dp` of its buffer.
#
# ## Exercises
#
# 1. Run `inspect_grid.py --dp 4 --tp 2`. Which ranks form the DP group of rank 5?
# 2. On a cluster with 8 GPUs per node and `--tp 16`, which TP groups cross nodes? What would you
#    expect that to cost?
# 3. Change the first matrix's split dim to `none` (`--tp-dims none,1,none,1,0`) and run the
#    3-way TP example again.
# 4. A cluster of 16 nodes with 8 GPUs each runs `--dp 16 --tp 8` (128 ranks, numbered node by
#    node). How many DP groups are there, how many ranks does each hold, and across how many nodes
#    does one DP group reach? Does any TP group leave its node?

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# The exercises' answers, computed and checked (the solutions below quote them).
rank5 = grid_layout(4, 2)[5]
assert (rank5["dp_rank"], rank5["tp_rank"]) == (2, 1)
keep("ch3-ex1-group", ", ".join(map(str, rank5["dp_group"])))

big = grid_layout(16, 8)  # 128 ranks, 8 GPUs a node: node = rank // 8
dp_groups = {tuple(r["dp_group"]) for r in big}
tp_groups = {tuple(r["tp_group"]) for r in big}
nodes_per_dp = {len({rank // 8 for rank in g}) for g in dp_groups}
nodes_per_tp = {len({rank // 8 for rank in g}) for g in tp_groups}
assert len(nodes_per_dp) == 1 and nodes_per_tp == {1}
keep("ch3-ex4-dp-groups", len(dp_groups))
keep("ch3-ex4-dp-size", len(next(iter(dp_groups))))
keep("ch3-ex4-dp-nodes", nodes_per_dp.pop())
keep("ch3-ex4-tp-groups", len(tp_groups))

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
:::{admonition} Solutions
:class: dropdown

1. With `tp = 2`, rank 5 is TP rank 1 of replica 2, and its DP group is the ranks `tp` apart
   with the same TP rank: {{{ch3-ex1-group}}}. The script's table lists it.
2. TP groups are 16 consecutive ranks, so every TP group spans two nodes: each TP collective
   (in every layer, and Muon's TP gathers) then crosses the slower inter-node network.
3. The first matrix is no longer split, but another matrix must still divide by 3: the script
   names the next one that does not: 324 and 876 columns divide by 3, but the last matrix's 128
   rows do not.
4. {{ch3-ex4-dp-groups}} DP groups (one per TP rank) of {{ch3-ex4-dp-size}} ranks each:
   DP group $t$ holds ranks $t, t + 8, t + 16, \dots$, one per node, so each reaches across all
   {{ch3-ex4-dp-nodes}} nodes. The {{ch3-ex4-tp-groups}} TP groups are ranks $8i$ to $8i + 7$:
   each is one whole node, which is why TP (talked to in every layer) is kept inside a node and DP
   (talked to once a step) crosses them. Computed from `grid_layout(16, 8)` with node = rank // 8.
:::
""")

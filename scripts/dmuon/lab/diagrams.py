"""Diagrams for the book, drawn with matplotlib from what the scripts really did.

- ``collectives_diagram(demo)``: the four collectives of ``scripts/collectives.py``'s run, each
  rank's tensor before and after, every element coloured by the rank it came from.
- ``step_flow_diagram(trace, plan_metas)``: one Distributed Muon step on a 2 x 2 grid, for one
  matrix: which part of it each rank holds at each stage, from ``scripts/trace_step.py``'s trace
  (shapes, dtypes) and the ZeRO-1 plan (where each rank's shard lies).

``book_style()`` sets font sizes that stay legible when a page is read on a narrow screen.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

RANK_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"]
SUM_COLOR = "#bab0ac"


def book_style() -> None:
    """Larger fonts: book figures are shown at the column's width, and on phones at 400 px."""
    plt.rcParams.update({"font.size": 12, "axes.titlesize": 12, "axes.labelsize": 12, "legend.fontsize": 11,
                         "xtick.labelsize": 11, "ytick.labelsize": 11, "figure.dpi": 100, "savefig.dpi": 100})


# ---- the four collectives ----------------------------------------------------------------------

COLLECTIVES = [  # (result key in collectives.py's JSON, title, what the input is, how to colour the output)
    ("all_gather(my shard)", "all-gather: every rank gets every rank's shard", "shard", "origin"),
    ("reduce_scatter(full)", "reduce-scatter: rank r gets the sum of everyone's r-th shard", "full", "sum"),
    ("all_reduce(full)", "all-reduce: every rank gets the sum of all tensors", "full", "sum"),
    ("broadcast(from rank 0)", "broadcast: every rank gets rank 0's tensor", "full", "rank0"),
]


def _row(ax, y, values, colors, x0=0.0, w=1.0):
    for i, (v, c) in enumerate(zip(values, colors)):
        ax.add_patch(Rectangle((x0 + i * w, y), w, 0.8, fc=c, ec="white", lw=1.5))
        ax.text(x0 + (i + 0.5) * w, y + 0.4, str(int(v)), ha="center", va="center", fontsize=9,
                color="white" if c != SUM_COLOR else "black")


def collectives_diagram(demo: dict):
    """Four stacked panels (legible on narrow screens): inputs on the left, outputs on the right."""
    world, numel = demo["world"], demo["numel"]
    results = demo["results"]
    shard = numel // world
    fig, axes = plt.subplots(len(COLLECTIVES), 1, figsize=(7.5, 2.1 * len(COLLECTIVES) + 0.4))
    gap = 2.5
    for ax, (key, title, kind, colour) in zip(axes, COLLECTIVES):
        outputs = results[key]
        for r in range(world):
            y = world - 1 - r
            full = results["input (full)"][r]
            ins = full[r * shard:(r + 1) * shard] if kind == "shard" else full
            x_in = r * shard if kind == "shard" else 0
            _row(ax, y, ins, [RANK_COLORS[r]] * len(ins), x0=x_in)
            out = outputs[r]
            if colour == "origin":
                cols = [RANK_COLORS[i // shard] for i in range(len(out))]
            elif colour == "rank0":
                cols = [RANK_COLORS[0]] * len(out)
            else:
                cols = [SUM_COLOR] * len(out)
            x_out = numel + gap + (r * shard if key.startswith("reduce_scatter") else 0)
            _row(ax, y, out, cols, x0=x_out)
            ax.text(-0.3, y + 0.4, f"rank {r}", ha="right", va="center", fontsize=10)
        ax.annotate("", xy=(numel + gap - 0.3, world / 2), xytext=(numel + 0.3, world / 2),
                    arrowprops=dict(arrowstyle="->", lw=2))
        ax.text(numel / 2, world + 0.1, "before", ha="center", fontsize=10, color="dimgrey")
        ax.text(numel + gap + numel / 2, world + 0.1, "after", ha="center", fontsize=10, color="dimgrey")
        ax.set_title(title, fontsize=11, loc="left")
        ax.set(xlim=(-2.2, 2 * numel + gap + 0.2), ylim=(-0.2, world + 0.7))
        ax.axis("off")
    fig.tight_layout()
    return fig


# ---- one Muon step on a 2 x 2 grid -------------------------------------------------------------

# Numbered as the stages of chapter 5's list and of the code's comments (flows.py, distributed.py):
# 1 reduce-scatter, 2 momentum, 3 DP gather, 4 TP gather, 5 Newton-Schulz, 6 TP shard + DP shard,
# 7 update, 8 parameter all-gather. The figure draws 2-6, the stages that move the momentum.
FLOW_STAGES = [
    ("momentum_shard", "2. momentum:\nmy DP shard (fp32)", "shard"),
    ("dp_gathered", "3. DP gather\n(bucket, bf16)", "tp_block"),
    ("tp_gathered", "4. TP gather\n(whole matrix)", "whole"),
    ("orthogonalised", "5. Newton-Schulz\n(whole matrix)", "whole"),
    ("dp_shard", "6. TP shard, then\nDP shard: kept", "shard"),
]


def step_flow_diagram(trace: dict, metas_by_dp: list, name: str = "w3"):
    """Rows: ranks; columns: stages. Each cell is the whole matrix ``name`` (outline, its TP halves
    dashed); the filled part is what the rank holds of it at that stage. ``metas_by_dp[d]`` is DP
    rank ``d``'s ``dist_meta`` for the matrix (its TP-local shape, global and local ranges)."""
    ranks = trace["ranks"]
    tp = trace["tp"]
    meta0 = metas_by_dp[0]
    rows_full, cols_full = meta0.full_shape
    split = meta0.tp_split_dim
    fig, axes = plt.subplots(len(ranks), len(FLOW_STAGES), figsize=(9, 1.9 * len(ranks) + 0.9))
    aspect = rows_full / cols_full
    for i, rank in enumerate(ranks):
        meta = metas_by_dp[rank["dp_rank"]]
        events = {e["stage"]: e for e in rank["events"] if e["name"] == name}
        events.update({e["stage"]: e for e in rank["events"] if e["stage"] in ("momentum_shard", "dp_gathered")
                       and e["stage"] not in events})
        lo, hi = (x - meta.global_range[0] for x in meta.local_range)
        block_rows, block_cols = meta.shape
        for j, (stage, label, region) in enumerate(FLOW_STAGES):
            ax = axes[i][j]
            ax.add_patch(Rectangle((0, 0), 1, aspect, fill=False, ec="black", lw=1))
            for t in range(1, tp):  # TP cut lines
                if split == 1:
                    ax.plot([t / tp] * 2, [0, aspect], ls="--", color="grey", lw=0.8)
                elif split == 0:
                    ax.plot([0, 1], [aspect * t / tp] * 2, ls="--", color="grey", lw=0.8)
            color = "#e45756" if stage in ("orthogonalised", "dp_shard") else "#4c78a8"
            t = rank["tp_rank"]
            # the TP-local block, in units of the whole matrix (x: columns, y: rows from the top)
            bx, bw = (t / tp, 1 / tp) if split == 1 else (0, 1)
            by, bh = (t / tp, 1 / tp) if split == 0 else (0, 1)
            if region == "whole":
                ax.add_patch(Rectangle((0, 0), 1, aspect, fc=color, alpha=0.8))
            elif region == "tp_block":
                ax.add_patch(Rectangle((bx, aspect * (1 - by - bh)), bw, aspect * bh, fc=color, alpha=0.8))
            elif hi > lo:  # my DP elements of the TP-local block, row-major: whole rows, drawn as a band
                top, bottom = lo / (block_rows * block_cols), hi / (block_rows * block_cols)
                ax.add_patch(Rectangle((bx, aspect * (1 - by - bh * bottom)), bw, aspect * bh * (bottom - top),
                                       fc=color, alpha=0.8))
            e = events.get(stage)
            if e is not None:
                what = "x".join(map(str, e["shape"])) if len(e["shape"]) > 1 else f"{e['numel']:,} el."
                dtype = {"float32": "fp32", "bfloat16": "bf16"}.get(e["dtype"], e["dtype"])
                ax.text(0.5, -0.08, f"{what} {dtype}",
                        ha="center", va="top", fontsize=8.5, transform=ax.transData)
            ax.set(xlim=(-0.05, 1.05), ylim=(-0.32, aspect + 0.05))
            ax.set_aspect("equal")
            ax.axis("off")
            if i == 0:
                ax.set_title(label, fontsize=10)
        axes[i][0].text(-0.15, aspect / 2, f"rank {rank['rank']}\ndp {rank['dp_rank']}, tp {rank['tp_rank']}",
                        ha="right", va="center", fontsize=10)
    fig.tight_layout()
    return fig

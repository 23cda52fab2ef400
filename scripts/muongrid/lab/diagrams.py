"""Diagrams for the book, drawn with matplotlib from what the scripts really did.

- ``collectives_diagram(demo)``: the four collectives of ``scripts/collectives.py``'s run, each
  rank's tensor before and after, every element coloured by the rank it came from.
- ``layouts_diagram(plans_by_layout)``: one matrix under chapter 8's three layouts (bucket, owner,
  aligned) on a DP-only grid, from the real ``build_plan`` of each: which piece each rank holds,
  who runs Newton-Schulz, what moves.
- ``holders_diagram(...)``: chapter 11's ZeRO-1 x TP against FSDP2 + FSDPMuon: who holds what.
- ``step_flow_diagram(trace, plan_metas)``: one Distributed Muon step on a 2 x 2 grid, for one
  matrix: which part of it each rank holds at each stage, from ``scripts/trace_step.py``'s trace
  (shapes, dtypes) and the ZeRO-1 plan (where each rank's shard lies).

``book_style()`` sets font sizes that stay legible when a page is read on a narrow screen.
"""
from __future__ import annotations

from . import palette

RANK_COLORS = palette.RANK
SUM_COLOR = palette.NEUTRAL["sum"]


def book_style() -> None:
    """Larger fonts: book figures are shown at the column's width, and on phones at 400 px."""
    import matplotlib.pyplot as plt

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
    from matplotlib.patches import Rectangle

    for i, (v, c) in enumerate(zip(values, colors)):
        ax.add_patch(Rectangle((x0 + i * w, y), w, 0.8, fc=c, ec="white", lw=1.5))
        ax.text(x0 + (i + 0.5) * w, y + 0.4, str(int(v)), ha="center", va="center", fontsize=9,
                color="white" if c != SUM_COLOR else "black")


def collectives_diagram(demo: dict):
    """Four stacked panels (legible on narrow screens): inputs on the left, outputs on the right."""
    import matplotlib.pyplot as plt

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
# 1 reduce-scatter, 2 momentum and the Nesterov update, 3 DP gather, 4 TP gather, 5 Newton-Schulz, 6 TP shard +
# DP shard, 7 update, 8 parameter all-gather. The figure draws 2-6, the stages that move the Nesterov update.
FLOW_STAGES = [
    # the trace reads this rank's shard of the Nesterov update as it leaves for the gather, in bf16 (the momentum
    # itself stays fp32)
    ("momentum_shard", "2. Nesterov update:\nmy shard, sent as bf16", "shard"),
    ("dp_gathered", "3. DP gather\n(bucket, bf16)", "tp_block"),
    ("tp_gathered", "4. TP gather\n(whole matrix)", "whole"),
    ("orthogonalised", "5. Newton-Schulz\n(whole matrix)", "whole"),
    ("dp_shard", "6. TP shard, then\nDP shard: kept", "shard"),
]


def step_flow_diagram(trace: dict, metas_by_dp: list, name: str = "w3"):
    """Rows: ranks; columns: stages. Each cell is the whole matrix ``name`` (outline, its TP halves
    dashed); the filled part is what the rank holds of it at that stage. ``metas_by_dp[d]`` is DP
    rank ``d``'s ``dist_meta`` for the matrix (its TP-local shape, global and local ranges)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

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
            color = palette.STATE["orthogonalised" if stage in ("orthogonalised", "dp_shard") else "momentum"]
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


# ---- chapter 8: the three layouts, for one matrix ----------------------------------------------

LAYOUT_MOVES = {  # what travels for Newton-Schulz, in words; the numbers come from the plan
    "bucket": ("DP all-gather: every rank\nreceives the pieces it lacks", "every rank runs\nNewton-Schulz",
               "each keeps\nits own piece"),
    "owner": ("pieces go to the owner,\nrank {owner}", "only the owner runs\nNewton-Schulz",
              "owner sends the\npieces back"),
    "aligned": ("nothing moves: the matrix\nis whole on rank {owner}", "only rank {owner} runs\nNewton-Schulz",
                "nothing moves"),
}


def _piece_band(ax, x, aspect, lo, hi, numel, color):
    """Rows [lo, hi) of a row-major matrix of ``numel`` elements, drawn as a band in the outline at x."""
    from matplotlib.patches import Rectangle

    if hi > lo:
        top, bottom = lo / numel, hi / numel
        ax.add_patch(Rectangle((x, aspect * (1 - bottom)), 1, aspect * (bottom - top), fc=color, alpha=0.85))


def layouts_diagram(plans_by_layout: dict, name: str = "w3"):
    """One matrix under each layout on a DP-only grid: which piece each DP rank holds of its momentum
    (blue), who runs Newton-Schulz on the whole matrix (red), and the orthogonalised pieces kept.
    ``plans_by_layout[layout]`` is the list of every DP rank's ``build_plan(..., layout=layout)``."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    layouts = list(plans_by_layout)
    dp = len(plans_by_layout[layouts[0]])
    fig, axes = plt.subplots(len(layouts), 1, figsize=(9, 1.75 * len(layouts) + 0.6))
    gap, width = 0.35, 1.0
    stage_w = dp * (width + gap) + 1.6
    for ax, layout in zip(axes, layouts):
        plans = plans_by_layout[layout]
        meta = next(m for m in plans[0].metas[0] if m.name == name)
        rows, cols = meta.shape
        aspect = min(rows / cols, 1.2)
        pieces = [plans[0].piece_slice(meta, r) for r in range(dp)]
        owner = None if layout == "bucket" else plans[0].owner_of(meta)
        runs_ns = list(range(dp)) if owner is None else [owner]
        for s in range(3):
            x0 = s * stage_w
            for r in range(dp):
                x = x0 + r * (width + gap)
                ax.add_patch(Rectangle((x, 0), width, aspect, fill=False, ec="black", lw=1))
                ax.text(x + width / 2, -0.12, f"rank {r}", ha="center", va="top", fontsize=9)
                if s == 0:
                    _piece_band(ax, x, aspect, pieces[r].start, pieces[r].stop, meta.numel, palette.STATE["momentum"])
                elif s == 1 and r in runs_ns:
                    ax.add_patch(Rectangle((x, 0), width, aspect, fc=palette.STATE["orthogonalised"], alpha=0.85))
                elif s == 2:
                    _piece_band(ax, x, aspect, pieces[r].start, pieces[r].stop, meta.numel,
                                palette.STATE["orthogonalised"])
            moved = [meta.numel - (pieces[r].stop - pieces[r].start) for r in range(dp)]
            text = LAYOUT_MOVES[layout][s].format(owner=owner)
            if s == 0 and layout == "bucket":
                text += f"\n(up to {max(moved):,} el. each)"
            elif s == 0 and layout == "owner":
                text += f"\n({moved[owner]:,} el. in all)"
            ax.text(x0 + (dp * (width + gap) - gap) / 2, aspect + 0.08, text, ha="center", va="bottom",
                    fontsize=9)
            if s < 2:
                ax.annotate("", xy=(x0 + stage_w - 0.45, aspect / 2), xytext=(x0 + stage_w - 1.15, aspect / 2),
                            arrowprops=dict(arrowstyle="->", lw=1.8))
        ax.text(-0.25, aspect / 2, layout, ha="right", va="center", fontsize=12, fontweight="bold")
        ax.set(xlim=(-1.6, 3 * stage_w - 1.4), ylim=(-0.45, aspect + 0.75))
        ax.set_aspect("equal")
        ax.axis("off")
    handles = [Rectangle((0, 0), 1, 1, fc=palette.STATE["momentum"], alpha=0.85),
               Rectangle((0, 0), 1, 1, fc=palette.STATE["orthogonalised"], alpha=0.85)]
    fig.legend(handles, ["Nesterov update (Newton-Schulz input)", "orthogonalised update"], loc="lower center",
               ncol=2, frameon=False, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


# ---- chapter 11: ZeRO-1 x TP against FSDP2 + FSDPMuon, who holds what ---------------------------

def _fsdp2_tp_rows(shape, dp: int, tp: int) -> list:
    """Every world rank's rectangle of a matrix split by rows over TP and then by FSDP2 over DP
    (``Shard(0)`` of each TP shard: ``torch.chunk``'s split, as ``muongrid.lab.choice.fsdp2_row_pieces``)."""
    from .choice import fsdp2_row_pieces
    from ..fsdp_routes import Piece

    rows, cols = shape
    block = rows // tp
    out = []
    for d in range(dp):
        for t in range(tp):
            p = fsdp2_row_pieces((block, cols), dp)[d]
            out.append(Piece((t * block + p.offset[0], 0), p.shape))
    return out


def holders_diagram(shapes=((64, 64), (192, 64)), dp: int = 2, tp: int = 2, bucket_numel: int = 1 << 20):
    """Two matrices (split by rows over TP) on a dp x tp grid: what each rank holds of them at rest
    (weights), as optimizer state, and for Newton-Schulz, under ZeRO-1 x TP with the owner layout and
    under FSDP2 x TP with FSDPMuon. Computed with the real ``build_plan`` (ZeRO-1) and
    ``fsdp_routes.routes`` (FSDPMuon's owners) on the same shapes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from ..fsdp_routes import routes
    from ..plan import ParamSpec, build_plan

    names = [f"w{i}" for i in range(len(shapes))]
    specs = [[ParamSpec(n, s, 0) for n, s in zip(names, shapes)]]
    plans = [build_plan(specs, dp, d, tp, bucket_numel, layout="owner") for d in range(dp)]
    metas = plans[0].metas[0]
    fsdp_pieces = [_fsdp2_tp_rows(s, dp, tp) for s in shapes]
    fsdp = routes(list(shapes), [[fsdp_pieces[m][r] for m in range(len(shapes))] for r in range(dp * tp)], tp=tp)
    world = dp * tp

    def zero1(kind, r, m):  # (row fraction from, to) of the whole matrix, or "whole"
        d, t = divmod(r, tp)
        rows = shapes[m][0]
        if kind == "ns":
            return (0, 1) if plans[0].owner_of(metas[m]) == r else None
        if kind == "weights":
            return (t / tp, (t + 1) / tp)
        piece = plans[0].piece_slice(metas[m], d)
        n = metas[m].numel
        return (t / tp + piece.start / n / tp, t / tp + piece.stop / n / tp) if piece.stop > piece.start else None

    def fsdp2(kind, r, m):
        if kind == "ns":
            return (0, 1) if fsdp.owners[m] == r else None
        p, rows = fsdp_pieces[m][r], shapes[m][0]
        return (p.offset[0] / rows, (p.offset[0] + p.shape[0]) / rows) if p.shape[0] else None

    schemes = [("ZeRO-1 x TP, owner layout", zero1), ("FSDP2 x TP + FSDPMuon", fsdp2)]
    kinds = [("weights", "weights at rest"), ("state", "momentum (state)"), ("ns", "Newton-Schulz")]
    colors = {"weights": palette.STATE["model"], "state": palette.STATE["momentum"],
              "ns": palette.STATE["orthogonalised"]}
    fig, axes = plt.subplots(len(schemes), 1, figsize=(9, 3.1 * len(schemes) + 0.3))
    mat_w, mat_gap, rank_gap = 0.6, 0.15, 0.5
    cell_w = len(shapes) * (mat_w + mat_gap) + rank_gap
    for ax, (title, where) in zip(axes, schemes):
        for k, (kind, label) in enumerate(kinds):
            y0 = (len(kinds) - 1 - k) * 1.45
            ax.text(-0.2, y0 + 0.5, label, ha="right", va="center", fontsize=10)
            for r in range(world):
                for m, (rows, cols) in enumerate(shapes):
                    h = min(1.1, 0.35 * rows / cols + 0.3)
                    x = r * cell_w + m * (mat_w + mat_gap)
                    ax.add_patch(Rectangle((x, y0), mat_w, h, fill=False, ec="black", lw=0.8))
                    for t in range(1, tp):  # the TP cut
                        ax.plot([x, x + mat_w], [y0 + h * (1 - t / tp)] * 2, ls="--", color="grey", lw=0.6)
                    span = where(kind, r, m)
                    if span is not None:
                        top, bottom = span
                        ax.add_patch(Rectangle((x, y0 + h * (1 - bottom)), mat_w, h * (bottom - top),
                                               fc=colors[kind], alpha=0.9))
                    if k == len(kinds) - 1:
                        ax.text(x + mat_w / 2, y0 - 0.08, names[m], ha="center", va="top", fontsize=8)
                if k == 0:
                    d, t = divmod(r, tp)
                    ax.text(r * cell_w + (cell_w - rank_gap) / 2, y0 + 1.35, f"rank {r}\n(dp {d}, tp {t})",
                            ha="center", va="bottom", fontsize=9)
        ax.set_title(title, loc="left", fontsize=11, fontweight="bold")
        ax.set(xlim=(-2.4, world * cell_w), ylim=(-0.5, len(kinds) * 1.45 + 0.55))
        ax.set_aspect("equal")
        ax.axis("off")
    fig.tight_layout()
    return fig

"""Chapter 5's explorer: one Distributed Muon step, stage by stage, on every rank, from real traced runs.

``scripts/trace_step.py --layouts bucket,owner`` runs one step of the real optimizer per layout with its
trace hook on and reports, for every rank, what it held at each stage (the trace), its plan and state,
and the ledger's record of every collective. This module turns such runs into a figure that moves
without a kernel:

- at the top, buttons over the grids (dp x tp) that were traced and a slider over the stages of the step
  (0 before it, 1 reduce-scatter, 2 momentum and the Nesterov update, 3 the gather for Newton-Schulz,
  4 the TP gather, 5 Newton-Schulz, 6 keep my slice, 7 update, 8 all-gather);
- the bucket and owner layouts side by side: a box per rank (rows DP, columns TP; ``box_grid``) with a bar per
  matrix, the part of the whole matrix the rank holds at that stage, its shape (or element count)
  and dtype; below, who sends how many bytes to whom in that stage (rows: from, columns: to). A ring
  collective is drawn as the ring it is (each rank to the next of its group); hovering a cell names
  the matrix pieces of that transfer, who keeps each and, under the owner layout, its owner
  (``step_transfers``).

Nothing is drawn from a formula: holdings come from the trace events (and, where the hook sees no
tensor, from the plan and state the run reported), bytes from the ledger. ``stage_rows`` is that data
as rows, which the tests hold against the ledger's per-rank summary and the closed form
(``costmodel.step_bytes``). As in ``explorers``, every position is computed when the chapter runs.

A grid keeps the stage: the slider shows a stage's traces for every grid at once, and each grid is
drawn ``OFFSET`` units further along the same axes, so a grid button only moves the axes' window
(a relayout) and never touches what the slider chose. Each grid's stage title is an annotation on the
first panel's axis, drawn only while that axis shows its grid. The figure is laid out for the book's
column at 1280 px (about 660 px wide) and keeps at least ``MIN_WIDTH`` px on a narrow screen, where it
scrolls sideways as a whole instead of overlapping.

    from muongrid.lab.notebook import last_json, run
    from muongrid.lab.step_explorer import step_explorer
    traces = [last_json(run(f"trace_step.py --dp {d} --tp {t} --layouts bucket,owner")) for d, t in grids]
    show(step_explorer(traces))
"""
from __future__ import annotations

import math

from . import palette
from .explorers import BASE_LAYOUT
from .step_transfers import describe, transfers

# (slider label, title, the phases whose bytes belong to the stage, what happens, by layout)
STAGES = [
    ("0 start", "Before the step", (),
     dict(all="each rank holds the gradient of its TP slice of every matrix (fp32), from its own batch")),
    ("1 grads", "Reduce-scatter the gradients", ("grad_reduce_scatter",),
     dict(all="ring reduce-scatter over DP (fp32): each rank keeps the mean gradient of its shard")),
    ("2 Nesterov", "Momentum, then the Nesterov update", (),
     dict(all="elementwise on the shard, in fp32 (nothing moves); stage 3 sends the update as bf16")),
    ("3 gather", "Gather the Nesterov update for Newton-Schulz", ("ns_gather_dp", "ns_to_owner"),
     dict(bucket="ring all-gather of the whole bucket over DP (bf16): every TP slice on every rank",
          owner="all-to-all (bf16): each piece straight to its matrix's owner, TP slices too")),
    ("4 TP", "TP gather", ("ns_gather_tp",),
     dict(bucket="ring all-gather of each TP-split matrix over TP (bf16): whole, on every rank",
          owner="nothing moves: each owner already has its matrices whole")),
    ("5 NS", "Newton-Schulz", (),
     dict(bucket="on every matrix, on every rank", owner="once per matrix, on its owner")),
    ("6 slice", "Keep my slice", ("ns_from_owner",),
     dict(bucket="my TP slice of each result, then my DP part of it (nothing moves)",
          owner="all-to-all back (bf16): each rank gets its piece of every result")),
    ("7 update", "Update the master shard", (),
     dict(all="weight decay and the scaled step on the fp32 master shard (nothing moves)")),
    ("8 params", "All-gather the parameters", ("param_all_gather",),
     dict(all="ring all-gather over DP (fp32): each rank has its TP slice of every matrix, updated")),
]
LAYOUTS = ("bucket", "owner")
LAYOUT_NOTE = {"bucket": " (the paper's)", "owner": " (one owner per matrix)"}
# The figure in pixels (the book's column is ~660 px at 1280): controls and stage title above the panels.
HEIGHT, TOP, BOTTOM, ROWS, GAP = 710, 200, 28, (0.68, 0.32), 0.1
PLOT_PX = HEIGHT - TOP - BOTTOM
PANEL_PX = ROWS[0] * (1 - GAP) * PLOT_PX   # the rank boxes' height
MIN_WIDTH = 640        # px: narrower screens scroll the figure sideways (explorers.Figure)
OFFSET = 10            # axis units between two grids' drawings
NAME_COLUMN = 0.085    # of a panel's width, for "w3" left of its bar
DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def runs_of(trace: dict) -> list[dict]:
    """The layouts' runs of one ``trace_step.py`` JSON line, one per layout it stepped."""
    if "runs" not in trace:
        raise ValueError("not a trace_step.py JSON line with its runs (run it with --layouts bucket,owner)")
    return trace["runs"]


def _label(shape, numel: int, dtype: str) -> str:
    """A matrix's shape when the tensor is one (or a whole TP-local block), else its element count."""
    shape_text = "×".join(map(str, shape))
    return f"{shape_text} {DTYPE.get(dtype, dtype)}" if len(shape) > 1 else f"{numel:,} el. {DTYPE.get(dtype, dtype)}"


def holdings(rank: dict, stage: int, layout: str) -> list[dict]:
    """What ``rank`` (one rank's report) holds after ``stage``: per matrix it holds any of, the elements,
    the whole matrix's elements and a label (shape or count, dtype)."""
    matrices = rank["matrices"]
    events: dict[str, dict] = {}
    for e in rank["events"]:
        events.setdefault(e["stage"], {})[e["name"]] = e

    def piece(m, dtype):   # the matrix's piece of this rank's flat shard (fp32 state, or the grad)
        shape = m["shape"] if m["piece"] == math.prod(m["shape"]) else [m["piece"]]
        return m["piece"], _label(shape, m["piece"], dtype)

    def traced(m, *stages):   # the first of ``stages`` the hook saw for this matrix
        for s in stages:
            e = events.get(s, {}).get(m["name"])
            if e is not None:
                return e["numel"], _label(e["shape"], e["numel"], e["dtype"])
        return 0, ""

    grad_dtype = next(iter(events.get("grad_shard", {}).values()), {}).get("dtype", matrices[0]["grad"]["dtype"])
    out = []
    for i, m in enumerate(matrices):
        if stage == 0:
            numel, label = math.prod(m["grad"]["shape"]), _label(m["grad"]["shape"], 0, m["grad"]["dtype"])
        elif stage == 1:
            numel, label = piece(m, grad_dtype)
        elif stage in (2, 7):
            numel, label = piece(m, rank["state"]["momentum" if stage == 2 else "master"]["dtype"])
        elif stage == 3:
            numel, label = traced(m, "ns_input")
        elif stage == 4:
            numel, label = traced(m, "tp_gathered", "ns_input")
        elif stage == 5:
            numel, label = traced(m, "orthogonalised")
        elif stage == 6:
            numel, label = traced(m, "dp_shard" if layout == "bucket" else "from_owner")
        else:
            numel, label = math.prod(m["param"]["shape"]), _label(m["param"]["shape"], 0, m["param"]["dtype"])
        if numel:
            out.append(dict(index=i, name=m["name"], numel=numel, whole=math.prod(m["full_shape"]), label=label,
                            owner=m.get("owner")))
    return out


def stage_rows(traces: list[dict]) -> list[dict]:
    """One row per (grid, layout, stage, rank): what the rank holds, and what it sends to whom (``sends``: bytes
    per receiving rank; ``transfers``: those bytes with their pieces). Every ledger phase of the step must fall in
    some stage (a phase this explorer does not know fails here)."""
    known = {p for s in STAGES for p in s[2]}
    rows = []
    for trace in traces:
        dp, tp = trace["dp"], trace["tp"]
        for run in runs_of(trace):
            for rank in run["ranks"]:
                unknown = {r["phase"] for r in rank["records"]} - known
                if unknown:
                    raise ValueError(f"ledger phases {sorted(unknown)} belong to no stage of the explorer")
                for stage in range(len(STAGES)):
                    moved = transfers(run["ranks"], rank["rank"], STAGES[stage][2], dp, tp)
                    to = {q: t["bytes"] for q, t in moved.items()}
                    rows.append(dict(dp=dp, tp=tp, layout=run["layout"], stage=stage,
                                     rank=rank["rank"], dp_rank=rank["dp_rank"], tp_rank=rank["tp_rank"],
                                     sends=to, transfers=moved, bytes_sent=sum(to.values()),
                                     holds=holdings(rank, stage, run["layout"]),
                                     matrices=[m["name"] for m in rank["matrices"]],
                                     ns_runs=sum(e["stage"] == "orthogonalised" for e in rank["events"]),
                                     bf16_copy=sum(e["numel"] for e in rank["events"]
                                                   if e["stage"] in ("momentum_shard", "to_owner"))))
    return rows


def _bytes(b: float) -> str:
    if b >= 1e6:
        return f"{b / 1e6:.2f} MB"
    return f"{b / 1e3:.0f} kB" if b >= 1e3 else f"{b:.0f} B"


def _r(values) -> list:
    """Coordinates to 4 decimals (a tenth of a pixel): the page carries every frame, so this halves it."""
    return [None if v is None else round(v, 4) for v in values]


def _tint(colour: str, amount: float) -> str:
    """``colour`` (a palette hex string) mixed with white: 0 keeps it, 1 is white."""
    rgb = [int(colour[k:k + 2], 16) for k in (1, 3, 5)]
    return "rgb({},{},{})".format(*(round(c + (255 - c) * amount) for c in rgb))


def _note(r: dict, stage: int) -> str:
    """The second line of a rank's header: what it sends, or does, in this stage (short: a box is ~140 px)."""
    if r["bytes_sent"]:
        return f"<b>sends {_bytes(r['bytes_sent'])}</b>"
    if stage == 5:
        return f"Newton-Schulz × {r['ns_runs']}"
    if stage == 2 and r["bf16_copy"]:
        return f"bf16 out: {r['bf16_copy']:,} el."
    return ""


def box_grid(dp: int, tp: int) -> tuple[int, int]:
    """Rows and columns of the rank boxes, filled in rank order: a row per DP rank and a column per TP rank,
    except that more than two DP ranks without TP fill two columns (four boxes in one column would leave a bar
    less than a line of text)."""
    return (dp, tp) if tp > 1 or dp <= 2 else (-(-dp // 2), 2)


def _hover(r: dict, q: int, layout: str) -> str:
    """The pieces of one transfer (rank ``r['rank']`` to ``q``), one per line."""
    t = r["transfers"].get(q)
    if t is None:
        return f"rank {r['rank']} → rank {q}: nothing"
    lines = [f"<b>rank {r['rank']} → rank {q}</b>: {t['kind']}, {DTYPE.get(t['dtype'], t['dtype'])}, {t['bytes']:,} B"]
    if t["kind"].startswith("ring"):
        lines.append("passes on, to the next rank of the ring:")
    owners = layout != "bucket" and t["kind"] == "all-to-all"
    lines += [describe(p, owners) for p in t["pieces"]]
    if t["padding"]:
        lines.append(f"+ {t['padding']:,} B of the shards' padding")
    return "<br>".join(lines)


def _panel(rows: list[dict], dp: int, tp: int, layout: str, stage: int, col: int, zmax: float, x0: float) -> list:
    """The traces of one layout at one stage: a box per rank, bars, text (row 1) and the send matrix (row 2),
    drawn ``x0`` units along the axes (the grid's place). The boxes are laid out in pixels of the panel's
    height (``PANEL_PX``), so text never overlaps."""
    import plotly.graph_objects as go

    xa, ya = ("x", "y") if col == 1 else ("x2", "y2")
    xm, ym = ("x3", "y3") if col == 1 else ("x4", "y4")
    phase = next((p for p in STAGES[stage][2] if any(r["sends"] for r in rows)), None)
    edge = palette.PHASE[phase] if phase else palette.NEUTRAL["edge"]
    box_x, box_y, bars, text = [], [], [], []
    count = len(rows[0]["matrices"]) if rows else 1
    px = 1 / PANEL_PX   # one pixel, in the panel's units (vertically)
    n_rows, n_cols = box_grid(dp, tp)
    for r in rows:
        w, h = 1 / n_cols, 1 / n_rows
        left, y0 = x0 + r["rank"] % n_cols * w, r["rank"] // n_cols * h
        mx = 0.012
        box_x += [left + mx, left + w - mx, left + w - mx, left + mx, left + mx, None]
        box_y += [y0 + 3 * px, y0 + 3 * px, y0 + h - 3 * px, y0 + h - 3 * px, y0 + 3 * px, None]
        note = _note(r, stage)
        head = f"<b>rank {r['rank']}</b> (dp {r['dp_rank']}, tp {r['tp_rank']})"
        one_line = n_cols == 1   # a wide box: the note beside the rank
        text.append((left + mx + 0.01, y0 + 14 * px, head + (f"  ·  {note}" if one_line and note else ""), "black", 11))
        if note and not one_line:
            text.append((left + mx + 0.01, y0 + 28 * px, note, "black", 11))
        top = y0 + (24 if one_line else 38) * px
        pitch = (y0 + h - 6 * px - top) / count
        start, end = left + mx + NAME_COLUMN, left + w - mx - 0.012
        for held in r["holds"]:
            y = top + pitch * (held["index"] + 0.5)
            bars.append((y, start, end - start, held, r))
            text.append((left + mx + 0.01, y, held["name"], palette.matrix(held["index"]), 11))
            text.append((start + 0.008, y, held["label"], "black", 10))
    thick = min(0.8 * pitch, 15 * px) if rows else 0
    where = {"bucket": "on every rank", "owner": "on its owner, rank {}"}

    def orthogonalised(held):
        return where["bucket"] if layout == "bucket" else where["owner"].format(held["owner"])

    # the boxes' outlines: one path in the page, of one closed run per box (the browser test reads them)
    out = [go.Scatter(x=_r(box_x), y=_r(box_y), mode="lines", hoverinfo="skip",
                      line=dict(color=edge, width=2 if phase else 1), showlegend=False, xaxis=xa, yaxis=ya)]
    out.append(go.Bar(orientation="h", y=_r(b[0] for b in bars), base=_r(b[1] for b in bars),
                      x=_r(b[2] for b in bars), width=_r([thick] * len(bars)),
                      marker=dict(color=palette.NEUTRAL["padding"], opacity=0.35),
                      hoverinfo="skip", showlegend=False, xaxis=xa, yaxis=ya))
    out.append(go.Bar(orientation="h", y=_r(b[0] for b in bars), base=_r(b[1] for b in bars),
                      x=_r(b[2] * b[3]["numel"] / b[3]["whole"] for b in bars), width=_r([thick] * len(bars)),
                      marker=dict(color=[palette.matrix(b[3]["index"]) for b in bars], opacity=0.45),
                      customdata=[[b[4]["rank"], b[3]["name"], f"{b[3]['numel']:,}", f"{b[3]['whole']:,}",
                                   b[3]["label"], orthogonalised(b[3])] for b in bars],
                      hovertemplate="rank %{customdata[0]} holds %{customdata[2]} of %{customdata[1]}'s "
                                    "%{customdata[3]} elements (%{customdata[4]})<br>Newton-Schulz runs "
                                    "%{customdata[5]}<extra></extra>", showlegend=False, xaxis=xa, yaxis=ya))
    out.append(go.Scatter(x=_r(t[0] for t in text), y=_r(t[1] for t in text), mode="text", text=[t[2] for t in text],
                          textposition="middle right",
                          textfont=dict(size=[t[4] for t in text], color=[t[3] for t in text]),
                          hoverinfo="skip", showlegend=False, xaxis=xa, yaxis=ya))
    world = dp * tp
    z = [[0] * world for _ in range(world)]
    for r in rows:
        for q, b in r["sends"].items():
            z[r["rank"]][q] = b
    by_rank = {r["rank"]: r for r in rows}
    hover = [[_hover(by_rank[p], q, layout) if p != q else f"rank {p}" for q in range(world)] for p in range(world)]
    if not any(map(any, z)):
        out.append(go.Scatter(x=[x0 + (world - 1) / 2], y=[(world - 1) / 2], mode="text", text=["nothing moves"],
                              textfont=dict(size=13, color=palette.NEUTRAL["reference"]), hoverinfo="skip",
                              showlegend=False, xaxis=xm, yaxis=ym))
    out.append(go.Heatmap(z=z, x=[x0 + q for q in range(world)], y=list(range(world)), zmin=0, zmax=zmax or 1,
                          colorscale=[[0, palette.NEUTRAL["empty"]], [1, _tint(edge, 0.3)]],
                          text=[[_bytes(b) if b else "" for b in row] for row in z], texttemplate="%{text}",
                          textfont=dict(size=10), showscale=False, xgap=2, ygap=2, hovertext=hover,
                          hovertemplate="%{hovertext}<extra></extra>", xaxis=xm, yaxis=ym))
    return out


def _title(stage: int, totals: dict) -> str:
    """The stage, the bytes it moved in all, then what each layout does (one line each)."""
    _, title, _, what = STAGES[stage]
    moved = ", ".join(f"{layout} {_bytes(b)}" for layout, b in totals.items())
    head = f"<b>Stage {stage} of {len(STAGES) - 1}: {title}</b>"
    head += f"<br>bytes sent, all ranks: {moved}" if any(totals.values()) else "<br>nothing moves"
    if "all" in what:
        return f"{head}<br>{what['all']}"
    return head + "".join(f"<br><i>{layout}</i>: {what[layout]}" for layout in totals)


def _paper_y(px_from_top: float) -> float:
    """A height in the figure (pixels down from its top edge) in paper units (0: the plot area's bottom)."""
    return 1 + (TOP - px_from_top) / PLOT_PX


def step_explorer(traces: list[dict], active_grid=(2, 2), active_stage: int = 3) -> go.Figure:
    """The figure: buttons over the traced grids and a slider over the stages (above), bucket and owner side by
    side. The stage survives a grid switch (see the module docstring)."""
    from plotly.subplots import make_subplots

    rows = stage_rows(traces)
    grids = list(dict.fromkeys((t["dp"], t["tp"]) for t in traces))
    layouts = [l for l in LAYOUTS if any(r["layout"] == l for r in rows)]
    fig = make_subplots(rows=2, cols=len(layouts), row_heights=list(ROWS), vertical_spacing=GAP,
                        horizontal_spacing=0.07,
                        subplot_titles=[f"<b>{l}</b> layout" + LAYOUT_NOTE.get(l, "") for l in layouts]
                        + ["bytes sent, from rank (rows) to rank (columns)"] * len(layouts))
    stage_of, titles = [], {}
    for k, g in enumerate(grids):
        zmax = max([b for r in rows if (r["dp"], r["tp"]) == g for b in r["sends"].values()] + [1])
        for stage in range(len(STAGES)):
            totals = {}
            for col, layout in enumerate(layouts, 1):
                mine = sorted((r for r in rows if (r["dp"], r["tp"], r["layout"], r["stage"]) == (*g, layout, stage)),
                              key=lambda r: r["rank"])
                totals[layout] = sum(r["bytes_sent"] for r in mine)
                for trace in _panel(mine, *g, layout, stage, col, zmax, OFFSET * k):
                    trace.visible = stage == active_stage
                    fig.add_trace(trace)
                    stage_of.append(stage)
            titles[(g, stage)] = _title(stage, totals)
    active = tuple(active_grid) if tuple(active_grid) in grids else grids[0]
    subplot_titles = list(fig.layout.annotations)
    for a in subplot_titles:
        a.font = dict(size=13)
    first_title = len(subplot_titles) + 1   # after the subplots' titles and the buttons' label
    title_keys = {g: f"annotations[{first_title + k}].text" for k, g in enumerate(grids)}

    def window(g):   # the axes' window on grid g: its panels and its send matrices, with their ticks
        k, world = grids.index(g), g[0] * g[1]
        out = {}
        for c in range(1, len(layouts) + 1):
            out[f"xaxis{'' if c == 1 else c}.range"] = [OFFSET * k, OFFSET * k + 1]
            m = c + len(layouts)
            out[f"xaxis{m}.range"] = [OFFSET * k - 0.5, OFFSET * k + world - 0.5]
            out[f"xaxis{m}.tickvals"] = [OFFSET * k + q for q in range(world)]
            out[f"xaxis{m}.ticktext"] = [str(q) for q in range(world)]
            out[f"yaxis{m}.range"] = [world - 0.5, -0.5]
            out[f"yaxis{m}.tickvals"] = list(range(world))
        return out

    slider = dict(active=active_stage, pad=dict(t=0, l=0, r=0, b=0), len=1.0, x=0, xanchor="left",
                  y=_paper_y(44), yanchor="top", currentvalue=dict(visible=False), font=dict(size=10),
                  steps=[dict(label=STAGES[s][0], method="update",
                              args=[{"visible": [o == s for o in stage_of]},
                                    {title_keys[g]: titles[(g, s)] for g in grids}])
                         for s in range(len(STAGES))])
    buttons = [dict(label=f"{g[0]} x {g[1]}", method="relayout", args=[window(g)]) for g in grids]
    fig.update_layout(**BASE_LAYOUT)
    fig.update_layout(
        title=dict(text=""), height=HEIGHT, barmode="overlay", margin=dict(l=10, r=10, t=TOP, b=BOTTOM),
        sliders=[slider], meta=dict(min_width=MIN_WIDTH),
        updatemenus=[dict(type="buttons", direction="right", buttons=buttons, showactive=True,
                          active=grids.index(active), x=0.17, xanchor="left", y=_paper_y(4), yanchor="top",
                          pad=dict(t=0, b=0, l=0, r=0), font=dict(size=12))],
        annotations=subplot_titles + [
            dict(text="grid (dp x tp):", x=0.16, xanchor="right", y=_paper_y(4), yanchor="top", xref="paper",
                 yref="paper", showarrow=False, font=dict(size=13), yshift=-8)] + [
            # each grid's stage title sits on the first panel's axis, at its grid's place: shown with its grid
            dict(text=titles[(g, active_stage)], x=OFFSET * k + 0.001, xanchor="left", xref="x",
                 y=_paper_y(104), yanchor="top", yref="paper", showarrow=False, align="left", font=dict(size=12))
            for k, g in enumerate(grids)])
    for k in range(1, len(layouts) + 1):
        fig.update_xaxes(visible=False, fixedrange=True, row=1, col=k)
        fig.update_yaxes(range=[1, 0], visible=False, fixedrange=True, row=1, col=k)
    fig.update_xaxes(row=2, tickmode="array", fixedrange=True, showgrid=False, zeroline=False)
    fig.update_yaxes(row=2, tickmode="array", fixedrange=True, showgrid=False, zeroline=False)
    fig.update_layout(_window_layout(window(active)))
    assert [fig.layout.annotations[first_title + k].text for k in range(len(grids))] == \
        [titles[(g, active_stage)] for g in grids]   # title_keys' indices
    return fig


def _window_layout(relayout: dict) -> dict:
    """A relayout's ``"xaxis3.range": [...]`` keys as a layout update (``{"xaxis3": {"range": [...]}}``)."""
    out: dict = {}
    for key, value in relayout.items():
        axis, prop = key.split(".")
        out.setdefault(axis, {})[prop] = value
    return out

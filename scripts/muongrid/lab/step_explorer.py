"""Chapter 5's explorer: one Distributed Muon step, stage by stage, on every rank, from real traced runs.

``scripts/trace_step.py --layouts bucket,owner`` runs one step of the real optimizer per layout with its
trace hook on and reports, for every rank, what it held at each stage (the trace), its plan and state,
and the ledger's record of every collective with the bytes it delivered to each other rank. This module
turns such runs into a figure that moves without a kernel:

- a slider over the stages of the step (0 before it, 1 reduce-scatter, 2 momentum, 3 the gather for
  Newton-Schulz, 4 the TP gather, 5 Newton-Schulz, 6 keep my slice, 7 update, 8 all-gather);
- buttons over the grids (dp x tp) that were traced;
- the bucket and owner layouts side by side: on top a box per rank (rows DP, columns TP) with a bar per
  matrix, the part of the whole matrix the rank holds at that stage, its shape (or element count)
  and dtype; below, who sends how many bytes to whom in that stage (rows: from, columns: to).

Nothing is drawn from a formula: holdings come from the trace events (and, where the hook sees no
tensor, from the plan and state the run reported), bytes from the ledger (``Comm.peers``). ``stage_rows``
is that data as rows, which the tests hold against the ledger's per-rank summary and the closed form
(``costmodel.step_bytes``). As in ``explorers``, every position is computed when the chapter runs and
the page only switches which traces are visible.

    from muongrid.lab.notebook import last_json, run
    from muongrid.lab.step_explorer import step_explorer
    traces = [last_json(run(f"trace_step.py --dp {d} --tp {t} --layouts bucket,owner")) for d, t in grids]
    show(step_explorer(traces))
"""
from __future__ import annotations

import math

from . import palette
from .explorers import BASE_LAYOUT

# (slider label, title, the phases whose bytes belong to the stage, what happens, by layout)
STAGES = [
    ("0 start", "Before the step", (),
     dict(all="each rank holds the gradient of its TP slice of every matrix (fp32), from its own batch")),
    ("1 grads", "Reduce-scatter the gradients", ("grad_reduce_scatter",),
     dict(all="over DP, fp32: each rank keeps the mean gradient of its DP shard of the bucket")),
    ("2 momentum", "Momentum on the shard", (),
     dict(all="elementwise, kept in fp32 (nothing moves); the next stage sends a bf16 copy")),
    ("3 gather", "Gather for Newton-Schulz", ("ns_gather_dp", "ns_to_owner"),
     dict(bucket="all-gather the whole bucket over DP (bf16): every matrix's TP slice on every rank",
          owner="all-to-all (bf16): every piece to its matrix's owner, TP slices too")),
    ("4 TP", "TP gather", ("ns_gather_tp",),
     dict(bucket="all-gather each TP-split matrix over TP (bf16): every matrix whole, on every rank",
          owner="nothing moves: each owner already has its matrices whole")),
    ("5 NS", "Newton-Schulz", (),
     dict(bucket="on every matrix, on every rank", owner="once per matrix, on its owner")),
    ("6 slice", "Keep my slice", ("ns_from_owner",),
     dict(bucket="my TP slice of each result, then my DP part of it (nothing moves)",
          owner="all-to-all back (bf16): each rank gets its piece of every result")),
    ("7 update", "Update the master shard", (),
     dict(all="weight decay and the scaled step on the fp32 master shard (nothing moves)")),
    ("8 params", "All-gather the parameters", ("param_all_gather",),
     dict(all="over DP, fp32: each rank has its TP slice of every matrix, updated")),
]
LAYOUTS = ("bucket", "owner")
LAYOUT_NOTE = {"bucket": " (the paper's)", "owner": " (one owner per matrix)"}
# The figure's height and where its panels sit (pixels): the rank boxes are laid out in these.
HEIGHT, TOP, BOTTOM, ROWS, GAP = 940, 115, 180, (0.68, 0.32), 0.1
PANEL_PX = ROWS[0] * (1 - GAP) * (HEIGHT - TOP - BOTTOM)
NAME_COLUMN = 0.085   # of a panel's width, for "w3" left of its bar: ~25 px at the book's width (a panel ~300 px)
DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def runs_of(trace: dict) -> list[dict]:
    """The layouts' runs of one ``trace_step.py`` JSON line, one per layout it stepped."""
    if "runs" not in trace:
        raise ValueError("not a trace_step.py JSON line with its runs (run it with --layouts bucket,owner)")
    return trace["runs"]


def _size(shape) -> int:
    return math.prod(shape)


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
        shape = m["shape"] if m["piece"] == _size(m["shape"]) else [m["piece"]]
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
            numel, label = _size(m["grad"]["shape"]), _label(m["grad"]["shape"], 0, m["grad"]["dtype"])
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
            numel, label = _size(m["param"]["shape"]), _label(m["param"]["shape"], 0, m["param"]["dtype"])
        if numel:
            out.append(dict(index=i, name=m["name"], numel=numel, whole=_size(m["full_shape"]), label=label))
    return out


def sends(rank: dict, stage: int) -> dict[int, int]:
    """Bytes ``rank`` sends to each other rank in ``stage``, from its ledger records."""
    out: dict[int, int] = {}
    for r in rank["records"]:
        if r["phase"] in STAGES[stage][2]:
            for q, b in r["peers"].items():
                out[int(q)] = out.get(int(q), 0) + b
    return out


def stage_rows(traces: list[dict]) -> list[dict]:
    """One row per (grid, layout, stage, rank): what the rank holds, and what it sends to whom. Every
    ledger phase of the step must fall in some stage (a phase this explorer does not know fails here)."""
    known = {p for s in STAGES for p in s[2]}
    rows = []
    for trace in traces:
        for run in runs_of(trace):
            for rank in run["ranks"]:
                unknown = {r["phase"] for r in rank["records"]} - known
                if unknown:
                    raise ValueError(f"ledger phases {sorted(unknown)} belong to no stage of the explorer")
                for stage in range(len(STAGES)):
                    to = sends(rank, stage)
                    rows.append(dict(dp=trace["dp"], tp=trace["tp"], layout=run["layout"], stage=stage,
                                     rank=rank["rank"], dp_rank=rank["dp_rank"], tp_rank=rank["tp_rank"],
                                     sends=to, bytes_sent=sum(to.values()),
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


def _panel(rows: list[dict], dp: int, tp: int, layout: str, stage: int, col: int, zmax: float) -> list:
    """The traces of one layout at one stage: rank boxes, bars, text (row 1) and the send matrix (row 2).
    The boxes are laid out in pixels of the panel's height (``PANEL_PX``), so text never overlaps."""
    import plotly.graph_objects as go

    xa, ya = ("x", "y") if col == 1 else ("x2", "y2")
    xm, ym = ("x3", "y3") if col == 1 else ("x4", "y4")
    phase = next((p for p in STAGES[stage][2] if any(r["sends"] for r in rows)), None)
    edge = palette.PHASE[phase] if phase else palette.NEUTRAL["edge"]
    box_x, box_y, bars, text = [], [], [], []
    count = len(rows[0]["matrices"]) if rows else 1
    px = 1 / PANEL_PX   # one pixel, in the panel's units (vertically)
    for r in rows:
        x0, y0, w, h = r["tp_rank"] / tp, r["dp_rank"] / dp, 1 / tp, 1 / dp
        mx = 0.012
        box_x += [x0 + mx, x0 + w - mx, x0 + w - mx, x0 + mx, x0 + mx, None]
        box_y += [y0 + 3 * px, y0 + 3 * px, y0 + h - 3 * px, y0 + h - 3 * px, y0 + 3 * px, None]
        note = (f"<b>sends {_bytes(r['bytes_sent'])}</b>" if r["bytes_sent"] else
                f"Newton-Schulz × {r['ns_runs']}" if stage == 5 else
                f"sends next, in bf16: {r['bf16_copy']:,} el." if stage == 2 and r["bf16_copy"] else "")
        head = f"<b>rank {r['rank']}</b> (dp {r['dp_rank']}, tp {r['tp_rank']})"
        one_line = tp == 1   # a wide box: the note beside the rank
        text.append((x0 + mx + 0.01, y0 + 14 * px, head + (f"  ·  {note}" if one_line and note else ""), "black"))
        if note and not one_line:
            text.append((x0 + mx + 0.01, y0 + 28 * px, note, "black"))
        top = y0 + (24 if one_line else 38) * px
        pitch = (y0 + h - 6 * px - top) / count
        left, right = x0 + mx + NAME_COLUMN, x0 + w - mx - 0.012
        for held in r["holds"]:
            y = top + pitch * (held["index"] + 0.5)
            bars.append((y, left, right - left, held, r))
            text.append((x0 + mx + 0.01, y, held["name"], palette.matrix(held["index"])))
    thick = min(0.8 * pitch, 15 * px) if rows else 0
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
                                   b[3]["label"]] for b in bars],
                      hovertemplate="rank %{customdata[0]}, %{customdata[1]}: %{customdata[2]} of %{customdata[3]} "
                                    "elements (%{customdata[4]})<extra></extra>", showlegend=False, xaxis=xa, yaxis=ya))
    out.append(go.Scatter(x=_r(b[1] + 0.008 for b in bars), y=_r(b[0] for b in bars), mode="text",
                          text=[b[3]["label"] for b in bars], textposition="middle right",
                          textfont=dict(size=10, color="black"), hoverinfo="skip", showlegend=False,
                          xaxis=xa, yaxis=ya))
    out.append(go.Scatter(x=_r(t[0] for t in text), y=_r(t[1] for t in text), mode="text", text=[t[2] for t in text],
                          textposition="middle right", textfont=dict(size=11, color=[t[3] for t in text]),
                          hoverinfo="skip", showlegend=False, xaxis=xa, yaxis=ya))
    world = dp * tp
    z = [[0] * world for _ in range(world)]
    for r in rows:
        for q, b in r["sends"].items():
            z[r["rank"]][q] = b
    if not any(map(any, z)):
        out.append(go.Scatter(x=[(world - 1) / 2], y=[(world - 1) / 2], mode="text", text=["nothing moves"],
                              textfont=dict(size=13, color=palette.NEUTRAL["reference"]), hoverinfo="skip",
                              showlegend=False, xaxis=xm, yaxis=ym))
    out.append(go.Heatmap(z=z, x=list(range(world)), y=list(range(world)), zmin=0, zmax=zmax or 1,
                          colorscale=[[0, palette.NEUTRAL["empty"]], [1, _tint(edge, 0.3)]],
                          text=[[_bytes(b) if b else "" for b in row] for row in z], texttemplate="%{text}",
                          textfont=dict(size=11), showscale=False, xgap=2, ygap=2,
                          hovertemplate="rank %{y} → rank %{x}: %{z:,} bytes<extra></extra>", xaxis=xm, yaxis=ym))
    return out


def _title(stage: int, totals: dict) -> str:
    """Two or three lines: the stage and the bytes it moved in all, then what each layout does."""
    _, title, _, what = STAGES[stage]
    moved = ", ".join(f"{layout} {_bytes(b)}" for layout, b in totals.items())
    head = f"<b>Stage {stage} of {len(STAGES) - 1}: {title}</b>" + (
        f" · bytes sent, all ranks: {moved}" if any(totals.values()) else " · nothing moves")
    if "all" in what:
        return f"{head}<br>{what['all']}"
    return head + "".join(f"<br><i>{layout}</i>: {what[layout]}" for layout in totals)


def step_explorer(traces: list[dict], active_grid=(2, 2), active_stage: int = 3) -> go.Figure:
    """The figure: buttons over the traced grids, a slider over the stages, bucket and owner side by side."""
    from plotly.subplots import make_subplots

    rows = stage_rows(traces)
    grids = list(dict.fromkeys((t["dp"], t["tp"]) for t in traces))
    layouts = [l for l in LAYOUTS if any(r["layout"] == l for r in rows)]
    fig = make_subplots(rows=2, cols=len(layouts), row_heights=list(ROWS), vertical_spacing=GAP,
                        horizontal_spacing=0.07,
                        subplot_titles=[f"<b>{l}</b> layout" + LAYOUT_NOTE.get(l, "") for l in layouts]
                        + ["bytes sent in this stage"] * len(layouts))
    owner, titles = [], {}
    for g in grids:
        zmax = max([b for r in rows if (r["dp"], r["tp"]) == g for b in r["sends"].values()] + [1])
        for stage in range(len(STAGES)):
            totals = {}
            for col, layout in enumerate(layouts, 1):
                mine = sorted((r for r in rows if (r["dp"], r["tp"], r["layout"], r["stage"]) == (*g, layout, stage)),
                              key=lambda r: r["rank"])
                totals[layout] = sum(r["bytes_sent"] for r in mine)
                for trace in _panel(mine, *g, layout, stage, col, zmax):
                    trace.visible = (g, stage) == (tuple(active_grid), active_stage)
                    fig.add_trace(trace)
                    owner.append((g, stage))
            titles[(g, stage)] = _title(stage, totals)

    def slider(g):
        # labels at 10 px: all nine fit a rail of ~530 px (the book's column gives it ~580; Plotly
        # shows every other label when they would touch)
        return dict(active=active_stage, pad=dict(t=0, l=0, r=0), len=0.96, x=0.01, y=-0.045, yanchor="top",
                    currentvalue=dict(prefix="stage ", font=dict(size=13)), font=dict(size=10),
                    steps=[dict(label=STAGES[s][0], method="update",
                                args=[{"visible": [o == (g, s) for o in owner]}, {title_key: titles[(g, s)]}])
                           for s in range(len(STAGES))])

    def axes(g):   # the send matrices' ranks
        world = g[0] * g[1]
        return {f"{a}axis{k}.range": r for k in range(len(layouts) + 1, 2 * len(layouts) + 1)
                for a, r in (("x", [-0.5, world - 0.5]), ("y", [world - 0.5, -0.5]))}

    active = tuple(active_grid) if tuple(active_grid) in grids else grids[0]
    title_key = f"annotations[{2 * len(layouts) + 1}].text"   # the subplots' titles, the buttons' label, then this
    buttons = [dict(label=f"{g[0]} x {g[1]}", method="update",
                    args=[{"visible": [o == (g, active_stage) for o in owner]},
                          {"sliders": [slider(g)], title_key: titles[(g, active_stage)], **axes(g)}])
               for g in grids]
    fig.update_layout(**BASE_LAYOUT)
    fig.update_layout(title=dict(text=""),   # the stage's title is an annotation (Plotly's own misplaces 3 lines)
                      height=HEIGHT, barmode="overlay", margin=dict(l=10, r=10, t=TOP, b=BOTTOM),
                      sliders=[slider(active)],
                      updatemenus=[dict(type="buttons", direction="right", buttons=buttons, showactive=True,
                                        active=grids.index(active), x=0.2, xanchor="left", y=-0.205,
                                        yanchor="top", pad=dict(t=0, b=0), font=dict(size=12))],
                      annotations=list(fig.layout.annotations) + [
                          dict(text="grid (dp x tp):", x=0.19, xanchor="right", y=-0.205, yanchor="top",
                               xref="paper", yref="paper", showarrow=False, font=dict(size=13), yshift=-4),
                          dict(text=titles[(active, active_stage)], x=0, xanchor="left", y=1, yanchor="bottom",
                               xref="paper", yref="paper", yshift=30, showarrow=False, align="left",
                               font=dict(size=13))])
    for k in range(1, len(layouts) + 1):
        fig.update_xaxes(range=[0, 1], visible=False, fixedrange=True, row=1, col=k)
        fig.update_yaxes(range=[1, 0], visible=False, fixedrange=True, row=1, col=k)
    fig.update_xaxes(row=2, tickmode="linear", dtick=1, title=dict(text="to rank", standoff=4), fixedrange=True,
                     showgrid=False, zeroline=False)
    fig.update_yaxes(row=2, tickmode="linear", dtick=1, title=dict(text="from rank", standoff=4), fixedrange=True,
                     showgrid=False, zeroline=False)
    fig.update_layout(**{k.replace(".range", ""): dict(range=v) for k, v in axes(active).items()})
    fig.update_annotations(font_size=13)
    assert fig.layout.annotations[-1].text == titles[(active, active_stage)]   # title_key's index
    return fig

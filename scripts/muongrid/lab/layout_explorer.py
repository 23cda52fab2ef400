"""Chapter 13's explorer: every layout on a chosen set of shapes and grid, without a kernel.

A menu picks the shapes ("balanced stack", "report shapes", "Llama-3-8B layer"), a slider the grid
(dp x tp); four panels compare Distributed AdamW and Muon's three layouts: bytes each rank sends per
step (the label: x AdamW), Newton-Schulz on the busiest rank (the label: how many ranks run it on each
matrix), optimizer state per rank, and the modelled step time on two profiles (``timemodel``: an H100
cluster from public figures, and this machine as calibrated, on grids of at most its ``max_ranks``). Every position is computed here, when
the chapter runs (``explorer_rows``); the page only switches which precomputed bars are visible, as
``explorers.slider_figure`` does, so it moves in the static book. Axis ranges are fixed per set of
shapes, so moving the slider never rescales them.

    from muongrid.lab.layout_explorer import explorer_rows, layout_explorer
    rows = explorer_rows()              # one dict per (shapes, grid, layout), also for tables
    show(layout_explorer(rows))
"""
from __future__ import annotations

import math

from . import costmodel, timemodel
from .choice import STATE_BYTES
from .explorers import BASE_LAYOUT
from .model_shapes import llama3_8b
from .synthetic import REPORT_SHAPES, REPORT_TP_DIMS, stack_shapes

ADAMW_STATE_BYTES = 4 + 4 + 4  # fp32 master, first and second moments per element of a shard
GRIDS = ((2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (2, 4), (16, 4))
ACTIVE_GRID = (2, 2)
LAYOUT_COLORS = {"adamw": "#1f77b4", "bucket": "#d62728", "owner": "#ff7f0e", "aligned": "#2ca02c"}
LAYOUT_NAMES = {"adamw": "AdamW", "bucket": "bucket", "owner": "owner", "aligned": "aligned"}
PROFILE_COLORS = ("#54585a", "#bab0ac")


def shape_sets() -> dict[str, list[dict]]:
    """The three sets of Muon matrices (``costmodel`` groups): a balanced 4-layer stack (d_model 512), the
    community report's five shapes (one 4096 x 4096 holds most of the work) and one layer of Llama-3-8B
    (``model_shapes.llama3_8b``, its 7 matrices)."""
    stack, dims = stack_shapes(layers=4)
    specs, _ = llama3_8b(layers=1)
    return {"balanced stack": [dict(shapes=stack, tp_split_dims=dims, use_muon=True)],
            "report shapes": [dict(shapes=REPORT_SHAPES, tp_split_dims=REPORT_TP_DIMS, use_muon=True)],
            "Llama-3-8B layer": [dict(shapes=[s.full_shape for s in specs[0]],
                                      tp_split_dims=[s.tp_split_dim for s in specs[0]], use_muon=True)]}


def explorer_rows(sets: dict | None = None, grids=GRIDS, bucket_numel: int | None = None,
                  profiles: list[dict] | None = None) -> list[dict]:
    """One row per (shapes, grid, layout in ``timemodel.CLASSIC_LAYOUTS``): mean bytes sent per rank and that
    over AdamW's, Newton-Schulz runs per matrix and the busiest rank's FLOPs, optimizer state per rank
    (largest shard, padding included) and the modelled step on each profile (``seconds``, by name)."""
    sets = shape_sets() if sets is None else sets
    bucket_numel = "auto" if bucket_numel is None else bucket_numel
    profiles = [timemodel.h100(), timemodel.this_machine()] if profiles is None else profiles
    rows = []
    for name, groups in sets.items():
        for dp, tp in grids:
            adamw = costmodel.step_bytes(groups, dp, tp, bucket_numel, muon=False)["total"]
            for layout in timemodel.CLASSIC_LAYOUTS:
                muon = layout != "adamw"
                plan_layout = layout if muon else "bucket"
                plans = costmodel.plans_for(groups, dp, tp, bucket_numel, plan_layout, muon)
                sent = costmodel.step_bytes(groups, dp, tp, bucket_numel, muon=muon, layout=plan_layout)["total"]
                times = {hw["name"]: timemodel.step_seconds(groups, dp, tp, bucket_numel, layout, hw)
                         for hw in profiles if dp * tp <= hw.get("max_ranks", dp * tp)}
                rows.append(dict(shapes=name, dp=dp, tp=tp, layout=layout, bytes_per_rank=sent,
                                 vs_adamw=sent / adamw if adamw else None,
                                 ns_runs_per_matrix=0 if not muon else dp * tp if layout == "bucket" else 1,
                                 busiest_ns_flops=timemodel.busiest_ns_flops(groups, dp, tp, bucket_numel, layout),
                                 state_bytes_per_rank=max(p.local_state_numel() for p in plans)
                                 * (STATE_BYTES if muon else ADAMW_STATE_BYTES),
                                 seconds=times))
    return rows


def _frame_traces(rows: list[dict], profile_names: list[str]) -> list:
    import plotly.graph_objects as go

    x = [LAYOUT_NAMES[r["layout"]] for r in rows]
    colors = [LAYOUT_COLORS[r["layout"]] for r in rows]
    ratio = ["" if r["vs_adamw"] is None else f"{r['vs_adamw']:.2f}x" for r in rows]
    traces = [
        go.Bar(x=x, y=[r["bytes_per_rank"] / 1e6 for r in rows], marker_color=colors, text=ratio, showlegend=False,
               textposition="outside", hovertemplate="%{x}: %{y:.3g} MB (%{text} AdamW)<extra></extra>",
               xaxis="x", yaxis="y"),
        go.Bar(x=x, y=[r["busiest_ns_flops"] / 1e9 for r in rows], marker_color=colors, showlegend=False,
               text=[f"{r['ns_runs_per_matrix']} run{'s' * (r['ns_runs_per_matrix'] != 1)}" if r["ns_runs_per_matrix"]
                     else "" for r in rows], textposition="outside",
               hovertemplate="%{x}: %{y:.4g} GFLOP, %{text} per matrix<extra></extra>", xaxis="x2", yaxis="y2"),
        go.Bar(x=x, y=[r["state_bytes_per_rank"] / 1e6 for r in rows], marker_color=colors, showlegend=False,
               hovertemplate="%{x}: %{y:.3g} MB<extra></extra>", xaxis="x3", yaxis="y3"),
    ]
    for name, color in zip(profile_names, PROFILE_COLORS):
        t = [r["seconds"].get(name) for r in rows]  # None: the profile does not run this many ranks
        traces.append(go.Bar(x=x, y=[s and s["total"] * 1e3 for s in t], name=name, marker_color=color,
                             customdata=[[s and s["comm"] * 1e3, s and s["newton_schulz"] * 1e3] for s in t],
                             hovertemplate="%{x}: %{y:.3g} ms (comm %{customdata[0]:.3g} + NS %{customdata[1]:.3g})"
                                           "<extra>" + name + "</extra>", xaxis="x4", yaxis="y4"))
    return traces


def _title(name: str, dp: int, tp: int, rows: list[dict], profile_names: list[str]) -> str:
    by = {r["layout"]: r for r in rows}
    fastest = {p: LAYOUT_NAMES[min((r for r in rows if r["layout"] != "adamw"),
                                   key=lambda r: r["seconds"][p]["total"])["layout"]]
               for p in profile_names if p in rows[0]["seconds"]}
    return (f"{name}, {dp} x {tp}: bucket {by['bucket']['vs_adamw']:.2f}x, owner {by['owner']['vs_adamw']:.2f}x, "
            f"aligned {by['aligned']['vs_adamw']:.2f}x AdamW's bytes<br>fastest Muon step: "
            + ", ".join(f"{v} ({k.split(' (')[0].replace(' cluster', '')})" for k, v in fastest.items()))


def _range(values: list[float], log: bool = False) -> list[float]:
    positive = [v for v in values if v > 0]
    if log:
        return [math.log10(min(positive)) - 0.3, math.log10(max(positive)) + 0.3]
    return [0, max(values) * 1.22 or 1]


def layout_explorer(rows: list[dict]) -> go.Figure:
    """The figure: a menu over the sets of shapes, a slider over the grids, four panels of bars."""
    from plotly.subplots import make_subplots

    sets = list(dict.fromkeys(r["shapes"] for r in rows))
    grids = list(dict.fromkeys((r["dp"], r["tp"]) for r in rows))
    profile_names = list(dict.fromkeys(p for r in rows for p in r["seconds"]))
    fig = make_subplots(rows=2, cols=2, vertical_spacing=0.2, horizontal_spacing=0.12, subplot_titles=(
        "MB sent per rank, mean (label: x AdamW)", "NS GFLOP, busiest rank (label: runs)",
        "optimizer state per rank (MB)", "modelled step, ms (log scale)"))
    frames, owner = {}, []
    for s in sets:
        for g in grids:
            frame = [r for r in rows if r["shapes"] == s and (r["dp"], r["tp"]) == g]
            frames[(s, g)] = frame
            for trace in _frame_traces(frame, profile_names):
                trace.visible = False
                fig.add_trace(trace)
                owner.append((s, g))
    active = grids.index(ACTIVE_GRID) if ACTIVE_GRID in grids else 0

    def visible(s, g):
        return [o == (s, g) for o in owner]

    def axes(s):
        mine = [r for r in rows if r["shapes"] == s]
        times = [t["total"] * 1e3 for r in mine for t in r["seconds"].values()]
        return {"yaxis.range": _range([r["bytes_per_rank"] / 1e6 for r in mine]),
                "yaxis2.range": _range([r["busiest_ns_flops"] / 1e9 for r in mine]),
                "yaxis3.range": _range([r["state_bytes_per_rank"] / 1e6 for r in mine]),
                "yaxis4.range": _range(times, log=True)}

    def slider(s):
        return dict(active=active, pad=dict(t=30), currentvalue=dict(prefix="grid dp x tp: ", font=dict(size=13)),
                    steps=[dict(label=f"{g[0]}x{g[1]}", method="update",
                                args=[{"visible": visible(s, g)},
                                      {"title.text": _title(s, *g, frames[(s, g)], profile_names)}])
                           for g in grids])

    first = sets[0]
    for i, on in enumerate(visible(first, grids[active])):
        fig.data[i].visible = on
    buttons = [dict(label=s, method="update",
                    args=[{"visible": visible(s, grids[active])},
                          {"sliders": [slider(s)], "title.text": _title(s, *grids[active], frames[(s, grids[active])],
                                                                         profile_names), **axes(s)}])
               for s in sets]
    fig.update_layout(**BASE_LAYOUT)
    fig.update_layout(height=720, barmode="group", margin=dict(l=60, r=20, t=130, b=40),
                      title=dict(text=_title(first, *grids[active], frames[(first, grids[active])], profile_names),
                                 font=dict(size=13)),
                      legend=dict(orientation="h", yanchor="bottom", y=1.16, xanchor="right", x=1, font=dict(size=11)),
                      sliders=[slider(first)],
                      updatemenus=[dict(buttons=buttons, direction="down", x=0, xanchor="left", y=1.16,
                                        yanchor="bottom", showactive=True, active=0)])
    fig.update_layout(**{k.replace(".range", ""): dict(range=v) for k, v in axes(first).items()})
    fig.update_yaxes(type="log", row=2, col=2)
    fig.update_annotations(font_size=12)  # the subplot titles
    return fig

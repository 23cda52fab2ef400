"""Chapter 15's explorer: the plans at scale, model x grid x layout, without a kernel.

One slider position per (model, grid) that ``scripts/plan_at_scale.py --json`` reported; each shows two
panels for that plan, both from the report's own numbers:

- Newton-Schulz ms per step on the busiest rank, projected with the report's assumed H100 figures, for
  one owner per matrix, the two FLOP-sized group rules, the optimizer's time-sized groups and the ideal
  (log scale, one range for every position);
- what the group plan costs besides, as group / owner: GB the busiest rank sends per step, the
  collectives it joins, and the optimizer step's projected ms (the dotted line is 1: the same as owner).

The title states the NS load max/mean of both plans and their build times. As in ``explorers``, every
position is computed when the chapter runs and the page only switches which bars are visible.

    from muongrid.lab.scale_explorer import scale_explorer
    show(scale_explorer([("Llama-3-8B", row), ...]))     # rows: plan_at_scale.py --json's "rows"
"""
from __future__ import annotations

import math

from . import palette
from .explorers import BASE_LAYOUT

RULES = {"owner": ("owner", "owner"), "scattered": ("FLOP, any ranks", "group_scattered"),
         "flops": ("FLOP windows", "group_flops"), "group": ("group (timed)", "group"),
         "ideal": ("ideal", "ideal")}
COSTS = {"GB per rank": "_bytes_per_rank_max", "collectives": "_collectives_per_rank_max", "opt. step ms": "_step_ms"}


def _frame(name: str, row: dict) -> tuple[list[go.Bar], str]:
    import plotly.graph_objects as go

    rules = list(RULES)
    ns = go.Bar(x=[RULES[k][0] for k in rules], y=[row[k + "_ns_ms"] for k in rules],
                marker_color=[palette.LAYOUT[RULES[k][1]] for k in rules], showlegend=False,
                text=[f"{row[k + '_ns_ms']:.1f}" for k in rules], textposition="outside",
                hovertemplate="%{x}: %{y:.2f} ms<extra></extra>", xaxis="x", yaxis="y")
    ratios = [row["group" + k] / row["owner" + k] for k in COSTS.values()]
    cost = go.Bar(x=list(COSTS), y=ratios, marker_color=palette.LAYOUT["group"], showlegend=False,
                  text=[f"{v:.2f}x" for v in ratios], textposition="outside",
                  hovertemplate="%{x}: group / owner %{y:.3f}<extra></extra>", xaxis="x2", yaxis="y2")
    title = (f"{name} on {row['dp']} x {row['tp']} ({row['world']:,} ranks)<br>"
             f"<span style='font-size:12px'>NS max/mean {row['owner_ns_max_over_mean']:.2f} owner, "
             f"{row['group_ns_max_over_mean']:.2f} group; plans built in {row['owner_build_s']:.2f} s "
             f"and {row['group_build_s']:.2f} s (one run each)</span>")
    return [ns, cost], title


def scale_explorer(rows: list[tuple[str, dict]], active: int = 0) -> go.Figure:
    """A slider over ``rows`` ((model name, ``plan_at_scale`` row) pairs), two panels per position."""
    from plotly.subplots import make_subplots

    if not rows:
        raise ValueError("scale_explorer needs at least one (model, plan_at_scale row) pair")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.1,
                        subplot_titles=("Newton-Schulz ms per step, busiest rank (log)",
                                        "group / owner: what else it costs"))
    owners, titles = [], []
    for i, (name, row) in enumerate(rows):
        traces, title = _frame(name, row)
        titles.append(title)
        for trace in traces:
            trace.visible = i == active
            fig.add_trace(trace)
            owners.append(i)
    steps = [dict(label=f"{name.removeprefix('Llama-3-')}<br>{row['dp']}x{row['tp']}", method="update",
                  args=[{"visible": [o == i for o in owners]}, {"title.text": titles[i]}])
             for i, (name, row) in enumerate(rows)]
    ns_all = [r[k + "_ns_ms"] for _, r in rows for k in RULES]
    cost_all = [r["group" + k] / r["owner" + k] for _, r in rows for k in COSTS.values()]
    fig.update_layout(**BASE_LAYOUT)
    # The title sits in its own band below the mode bar (two lines: the model and grid, then the plans'
    # numbers), placed by its middle: anchored at its top, plotly placed the two lines as if they were one
    # and cut the first off. Each slider label takes two short lines, so every position's label shows
    # (plotly leaves out labels that would overlap); the title names the position, so no current value.
    fig.update_layout(title=dict(text=titles[active], font=dict(size=14), x=0.01, xanchor="left",
                                 y=0.91, yanchor="middle", yref="container"),
                      margin=dict(l=60, r=30, t=120, b=40), barmode="group", height=550,
                      sliders=[dict(active=active, steps=steps, pad=dict(t=85, l=20, r=40), x=0.0, len=0.96,
                                    font=dict(size=11), currentvalue=dict(visible=False))])  # the title says it
    fig.update_annotations(font=dict(size=12))            # the two panel titles
    # Decade ticks only: between decades plotly would print 2 and 5, which read as values.
    fig.update_yaxes(type="log", dtick=1, range=[math.log10(min(ns_all) / 2), math.log10(max(ns_all) * 3)],
                     row=1, col=1)
    fig.update_yaxes(range=[0, max(1.0, *cost_all) * 1.2], row=1, col=2)
    fig.add_hline(y=1.0, line=dict(color=palette.NEUTRAL["reference"], dash="dot", width=1), row=1, col=2)
    return fig

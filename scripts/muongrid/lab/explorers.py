"""Explorers that move in the built book without a kernel: Plotly figures with a slider.

Every position of a slider is computed here, in Python, when the chapter runs; the page only
switches between the precomputed traces (Plotly's ``update`` method toggles their visibility and
sets the title). So a reader of the static book can move the slider, and every value the figure
shows was computed by the same functions the chapter uses. ``show`` displays a figure so that the
book, Jupyter and Colab each render it:

    from muongrid.lab.explorers import ns_map_explorer, show
    show(ns_map_explorer())

The book serves ``plotly.min.js`` from the plotly wheel itself (``book/_ext/offline_assets.py``),
so the figures work offline.
"""
from __future__ import annotations

import json
import sys

from . import palette

# A narrow-screen friendly look: legend above the plot, small margins, responsive width.
BASE_LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=60, b=40), height=430,
                   legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0),
                   font=dict(size=13))
CONFIG = {"responsive": True, "displaylogo": False, "modeBarButtonsToRemove": ["select2d", "lasso2d"]}


class Figure:
    """A Plotly figure as a notebook output: HTML for the book, Plotly JSON for Jupyter.

    The HTML carries no plotly.js (the book page loads it once); JupyterLab and VS Code render the
    ``application/vnd.plotly.v1+json`` part themselves. MyST-NB's ``glue`` accepts it too. A figure
    whose ``layout.meta`` names a ``min_width`` (px) keeps that width on a narrower screen and scrolls
    sideways as a whole (``html``).
    """

    def __init__(self, fig: go.Figure):
        self.fig = fig

    def _repr_mimebundle_(self, include=None, exclude=None):
        html = _html(self.fig, include_plotlyjs=False)
        return {"text/html": html, "application/vnd.plotly.v1+json": json.loads(self.fig.to_json()),
                "text/plain": f"<Plotly figure: {self.fig.layout.title.text or 'untitled'}>"}


def show(fig: go.Figure):
    """Display ``fig``: in Colab as HTML that loads plotly.js itself (Colab renders no Plotly JSON, and
    each output there is a frame of its own), elsewhere as a ``Figure`` bundle. Returns the bundle."""
    from IPython.display import HTML, display

    if "google.colab" in sys.modules:
        display(HTML(_html(fig, include_plotlyjs="cdn")))
        return None
    out = Figure(fig)
    display(out)
    return out


def _html(fig: go.Figure, include_plotlyjs) -> str:
    """The figure as an HTML fragment; with ``layout.meta.min_width``, inside a box that scrolls sideways
    below that width (the figure's text does not shrink with the screen, so it would overlap)."""
    html = fig.to_html(full_html=False, include_plotlyjs=include_plotlyjs, config=CONFIG)
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    if meta.get("min_width"):
        html = (f'<div style="overflow-x: auto"><div style="min-width: {int(meta["min_width"])}px">'
                f"{html}</div></div>")
    return html


def slider_figure(frames: list[dict], label: str, active: int = 0, **layout) -> go.Figure:
    """One figure, one slider. ``frames``: dicts with ``label`` (the slider tick), ``title`` and
    ``traces`` (Plotly trace objects). Every frame's traces are in the figure; a slider step shows
    one frame's traces and its title, so the title always states the values drawn."""
    import plotly.graph_objects as go

    fig = go.Figure()
    owner = []
    for i, frame in enumerate(frames):
        for trace in frame["traces"]:
            trace.visible = i == active
            fig.add_trace(trace)
            owner.append(i)
    steps = [dict(label=str(frame["label"]), method="update",
                  args=[{"visible": [o == i for o in owner]}, {"title.text": frame["title"]}])
             for i, frame in enumerate(frames)]
    fig.update_layout(**BASE_LAYOUT)
    fig.update_layout(title=dict(text=frames[active]["title"], font=dict(size=14)),
                      sliders=[dict(active=active, steps=steps, pad=dict(t=45),
                                    currentvalue=dict(prefix=f"{label}: ", font=dict(size=13)))],
                      **layout)
    return fig


# ---- chapter 1: what Newton-Schulz does to singular values -----------------------------------

def ns_map_explorer(max_steps: int = 8, active: int = 5):
    """Slider over the number of NS steps; the cubic (1.5, -0.5, 0) and Jordan's quintic side by side."""
    import plotly.graph_objects as go
    import torch

    from muongrid.newton_schulz import NS_COEFFICIENTS, singular_value_map

    sigma = torch.linspace(0, 1, 401)
    cubic, quintic = (1.5, -0.5, 0.0), tuple(NS_COEFFICIENTS)
    frames = []
    for k in range(1, max_steps + 1):
        traces = [go.Scatter(x=sigma.tolist(), y=singular_value_map(sigma, k, c).tolist(), mode="lines", name=name,
                             line=dict(color=color))
                  for c, name, color in ((cubic, "cubic (1.5, -0.5, 0)", palette.NS_CURVE["cubic"]),
                                         (quintic, f"quintic {quintic}", palette.NS_CURVE["quintic"]))]
        band = singular_value_map(torch.linspace(1e-3, 1, 1000, dtype=torch.float64), k, quintic)
        frames.append(dict(label=k, traces=traces,
                           title=f"{k} step{'s' * (k > 1)}: quintic maps [0.001, 1] into "
                                 f"[{band.min():.3f}, {band.max():.3f}]"))
    fig = slider_figure(frames, "Newton-Schulz steps", active=active - 1,
                        xaxis_title="singular value before (after scaling)", yaxis_title="singular value after")
    fig.add_hline(y=1, line=dict(color="black", width=1, dash="dot"))
    fig.update_yaxes(range=[-0.05, 1.35])
    return fig


def ns_coefficient_explorer(cs=(0.0, 1.0, 1.5, 1.8, 2.0315, 2.2, 2.5), steps=(3, 5), active: float = 2.0315):
    """Slider over the quintic coefficient c, with Jordan's a and b kept: the map after 3 and 5 steps.

    Stands in for a live coefficient widget: every position is computed here, so the static page
    moves and every curve drawn is the map of the coefficients in the title."""
    import plotly.graph_objects as go
    import torch

    from muongrid.newton_schulz import NS_COEFFICIENTS, singular_value_map

    a, b = NS_COEFFICIENTS[0], NS_COEFFICIENTS[1]
    sigma = torch.linspace(0, 1, 401, dtype=torch.float64)
    frames = []
    for c in cs:
        traces = [go.Scatter(x=sigma.tolist(), y=singular_value_map(sigma, k, (a, b, c)).tolist(), mode="lines",
                             name=f"{k} steps", line=dict(color=color, dash=dash))
                  for k, color, dash in zip(steps, (palette.NS_CURVE["3 steps"], palette.NS_CURVE["5 steps"]),
                                            ("dash", "solid"))]
        mapped = singular_value_map(torch.linspace(1e-3, 1, 1000, dtype=torch.float64), steps[-1], (a, b, c))
        lo, hi = mapped.min().item(), mapped.max().item()
        outcome = (f"map [0.001, 1] into [{lo:.3f}, {hi:.3f}]" if max(abs(lo), abs(hi)) < 10
                   else "blow up (|p| > 10 somewhere in [0.001, 1])")
        frames.append(dict(label=f"{c:g}", traces=traces,
                           title=f"p(x) = {a:g}x {b:+g}x³ {c:+g}x⁵: {steps[-1]} steps {outcome}"))
    fig = slider_figure(frames, "quintic coefficient c", active=list(cs).index(active),
                        xaxis_title="singular value before (after scaling)", yaxis_title="singular value after")
    fig.add_hline(y=1, line=dict(color="black", width=1, dash="dot"))
    fig.update_yaxes(range=[-1.6, 1.7])
    return fig


# ---- chapter 2: what one rank stores ----------------------------------------------------------

MEMORY_LAYOUTS = [("DP", dict(dp=8)), ("ZeRO-1", dict(zero=1, dp=8)), ("ZeRO-2", dict(zero=2, dp=8)),
                  ("ZeRO-3 / FSDP", dict(zero=3, dp=8)), ("TP", dict(tp=8)), ("ZeRO-1 DP2 x TP4", dict(zero=1, dp=2, tp=4))]
MEMORY_PARTS = [("params", "parameters (bf16)"), ("grads", "gradients (bf16)"), ("master", "fp32 master"),
                ("optimizer_state", "optimizer state")]


def _totals(rows: list[str], totals_gb: list[float], x_max: float) -> go.Scatter:
    """Each row's total at the end of its bar; a bar longer than the fixed axis is cut at its edge
    and its total, written inside, says by how much."""
    import plotly.graph_objects as go

    return go.Scatter(y=rows, x=[min(t, x_max) for t in totals_gb], mode="text", showlegend=False,
                      text=[f"{t:,.0f} GB" + (" ▶" if t > x_max else "") for t in totals_gb],
                      textposition=["middle left" if t > x_max else "middle right" for t in totals_gb],
                      textfont=dict(size=11), hoverinfo="skip")


def memory_explorer(sizes_b=(0.125, 0.35, 1.3, 3, 7, 13, 34, 70, 175, 405), active_b: float = 7, device_gb: float = 80):
    """Slider over model size (billions of parameters): GB per rank on 8 devices, by layout and optimizer."""
    import plotly.graph_objects as go

    from muongrid.lab.memory import per_rank_bytes

    colors = [palette.MEMORY[key] for key, _ in MEMORY_PARTS]
    x_max = 3 * device_gb  # one axis for every position: the device line stays put
    rows = [f"{name} · {opt}" for name, _ in MEMORY_LAYOUTS for opt in ("AdamW", "Muon")]
    frames = []
    for b in sizes_b:
        per = [per_rank_bytes(b * 1e9, opt.lower(), **kw) for _, kw in MEMORY_LAYOUTS for opt in ("AdamW", "Muon")]
        traces = [go.Bar(y=rows, x=[p[key] / 1e9 for p in per], name=label, orientation="h", marker_color=color,
                         hovertemplate="%{y}: %{x:.2f} GB<extra>" + label + "</extra>")
                  for (key, label), color in zip(MEMORY_PARTS, colors)]
        traces.append(_totals(rows, [p["total"] / 1e9 for p in per], x_max))
        fits = sum(p["total"] / 1e9 <= device_gb for p in per)
        frames.append(dict(label=f"{b:g}B", traces=traces,
                           title=f"{b:g}B parameters, 8 devices: {fits} of {len(rows)} rows fit in {device_gb:g} GB"))
    fig = slider_figure(frames, "model size", active=list(sizes_b).index(active_b), barmode="stack",
                        xaxis_title="GB per rank (no activations)", height=520)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(margin=dict(l=150, t=110))  # title above the two-row legend
    fig.add_vline(x=device_gb, line=dict(color="black", width=1, dash="dot"))
    fig.update_xaxes(range=[0, x_max])
    return fig


def grid_memory_explorer(billions: float = 7, grids=((1, 1), (8, 1), (64, 1), (4, 2), (2, 4), (1, 8), (8, 8), (16, 8)),
                         active=(8, 1), device_gb: float = 80):
    """Slider over the grid (dp x tp) at one model size: GB per rank under each ZeRO stage, for AdamW
    and Muon (mixed precision). Stands in for a live calculator widget."""
    import plotly.graph_objects as go

    from muongrid.lab.memory import STRATEGIES, per_rank_bytes

    colors = [palette.MEMORY[key] for key, _ in MEMORY_PARTS]
    x_max = 3 * device_gb  # one axis for every position: the device line stays put
    rows = [f"{name} · {opt}" for name in STRATEGIES for opt in ("AdamW", "Muon")]
    frames = []
    for dp, tp in grids:
        per = [per_rank_bytes(billions * 1e9, opt.lower(), zero=zero, dp=dp, tp=tp)
               for zero, _ in STRATEGIES.values() for opt in ("AdamW", "Muon")]
        traces = [go.Bar(y=rows, x=[p[key] / 1e9 for p in per], name=label, orientation="h", marker_color=color,
                         hovertemplate="%{y}: %{x:.2f} GB<extra>" + label + "</extra>")
                  for (key, label), color in zip(MEMORY_PARTS, colors)]
        traces.append(_totals(rows, [p["total"] / 1e9 for p in per], x_max))
        z1 = [p["total"] / 1e9 for p in per[2:4]]
        frames.append(dict(label=f"{dp}x{tp}", traces=traces,
                           title=f"{billions:g}B, dp={dp} x tp={tp} ({dp * tp} devices): ZeRO-1 "
                                 f"{z1[0]:.1f} GB (AdamW), {z1[1]:.1f} GB (Muon) per rank"))
    fig = slider_figure(frames, "grid dp x tp", active=list(grids).index(tuple(active)), barmode="stack",
                        xaxis_title="GB per rank (no activations)", height=460)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(margin=dict(l=150, t=110))  # title above the two-row legend
    fig.add_vline(x=device_gb, line=dict(color="black", width=1, dash="dot"))
    fig.update_xaxes(range=[0, x_max])
    return fig


# ---- chapter 4: the virtual buffer -----------------------------------------------------------

def plan_frame(specs, dp: int, tp: int, bucket: int) -> dict:
    """Bars for one ZeRO-1 plan (all DP ranks' plans computed with ``build_plan``) and its summary."""
    import plotly.graph_objects as go

    from muongrid.plan import build_plan

    plans = [build_plan(specs, dp, r, tp, bucket) for r in range(dp)]
    metas, buckets = plans[0].metas[0], plans[0].buckets[0]
    params = go.Bar(y=["parameters"] * len(metas), x=[m.global_range[1] - m.global_range[0] for m in metas],
                    base=[m.global_range[0] for m in metas], orientation="h", showlegend=False,
                    marker=dict(color=[palette.matrix(i) for i in range(len(metas))], line=dict(color="white", width=1)),
                    text=[m.name for m in metas], textposition="inside", insidetextanchor="middle",
                    hovertemplate="%{text}: [%{base:,}, +%{x:,})<extra></extra>")
    pads = [(b.start + b.numel, b.padded_numel - b.numel) for b in buckets if b.padded_numel > b.numel]
    padding = go.Bar(y=["parameters"] * len(pads), x=[w for _, w in pads], base=[s for s, _ in pads], orientation="h",
                     marker=dict(color=palette.NEUTRAL["padding"], pattern=dict(shape="/")), showlegend=False,
                     hovertemplate="padding: %{x}<extra></extra>")
    # Padding is a few elements of a buffer of hundreds of thousands: a bar that thin is invisible,
    # so a marker above the strip points at each bucket's padding.
    pad_marks = go.Scatter(x=[s + w / 2 for s, w in pads], y=["pad"] * len(pads), mode="markers+text",
                           marker=dict(symbol="triangle-down", size=11, color=palette.NEUTRAL["reference"]),
                           text=[f"{w} el." for _, w in pads], textposition="middle left", showlegend=False,
                           hovertemplate="padding: %{text}<extra></extra>")
    shards = [(b.bucket_idx, r, *b.shard_range(r)) for b in buckets for r in range(b.dp)]
    owners = go.Bar(y=["owner"] * len(shards), x=[hi - lo for *_, lo, hi in shards], base=[lo for *_, lo, _ in shards],
                    orientation="h", showlegend=False, text=[f"dp {r}" for _, r, *_ in shards],
                    textposition="inside", insidetextanchor="middle",
                    marker=dict(color=[palette.dp_shard(r) for _, r, *_ in shards], line=dict(color="grey", width=1)),
                    customdata=[b for b, *_ in shards], hovertemplate="bucket %{customdata}, %{text}<extra></extra>")
    straddling = [m.name for i, m in enumerate(metas) if sum(p.metas[0][i].local_numel > 0 for p in plans) > 1]
    return dict(plans=plans, traces=[params, padding, pad_marks, owners], straddling=straddling,
                bucket_starts=[b.start for b in buckets] + [buckets[-1].start + buckets[-1].padded_numel],
                state=plans[0].local_state_numel())


def _plan_axes(fig: go.Figure) -> None:
    """The strips in chapter 4's order, top to bottom: padding marks, parameters, owner (Plotly
    draws the first category at the bottom)."""
    fig.update_layout(bargap=0.15, margin=dict(l=90), uniformtext=dict(minsize=10, mode="hide"))
    fig.update_yaxes(categoryorder="array", categoryarray=["owner", "parameters", "pad"],
                     tickvals=["owner", "parameters", "pad"], ticktext=["owner", "parameters", "padding"])


def plan_explorer(specs, tp: int = 2, bucket: int = 100_000, dps=range(1, 7), active_dp: int = 3):
    """Slider over the DP size: the virtual buffer, its buckets and which DP rank owns each element."""
    frames = []
    for dp in dps:
        f = plan_frame(specs, dp, tp, bucket)
        frames.append(dict(label=dp, traces=f["traces"],
                           title=f"dp={dp}, tp={tp}: straddling {', '.join(f['straddling']) or 'none'}; "
                                 f"state per rank {f['state']:,} elements"))
    fig = slider_figure(frames, "DP size", active=list(dps).index(active_dp), barmode="overlay", height=330,
                        xaxis_title="offset in the virtual buffer (elements)")
    _plan_axes(fig)
    return fig


def bucket_explorer(specs, dp: int = 3, tp: int = 2,
                    buckets=(5_000, 20_000, 50_000, 100_000, 200_000, 400_000, 800_000), active: int = 100_000):
    """Slider over the bucket size at one grid: the same drawing as ``plan_explorer``."""
    frames = []
    for bucket in buckets:
        f = plan_frame(specs, dp, tp, bucket)
        n = len(f["bucket_starts"]) - 1
        frames.append(dict(label=f"{bucket:,}", traces=f["traces"],
                           title=f"buckets of at most {bucket:,}: {n} bucket{'s' * (n > 1)}; straddling "
                                 f"{', '.join(f['straddling']) or 'none'}"))
    fig = slider_figure(frames, "bucket size (elements)", active=list(buckets).index(active), barmode="overlay",
                        height=330, xaxis_title=f"offset in the virtual buffer (elements), dp={dp}, tp={tp}")
    _plan_axes(fig)
    return fig


# ---- chapter 6: projecting communication to a cluster ------------------------------------------

def projection_explorer(project, inter_gb_s=(10, 25, 50, 100, 200, 400), active: float = 50,
                        dps=(1, 2, 4, 8, 16, 32, 64), tps=(1, 8)):
    """Slider over the inter-node bandwidth per GPU; ``project(dp, tp, inter_gb_s)`` returns
    (Muon seconds, AdamW seconds) of optimizer communication per step."""
    return link_explorer(project, inter_gb_s, "inter-node bandwidth per GPU", "{:g} GB/s between nodes",
                         active=active, dps=dps, tps=tps)


def link_explorer(project, values, label: str, title: str, active, dps=(1, 2, 4, 8, 16, 32, 64), tps=(1, 8)):
    """Slider over one link constant; ``project(dp, tp, value)`` returns (Muon s, AdamW s) of
    communication per step. ``title`` formats the value (``"{:g} GB/s between nodes"``)."""
    import plotly.graph_objects as go

    frames, highest = [], 0.0
    for value in values:
        traces, ratios = [], []
        for tp, dash in zip(tps, ("solid", "dash")):
            times = [project(d, tp, value) for d in dps]
            highest = max(highest, *(t for pair in times for t in pair))
            ratios.append(times[-1][0] / times[-1][1])
            for k, (name, color, symbol) in enumerate((("Muon", palette.OPTIMIZER["muon"], "circle"),
                                                       ("AdamW", palette.OPTIMIZER["adamw"], "square"))):
                traces.append(go.Scatter(x=list(dps), y=[t[k] * 1e3 for t in times], mode="lines+markers",
                                         name=f"{name}, tp={tp}", line=dict(color=color, dash=dash),
                                         marker=dict(symbol=symbol),
                                         hovertemplate="dp=%{x}: %{y:.1f} ms<extra>" + f"{name}, tp={tp}</extra>"))
        frames.append(dict(label=title.format(value).split(" ")[0] + " " + title.format(value).split(" ")[1],
                           traces=traces,
                           title=title.format(value) + f": Muon/AdamW at dp={dps[-1]} is "
                                 + ", ".join(f"{r:.2f} (tp={tp})" for r, tp in zip(ratios, tps))))
    fig = slider_figure(frames, label, active=list(values).index(active),
                        xaxis_title="DP size (replicas)", yaxis_title="ms per step")
    fig.update_xaxes(type="log", tickvals=list(dps), ticktext=[str(d) for d in dps])
    # One y axis for every position, so that moving the slider moves the curves, not the scale.
    fig.update_yaxes(range=[0, highest * 1e3 * 1.05])
    return fig

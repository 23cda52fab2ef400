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
# # 15. Muon at a thousand GPUs
#
# ```{admonition} What this chapter runs
# The ZeRO-1 plan for three real models on grids up to 1,024 ranks ([`scripts/plan_at_scale.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/plan_at_scale.py):
# the plan and closed forms, no process per rank), a few small Newton-Schulz runs, one matrix
# orthogonalised by three simulated ranks, and three steps of the "group" layout on four ranks
# ([`scripts/verify.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/verify.py)).
# About a minute.
# Reading: about 35 minutes at 200 words, 8 lines of code or one figure a minute, plus running it. Read first: {doc}`chapter 8 <08_beyond_poc>` and {doc}`chapter 13 <13_what_to_pick>`.
# ```
#
# The owner layout ({doc}`chapter 8 <08_beyond_poc>`) orthogonalises each matrix once, on one
# rank. What happens when ranks outnumber matrices? Three answers, all built and tested: one
# matrix over a group of ranks (the optimizer's "group" layout, run live below), same-shape
# batching, and faster polynomials. The plans at 1,024 ranks are projections, not runs.

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
# ## Why one owner per matrix stops scaling
#
# The owner layout's step ends when the busiest owner finishes its Newton-Schulz. Two things
# bound it: the largest matrix (one whole Newton-Schulz of it) and the number of matrices (ranks
# beyond it idle). Llama-3-8B has 224 (7 per layer, 32 layers). Below, the optimizer's
# `build_plan` on 64, 256 and 1,024 ranks.

# %%
from muongrid.lab.page import keep, listing, say, show

from muongrid.lab.notebook import last_json, run, table

small = last_json(run("plan_at_scale.py --model llama3-8b --grids 8x8,32x8,128x8 "
                      "--json", log="collapsed"))["rows"]
rows = [[f"{r['dp']} x {r['tp']}", r["world"], r["owner_ranks_idle"],
         f"{r['owner_ns_max_over_mean']:.2f}", f"{r['group_ns_max_over_mean']:.2f}",
         r["grouped_matrices"], f"{r['owner_build_s']:.2f} s",
         f"{r['group_build_s']:.2f} s"]
        for r in small]
table(["grid", "ranks", "idle ranks (owner)", "NS max/mean, owner",
       "NS max/mean, timed groups", "grouped matrices", "owner plan build",
       "group plan build"], rows,
      align="lrrrrrrr")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
at_64, at_1024 = small[0], small[-1]
assert at_1024["world"] == 1024 and at_1024["muon_matrices"] == 224
assert at_1024["owner_ranks_idle"] == 1024 - 224     # most ranks own nothing
assert at_64["owner_ns_max_over_mean"] < 1.1         # 64 ranks: balanced
assert at_1024["owner_ns_max_over_mean"] > 5        # 1,024: the largest bounds it
assert at_1024["group_ns_max_over_mean"] < at_1024["owner_ns_max_over_mean"] / 3
keep("ch15-idle", at_1024["owner_ranks_idle"])
keep("ch15-owner-ratio-64", f"{at_64['owner_ns_max_over_mean']:.2f}")
keep("ch15-owner-ratio", f"{at_1024['owner_ns_max_over_mean']:.1f}")
keep("ch15-group-ratio", f"{at_1024['group_ns_max_over_mean']:.2f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
On 64 ranks the owners are balanced (max/mean {{ch15-owner-ratio-64}}). On 1,024
ranks {{ch15-idle}} ranks own nothing and the busiest does
{{ch15-owner-ratio}} times the mean. Giving a matrix above the fair share (all
Newton-Schulz FLOPs over the ranks) a *group* of ranks, sized by time (below), brings max/mean
to {{ch15-group-ratio}}. Build times are one run each, on a shared machine.
""")

# %% [markdown]
# ## Idea 1: one matrix over a group of ranks
#
# Newton-Schulz on a wide matrix $X$ ($m \times n$, $m \le n$) repeats
# $A = X X^\top$, $B = bA + cA^2$, $X \leftarrow aX + BX$. Cut $X$ along its long side into
# blocks $X_1, \dots, X_k$, one per rank. Then $A = \sum_i X_i X_i^\top$: each rank computes its
# partial Gram, one all-reduce sums them, every rank builds the same small $B$ ($m \times m$),
# and updates its own block, $X_i \leftarrow aX_i + BX_i$, with no further traffic. Per step: one
# all-reduce of $m^2$ fp32 numbers (plus one scalar at the start, for the norm).
# `muongrid.ns_group.zeropower_sharded` implements it ({doc}`chapter 16 <16_related_work>` compares
# Megatron's TP version).

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-ch15-group-steps", "caption": "One Newton-Schulz step of a matrix over a group of three ranks: the matrix is cut along its long side, each rank forms its block's Gram matrix, one all-reduce sums them, and each rank updates its own block with the same small $B$."}} jupyter={"source_hidden": true}
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from muongrid.lab import palette

COLOURS = [palette.rank(r) for r in range(3)]  # one per rank of the group
fig, axes = plt.subplots(2, 2, figsize=(8, 5.6))
axes = axes.ravel()
titles = ["1. $X$ cut along its long side", r"2. each rank: $X_i X_i^\top$",
          r"3. all-reduce: $A = \sum_i X_i X_i^\top$",
          "4. each rank: $B = bA + cA^2$,\n$X_i \\leftarrow aX_i + BX_i$"]
for ax, title in zip(axes, titles):
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 4.2)
    ax.axis("off")
    ax.set_aspect("equal")
    ax.set_title(title, fontsize=13)
for i, c in enumerate(COLOURS):                       # step 1: three column blocks
    axes[0].add_patch(Rectangle((0.5 + 3 * i, 1.5), 2.8, 1.5, color=c, alpha=0.6))
    axes[0].text(1.9 + 3 * i, 2.1, f"$X_{i}$", ha="center", fontsize=13)
    axes[0].text(1.9 + 3 * i, 1.0, f"rank {i}", ha="center", fontsize=11)
    axes[1].add_patch(Rectangle((0.5 + 3.2 * i, 1.5), 1.5, 1.5, color=c, alpha=0.6))
    axes[1].text(1.25 + 3.2 * i, 1.0, f"rank {i}", ha="center", fontsize=11)
    axes[2].add_patch(Rectangle((0.5 + 3.2 * i, 1.5), 1.5, 1.5,
                                color=palette.NEUTRAL["sum"], alpha=0.9))
    axes[2].text(1.25 + 3.2 * i, 2.1, "$A$", ha="center", fontsize=13)
    axes[3].add_patch(Rectangle((0.5 + 3 * i, 1.5), 2.8, 1.5, color=c, alpha=0.9))
    axes[3].text(1.9 + 3 * i, 2.1, f"new $X_{i}$", ha="center", fontsize=12)
axes[1].text(5, 3.4, r"$m \times m$, no traffic", ha="center", fontsize=11)
axes[2].text(5, 3.4, r"$m \times m$ fp32, same on every rank", ha="center", fontsize=11)
axes[3].text(5, 0.8, "local: no traffic", ha="center", fontsize=11)
plt.tight_layout()
show(fig)
plt.close(fig)

# %% [markdown]
# It cannot be bit-exact with one process: the group adds the same fp32 numbers in another order.
# So the check is a tolerance, a relative Frobenius difference of at most $10^{-5}$ in fp32
# ([`tests/test_ns_group.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_ns_group.py)
# holds it on several shapes and group sizes). Here three "ranks" (threads, `ns_group.simulate`)
# on a matrix whose long side does not divide by three:

# %%
import torch

from muongrid.newton_schulz import NS_COEFFICIENTS, zeropower_ns5
from muongrid.ns_group import sharded_collectives, simulate, split_long_side

G = torch.randn(96, 301, generator=torch.Generator().manual_seed(0))
long_dim, blocks = split_long_side(G, 3)
group = torch.cat(simulate(blocks, long_dim, dtype=torch.float32), dim=long_dim)
whole = zeropower_ns5(G, dtype=torch.float32)
difference = float((group - whole).norm() / whole.norm())
calls, nbytes = sharded_collectives(*G.shape)
print(f"blocks {[tuple(b.shape) for b in blocks]}; "
      f"relative difference {difference:.1e}; "
      f"{calls} all-reduces of {nbytes:,} bytes in all per rank")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
assert [b.shape[1] for b in blocks] == [101, 100, 100]        # uneven blocks
assert 0 < difference <= 1e-5 or difference == 0
assert calls == 6 and nbytes == 4 * (1 + 5 * 96 * 96)
keep("ch15-group-diff", f"{difference:.1e}")
split_calls, split_bytes = sharded_collectives(*G.shape, split_b=True, size=3)
assert split_calls == 11 and split_bytes > nbytes
keep("ch15-calls-plain", calls)
keep("ch15-calls-split", split_calls)
keep("ch15-plain-kb", f"{nbytes / 1e3:.0f}")
keep("ch15-split-kb", f"{split_bytes / 1e3:.0f}")
from muongrid.ns_group import group_form

assert group_form(*G.shape, 3) == "rows"
keep("ch15-form-301", f'group_form(96, 301, 3) gives "{group_form(*G.shape, 3)}"')

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
The group's result is within {{ch15-group-diff}} of one process's, inside
$10^{-5}$. The price: each step all-reduces an $m \times m$ Gram in fp32, for a square matrix as
many numbers as the matrix (exercise 1 counts them). And every rank still builds all of $B$,
$2m^3$ FLOPs a step, unless the optimizer splits it (`split_b`): each member builds its rows of
$B$ and one bf16 all-gather assembles them. So the sketch's {{ch15-calls-plain}}
collectives per matrix become {{ch15-calls-split}} (the norm, five Gram all-reduces, five
all-gathers of $B$), with {{ch15-split-kb}} kB of input per rank on this 96 x 301 matrix
against {{ch15-plain-kb}} kB. For a matrix this close to square the optimizer picks a
second form, the row form, also eleven collectives ({{ch15-form-301}}; see "The group
layout, live").
""")

# %% [markdown]
# ## Idea 2: same-shape batching
#
# A mixture-of-experts model has the opposite problem: Moonlight-16B-A3B has 64 routed experts in 26 of its 27 layers, each with gate, up and down
# matrices: thousands of matrices, a handful of shapes. With `DistributedMuon(..., ns_batch=True)`
# an owner runs one Newton-Schulz call per distinct shape it owns (bit-exact with unbatched; on
# this CPU the gain is fewer calls, and a GPU's batched GEMM is not measured here).

# %%
moons = last_json(run("plan_at_scale.py --model moonlight-16b-a3b --grids 8x8,128x8 "
                      "--json", log="collapsed"))["rows"]
moon = moons[0]
print(f"{moon['muon_matrices']:,} matrices, {moon['distinct_shapes']} distinct shapes; "
      f"on 8 x 8 the busiest owner holds {moon['owner_owned_max']} matrices: "
      f"{moon['owner_ns_calls_batched_max']} Newton-Schulz calls when batched")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
assert moon["muon_matrices"] == 7 + 26 * (4 + 3 + 64 * 3)
calls, owned = moon["owner_ns_calls_batched_max"], moon["owner_owned_max"]
assert calls <= moon["distinct_shapes"] < owned / 5
keep("ch15-moon-owned", moon["owner_owned_max"])
keep("ch15-moon-calls", moon["owner_ns_calls_batched_max"])

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
On 64 ranks the busiest owner's {{ch15-moon-owned}} matrices become
{{ch15-moon-calls}} Newton-Schulz calls: per-call overheads (kernel launches) are paid
per shape, not per expert.
""")

# %% [markdown]
# ## Idea 3: faster polynomials
#
# Muon uses one quintic, $(a, b, c) = (3.4445, -4.7750, 2.0315)$, every step. Polar Express
# (Amsel et al., 2025) picks a quintic per step, the best for the singular values the step before
# leaves. A cubic ($1.5, -0.5, 0$) is the textbook iteration.
# The *Gram form* computes the same polynomial in another order: only the first Gram and the last
# product touch the long side, so it does fewer FLOPs on rectangular matrices. Below: the error
# against the exact polar factor $UV^\top$ ({doc}`chapter 1 <01_muon>`, by SVD in float64) on a
# 256 x 1024 Gaussian matrix in fp32, and the matmul count.

# %%
import time

from muongrid.lab.verdicts import fastest_text, spread_text
from muongrid.ns_variants import ns_flops, ns_matmuls

M = torch.randn(256, 1024, generator=torch.Generator().manual_seed(1))
U, _, Vh = torch.linalg.svd(M.double(), full_matrices=False)
polar = U @ Vh
VARIANTS = [("muon", "standard"), ("muon", "gram"), ("polar_express", "standard"),
            ("polar_express", "gram"), ("cubic", "standard")]
err, sigma = {}, {}
for coefficients, form in VARIANTS:
    out = zeropower_ns5(M, 5, coefficients, dtype=torch.float32, form=form).double()
    err[(coefficients, form)] = float((out - polar).norm() / polar.norm())
    sigma[(coefficients, form)] = torch.linalg.svdvals(out)   # where they end up
table(["coefficients", "form", "error vs U V^T", "matmuls", "GFLOP"],
      [[c, f, f"{err[(c, f)]:.3f}", ns_matmuls(5, f),
        f"{ns_flops(256, 1024, 5, f) / 1e9:.2f}"] for c, f in VARIANTS])

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
standard = {c: err[(c, "standard")] for c in ("polar_express", "muon", "cubic")}
assert standard["polar_express"] < standard["muon"] < standard["cubic"]
for c in ("muon", "polar_express"):                  # same polynomial, another order
    assert abs(err[(c, "gram")] - err[(c, "standard")]) < 1e-3
assert ns_flops(256, 1024, 5, "gram") < ns_flops(256, 1024, 5, "standard")
assert ns_matmuls(5, "standard") == 15 and NS_COEFFICIENTS == (3.4445, -4.7750, 2.0315)
keep("ch15-err-muon", f"{err[('muon', 'standard')]:.3f}")
keep("ch15-err-pe", f"{err[('polar_express', 'standard')]:.3f}")
muon_sigma = sigma[("muon", "standard")]
assert 0.5 < muon_sigma.min() < 0.9 and 1.1 < muon_sigma.max() < 1.3   # prose's band
keep("ch15-sigma-lo", f"{muon_sigma.min():.2f}")
keep("ch15-sigma-hi", f"{muon_sigma.max():.2f}")
flop_ratio = ns_flops(256, 1024, 5, "standard") / ns_flops(256, 1024, 5, "gram")
keep("ch15-flop-ratio", f"{flop_ratio:.2f}")
even = next(n for n in range(256, 1024) if ns_flops(256, n, 5, "gram")
            < ns_flops(256, n, 5, "standard"))   # the first long side where Gram saves
assert 1.4 < even / 256 < 1.6 and ns_flops(256, 256, 5, "gram") > ns_flops(256, 256, 5)
keep("ch15-gram-even", f"{even / 256:.1f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
Polar Express lands closer to the polar factor ({{ch15-err-pe}} against Muon's
{{ch15-err-muon}}) for the same 15 matmuls; the cubic is far behind in five steps.
This is no verdict on training:

- Muon's quintic leaves the singular values in a band around 1 by design
  ({doc}`chapter 1 <01_muon>`; here {{ch15-sigma-lo}} to {{ch15-sigma-hi}}), so
  its larger distance is a choice; whether Polar Express trains better is not tested here.
- The Polar Express coefficients are the published set for five steps (lower bound $10^{-3}$,
  safety factor $2 \times 10^{-2}$, `muongrid.ns_variants`); `ns_coefficients` takes any
  schedule.
- The Gram form saves FLOPs only once the long side exceeds {{ch15-gram-even}} times the
  short one. Its $m \times m$ iteration runs in fp32 even for bf16 input: in bf16 the Gram loses
  its small eigenvalues and the iteration can diverge.

On this shape the Gram form gives the same errors with {{ch15-flop-ratio}} times fewer
FLOPs. Whether that shows as time on this shared machine, measured five times:
""")

# %%
times = {"standard": [], "gram": []}
for _ in range(5):                   # interleaved: both meet the same load
    for form in times:
        t0 = time.perf_counter()
        zeropower_ns5(M, 5, "muon", dtype=torch.float32, form=form)
        times[form].append(time.perf_counter() - t0)
for form, samples in times.items():
    print(f"{form:8} {spread_text(samples)}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
# The verdict, within the noise band or outside it (muongrid.lab.verdicts).
verdict = fastest_text(times)
print(verdict)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
assert len(times["gram"]) == len(times["standard"]) == 5
keep("ch15-verdict", verdict)

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
Verdict over five interleaved rounds: {{ch15-verdict}} (a form wins only if its median
is more than 10% lower and the spreads do not overlap, `muongrid.lab.verdicts`).
[`scripts/compare_ns_variants.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/compare_ns_variants.py) gives the full table per shape and dtype, with bf16.
""")

# %% [markdown]
# ## The plans at scale, and what they would cost on H100s
#
# `plan_at_scale.py` turns the plan into seconds per rank and step: Newton-Schulz FLOPs at a
# stated rate plus each group's collectives on the link it spans (NVLink inside a node of 8
# consecutive ranks, InfiniBand otherwise; alpha-beta, {doc}`chapter 6 <06_communication>`). The
# figures are the book's H100 table ([`muongrid/hardware.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/hardware.py), printed with sources in
# {doc}`chapter 13 <13_what_to_pick>`): datasheet peaks and links, **assumed** latencies and an
# assumed 50% of peak for Newton-Schulz. The step waits for the busiest rank; "ideal" is the
# total Newton-Schulz work divided evenly.
#
# The same figures *choose* the groups: `build_plan(..., layout="group", hw=profile)` puts each
# matrix, largest first, where it finishes first, on one owner or on a group of k ranks (k up to
# the FLOP-fair size; a group inside a node takes its least-busy ranks). Two rules that size groups
# by FLOPs alone compare: the least-loaded ranks anywhere ("FLOP, any ranks") and contiguous
# windows starting on a TP group ("FLOP windows", what `layout="group"` runs without a profile).

# %%
big_out = run("plan_at_scale.py --model llama3-70b --grids 128x8,64x16 --json",
              log="collapsed")
big = last_json(big_out)["rows"]
projected = ([("Llama-3-8B", r) for r in small] + [("Llama-3-70B", r) for r in big]
             + [("Moonlight", moons[1])])
RULES = {"owner": "owner", "scattered": "group_scattered", "flops": "group_flops",
         "group": "group", "ideal": "ideal"}
table(["model", "grid", "owner", "FLOP, any ranks", "FLOP windows", "group (timed)",
       "ideal"],
      [[name, f"{r['dp']} x {r['tp']}", *(f"{r[k + '_ns_ms']:.1f} ms" for k in RULES)]
       for name, r in projected], align="llrrrrr")

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-ch15-projection", "caption": "Newton-Schulz time per step on the busiest rank (log scale), group collectives included, projected from the plan with the assumed H100 figures: one owner per matrix, FLOP-sized groups on any ranks, FLOP-sized TP-local windows (the optimizer's rule without a profile), groups sized by time (`build_plan(..., hw=profile)`, the optimizer's rule with `hw=`), and an even split of the work (the ideal)."}} jupyter={"source_hidden": true}
fig, ax = plt.subplots(figsize=(8, 3))
labels = [f"{name}\n{r['dp']}x{r['tp']}" for name, r in projected]
names = {"scattered": "FLOP, any ranks", "flops": "FLOP windows",
         "group": "group (timed)"}
for j, (rule, colour) in enumerate(RULES.items()):
    ax.bar([i + 0.16 * j for i in range(len(projected))],
           [r[rule + "_ns_ms"] for _, r in projected], width=0.16,
           label=names.get(rule, rule), color=palette.LAYOUT[colour],
           edgecolor=palette.NEUTRAL["edge"], lw=0.3)
ax.set_xticks([i + 0.32 for i in range(len(projected))], labels, fontsize=8)
ax.set_yscale("log")
ax.set_ylabel("NS ms per step, busiest rank")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
plt.tight_layout()
show(fig)
plt.close(fig)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
b70, b8 = big[0], at_1024
for _, r in projected:   # the timed plan is never behind owner or the FLOP-sized rules
    assert all(r["group_ns_ms"] <= r[k + "_ns_ms"] * (1 + 1e-9)
               for k in ("owner", "scattered", "flops"))
    assert r["groups_across_nodes"] == 0 and r["group_size_max"] <= 8
    assert r["owner_build_s"] < 10 and r["group_build_s"] < 10
assert b70["ideal_ns_ms"] < b70["group_ns_ms"] < 0.6 * b70["owner_ns_ms"]
assert b8["flops_ns_ms"] > b8["scattered_ns_ms"] > b8["owner_ns_ms"]
assert b8["flops_group_size_max"] > 8                  # FLOP-sized groups span nodes
assert b8["group_ns_ms"] < b8["owner_ns_ms"] / 2
hw = last_json(big_out)["hw"]   # the text: H100 table, NS at 50% of peak, nodes of 8
assert (hw["flops"], hw["efficiency"], hw["gpus_per_node"]) == (989e12, 0.5, 8)
assert hw["nvlink"] == [3e-6, 450e9] and hw["infiniband"] == [5e-6, 50e9]
keep("ch15-70b-owner", f"{b70['owner_ns_ms']:.0f}")
keep("ch15-70b-group", f"{b70['group_ns_ms']:.0f}")
keep("ch15-70b-ideal", f"{b70['ideal_ns_ms']:.0f}")
keep("ch15-8b-owner", f"{b8['owner_ns_ms']:.1f}")
keep("ch15-8b-scattered", f"{b8['scattered_ns_ms']:.1f}")
keep("ch15-8b-flops", f"{b8['flops_ns_ms']:.1f}")
keep("ch15-8b-flops-k", b8["flops_group_size_max"])
keep("ch15-8b-group", f"{b8['group_ns_ms']:.1f}")
keep("ch15-8b-group-k", b8["group_size_max"])

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
Under these assumptions, on 1,024 ranks Llama-3-70B's busiest rank would spend
{{ch15-70b-owner}} ms on Newton-Schulz per step with one owner per matrix and
{{ch15-70b-group}} ms with groups sized by time (ideal {{ch15-70b-ideal}} ms).
Llama-3-8B shows why groups must be priced by time: sized by FLOPs they grow to
{{ch15-8b-flops-k}} ranks, past a node, and each group's eleven collectives a step cross
InfiniBand, so both FLOP rules are *slower* than one owner per matrix
({{ch15-8b-scattered}} ms on any ranks, {{ch15-8b-flops}} ms in windows, against
{{ch15-8b-owner}} ms). The timed plan keeps every group inside a node (at most
{{ch15-8b-group-k}} ranks): {{ch15-8b-group}} ms. So give the optimizer the
profile: without one, `layout="group"` is safe only where the largest matrices' groups fit in a
node.
""")

# %% [markdown]
# What the group plan costs besides Newton-Schulz: the bytes each rank sends (the closed form the
# ledger checks) and how many leave its node, the collectives it joins, and the optimizer step
# projected serially (an upper bound, without forward, backward or TP activation traffic, so 64 x
# 16, whose TP groups span two nodes, costs more than shown).

# %%
table(["model", "grid", "layout", "NS max/mean", "GB per rank", "GB off node",
       "collectives", "opt. step ms", "plan build"],
      [[name, f"{r['dp']} x {r['tp']}", layout,
        f"{r[layout + '_ns_max_over_mean']:.2f}",
        f"{r[layout + '_bytes_per_rank_max'] / 1e9:.2f}",
        f"{r[layout + '_cross_node_bytes_max'] / 1e9:.2f}",
        r[layout + "_collectives_per_rank_max"], f"{r[layout + '_step_ms']:.0f}",
        f"{r[layout + '_build_s']:.2f} s"]
       for name, r in projected + [("Moonlight", moons[0])]
       for layout in ("owner", "group")], align="lllrrrrrr")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
for _, r in projected:
    if r["grouped_matrices"]:
        assert r["group_bytes_per_rank_max"] > r["owner_bytes_per_rank_max"]
        assert r["group_collectives_per_rank_max"] > r["owner_collectives_per_rank_max"]
    assert r["group_step_ms"] <= r["owner_step_ms"] * (1 + 1e-9)
extra_bytes = max(r["group_bytes_per_rank_max"] / r["owner_bytes_per_rank_max"] - 1
                  for _, r in projected)
assert 0 < extra_bytes < 0.2
keep("ch15-extra-bytes", f"{extra_bytes:.0%}")
share = b8["group_ns_ms"] / b8["group_step_ms"]
keep("ch15-1024-step-share", f"{share:.0%}")
grows = [(small[0], b8), (moons[0], moons[1])]   # the same model on 64, then more ranks
assert all(hi["owner_step_ms"] > lo["owner_step_ms"] for lo, hi in grows)
assert max(r["group_collectives_per_rank_max"] - r["owner_collectives_per_rank_max"]
           for _, r in projected if r["grouped_matrices"]) >= 11
for key, value in (("8b-64", small[0]), ("8b-1024", b8), ("moon-64", moons[0]),
                   ("moon-1024", moons[1])):
    keep(f"ch15-step-{key}", f"{value['owner_step_ms']:,.0f}")
keep("ch15-moon-calls-1024", f"{moons[1]['owner_collectives_per_rank_max']:,}")
keep("ch15-dp-1024", b8["dp"])

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
The groups add at most {{ch15-extra-bytes}} to the busiest rank's bytes, because
ZeRO-1's own traffic is far larger, and eleven collectives per group membership a step. The
projected step falls only
modestly: ZeRO-1's gradient and parameter collectives over DP groups of {{ch15-dp-1024}}
ranks dominate it (Newton-Schulz is {{ch15-1024-step-share}} of Llama-3-8B's group step
on 1,024 ranks). They also make it *grow* with the ranks: Llama-3-8B's owner step from
{{ch15-step-8b-64}} ms on 64 ranks to {{ch15-step-8b-1024}} ms on 1,024,
Moonlight's from {{ch15-step-moon-64}} ms to {{ch15-step-moon-1024}} ms: about
as many collectives a step ({{ch15-moon-calls-1024}} for Moonlight), but every ring passes
more ranks, one latency per hop.
""")

# %% [markdown]
# {numref}`fig-ch15-scale-explorer` puts every plan of this section side by side.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-ch15-scale-explorer", "caption": "The plans at scale, one slider position per model and grid (every number from `plan_at_scale.py`, run above): Newton-Schulz ms per step on the busiest rank under each group rule (left, log scale, the H100 figures), and what the group plan costs besides, as group / owner (right; the dotted line is the owner plan). The title gives both plans' NS load max/mean and build times."}} jupyter={"source_hidden": true}
from muongrid.lab.explorers import Figure
from muongrid.lab.scale_explorer import scale_explorer

explored = ([("Llama-3-8B", r) for r in small] + [("Llama-3-70B", r) for r in big]
            + [("Moonlight", r) for r in moons])
explorer = scale_explorer(explored, active=len(small) - 1)   # Llama-3-8B on 1,024 ranks
show(Figure(explorer))

# %% [markdown]
# ## The group layout, live

# %%
from muongrid.lab import costmodel
from muongrid.ns_group import group_form, group_ring_bytes

shapes, dims = "96x230,20x36,36x20,24x24", "0,1,0,none"
out = run(f"verify.py --dp 2 --tp 2 --layout owner,group --groups 1 --shapes {shapes} "
          f"--tp-dims {dims} --bucket-numel 4000 --atol 1e-3", log="collapsed")
live = last_json(out)
owner_live, group_live = live["layouts"]["owner"], live["layouts"]["group"]
print("groups:", group_live["groups"], " owners:", group_live["owners"])
print(f"largest |parameter - reference|: owner {owner_live['max_abs_diff']:.1e}, "
      f"group {group_live['max_abs_diff']:.1e}")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
from muongrid.verify import VARIED_MUON  # verify.py gives every group its own hyperparameters

steps = VARIED_MUON[0]["ns_steps"]  # Newton-Schulz steps of its one Muon group here
problem_groups = [dict(shapes=[(96, 230), (20, 36), (36, 20), (24, 24)],
                       tp_split_dims=[0, 1, 0, -1], use_muon=True, ns_steps=steps)]
assert owner_live["max_abs_diff"] == 0.0 and live["ok"]
assert group_live["groups"] == {"0.0": [0, 1, 2, 3]} and group_live["groups_agree"]
assert group_live["max_abs_diff"] <= 1e-3 and group_live["state_dict_roundtrip"]
gram = []
for rank, ledger in enumerate(group_live["ledger_per_rank"]):
    expected = costmodel.step_bytes(problem_groups, 2, 2, 4000, layout="group",
                                    rank=rank)
    for phase in costmodel.PHASES:
        sent = ledger["phases"].get(phase, {}).get("bytes_sent", 0)
        assert sent == expected[phase], phase
    gram.append(ledger["phases"]["ns_group_gram"]["bytes_sent"])
assert len(set(gram)) == 1 and gram[0] == costmodel.group_bytes(96, 230, 4, steps)
row_form = costmodel.group_row_bytes(96, 230, 4, steps)
assert gram[0] == row_form < costmodel.group_gram_bytes(96, 230, 4, steps)  # < Gram
assert group_live["ns_calls"] == 4 + 3   # four members of one group, three owners
live_diff = group_live["max_abs_diff"]
keep("ch15-live-group-diff", "matches it bit for bit in this run" if live_diff == 0 else
     f"differs by at most {live_diff:.1e}")
keep("ch15-live-gram-kb", f"{gram[0] / 1e3:.0f}")
sent = {name: max(sum(p["bytes_sent"] for p in ledger["phases"].values())
                  for ledger in layout["ledger_per_rank"])
        for name, layout in (("owner", owner_live), ("group", group_live))}
keep("ch15-live-owner-kb", f"{sent['owner'] / 1e3:.0f}")
keep("ch15-live-group-kb", f"{sent['group'] / 1e3:.0f}")
assert sent["group"] > 2 * sent["owner"]
longest = max(n for n in range(1024, 8 * 1024, 8) if group_form(1024, n, 4) == "rows")
square = (group_ring_bytes("rows", 1024, 1024, 4)
          / group_ring_bytes("gram", 1024, 1024, 4))
assert 2.5 < longest / 1024 < 4 and square < 0.5
keep("ch15-rows-upto", f"{longest / 1024:.1f}")
keep("ch15-rows-square", f"{square:.0%}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
`DistributedMuon(..., layout="group")` is the owner layout, except that a matrix above the fair
share gets a group of ranks. In the all-to-all that carries other matrices to their owners,
member $i$ receives block $i$ of the matrix's long side; the members orthogonalise it over a
process subgroup, in whichever of two forms sends fewer bytes (`ns_group.group_form`): the Gram
form `zeropower_sharded`, or, for a matrix not much longer than wide, the row form
`zeropower_rows` (each step every member's rows of $A$ and of $X$, all-gathered in bf16); every
element then goes back. For a group of four and a short side of 1,024 the row form wins up to a
long side {{ch15-rows-upto}} times the short one, and on a square matrix sends
{{ch15-rows-square}} of the Gram form's bytes. Below, four ranks (DP 2 x TP 2) run three
steps of owner and group against single-device Muon, on one 96 x 230 matrix (nearly all the
Newton-Schulz work) and three small ones.
""")

# %%
import statistics

from muongrid.lab.provenance import load_recorded, provenance_text
from muongrid.lab.synthetic import build_problem
from muongrid.lab.verdicts import beats, ratio_text, spread_text

record = load_recorded("bench_group_2x2.json")
bench = record["result"]
print(provenance_text(record))
print(f"{bench['steps']} measured steps; bf16 matmul: {bench['bf16_matmul']}; "
      f"one process: Muon {spread_text(bench['single']['muon_all'])} a step")
peak = {name: max(bench["variants"][v["variant"]]["peak_bytes_per_rank"])
        for name, v in bench["layouts"].items()}
table(["layout", "bytes / AdamW", "NS runs", "Muon step", "Muon overhead ratio",
       "peak MB, busiest rank"],
      [[name, f"{v['bytes_ratio']:.2f}", v["ns_calls"],
        spread_text(v["step_seconds_all"]),
        ratio_text(v["muon_overhead_ratio_all"]), f"{peak[name] / 1e6:.0f}"]
       for name, v in bench["layouts"].items()], align="lrrrrr")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
recorded_problem = build_problem("muon", [tuple(x) for x in bench["shapes"]],
                                 bench["tp_dims"], 1, 0, bench["tp"])
# the code the record measured is still this code: same bytes on every rank
for name, v in bench["layouts"].items():
    closed = [costmodel.step_bytes(recorded_problem.groups, bench["dp"], bench["tp"],
                                   bench["bucket_numel"], layout=name, rank=r)["total"]
              for r in range(bench["world_size"])]
    assert v["closed_form_matches"] and closed == bench["variants"][v["variant"]][
        "bytes_per_rank"], f"{name}: bytes changed since the record: run make record"
O, G = (bench["layouts"][k] for k in ("owner", "group"))
# the prose: one square matrix, in the row form
rows_bytes = group_ring_bytes("rows", 4096, 4096, 4)
assert group_form(4096, 4096, 4) == "rows" and all(
    p["ns_group_gram"] == rows_bytes
    for p in bench["variants"][G["variant"]]["bytes_per_phase_per_rank"])
assert G["ns_calls"] > O["ns_calls"] and G["bytes_ratio"] > O["bytes_ratio"]
lower = beats(G["muon_overhead_ratio_all"], O["muon_overhead_ratio_all"])
keep("ch15-rec-verdict",
     "is lower under group, outside the noise (every measured step)" if lower else
     "ties inside the noise between the two layouts in this record")
keep("ch15-rec-owner", ratio_text(O["muon_overhead_ratio_all"]))
keep("ch15-rec-group", ratio_text(G["muon_overhead_ratio_all"]))
keep("ch15-rec-bytes", f"{G['bytes_ratio'] / O['bytes_ratio']:.1f}")
# medians over the ranks: one rank's peak moves between runs
typical = {name: statistics.median(
               bench["variants"][v["variant"]]["peak_bytes_per_rank"])
           for name, v in bench["layouts"].items()}
keep("ch15-rec-peak", f"{typical['group'] / typical['owner']:.1f}")
keep("ch15-rec-load", f"{record['load_average_1min'][0]:g}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
The owner layout matches the reference bit for bit, and so does every matrix the group layout
leaves to an owner; the grouped 96 x 230 {{ch15-live-group-diff}} (within
`--atol 1e-3`). The row form splits each GEMM by rows, and a kernel may round a block of
rows differently from the whole:
[`tests/test_group_layout.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_group_layout.py)
holds grouped matrices within $10^{-2}$, relative, on 1 x 1 to 2 x 4, the others bit for bit.
Each member sends {{ch15-live-gram-kb}} kB a step for the group's collectives (ledger
phase `ns_group_gram`), as the closed form (`costmodel.group_bytes`) says, rank by rank; the
busiest rank sends {{ch15-live-group-kb}} kB a step under group against
{{ch15-live-owner-kb}} kB under owner.

For time and memory, `make record` runs the report's shapes (one 4096 x 4096 matrix with 99.1% of the Newton-Schulz FLOPs, and four smaller
ones) on DP 2 x TP 2 against one process using both cores
(`bench.py --dp 2 --tp 2 --layout owner,group --single --report-shapes`) and keeps the result in
`book/data/` with its provenance. The load average on the 2 cores was {{ch15-rec-load}}
when it started, so read the seconds as a loaded machine's and lean on what one run measured
side by side: the {term}`Muon overhead ratio`, with its spread over the steps.
""")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
The overhead ratio {{ch15-rec-verdict}}: {{ch15-rec-owner}} with one owner per
matrix, {{ch15-rec-group}} with the 4096 x 4096 matrix shared by the four ranks
(median, then min-max of the steps). The price: the group layout sends {{ch15-rec-bytes}}
times the owner layout's bytes, and its ranks peak at {{ch15-rec-peak}} times the memory
(medians over the ranks), because this square matrix runs in the row form, which all-gathers the
whole matrix on every member.
""")

# %% [markdown]
# Those four members were sized by FLOPs, but on this machine's two cores only two ranks compute
# at once: the other two add traffic and no speed. `make record` reruns the benchmark with
# `--hw this-machine`, a profile from {doc}`chapter 13 <13_what_to_pick>`'s calibration
# (`timemodel.plan_profile`).

# %%
timed_record = load_recorded("bench_group_timed_2x2.json")
tbench = timed_record["result"]
hw = tbench["hw"]
print(provenance_text(timed_record))
ns_rate = hw["flops"] * hw["efficiency"]
print(f"profile: Newton-Schulz at {ns_rate / 1e9:.0f} GFLOP/s a rank, "
      f"{hw['parallel_ranks']} ranks at once, link {hw['intra'][0] * 1e3:.1f} ms + "
      f"{hw['intra'][1] / 1e6:.0f} MB/s; groups (matrix: ranks): "
      f"{tbench['layouts']['group']['groups']}")
timed_peak = {name: max(tbench["variants"][v["variant"]]["peak_bytes_per_rank"])
              for name, v in tbench["layouts"].items()}
table(["layout", "bytes / AdamW", "NS runs", "Muon step", "Muon overhead ratio",
       "peak MB, busiest rank"],
      [[name if name == "owner" else "group (sized by time)", f"{v['bytes_ratio']:.2f}",
        v["ns_calls"], spread_text(v["step_seconds_all"]),
        ratio_text(v["muon_overhead_ratio_all"]), f"{timed_peak[name] / 1e6:.0f}"]
       for name, v in tbench["layouts"].items()], align="lrrrrr")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
from muongrid.plan import ParamSpec, build_plan

# still this code's bytes, on the recorded profile
for name, v in tbench["layouts"].items():
    closed = [costmodel.step_bytes(recorded_problem.groups, tbench["dp"], tbench["tp"],
                                   tbench["bucket_numel"], layout=name, rank=r,
                                   hw=hw if name == "group" else None)["total"]
              for r in range(tbench["world_size"])]
    assert v["closed_form_matches"] and closed == tbench["variants"][v["variant"]][
        "bytes_per_rank"], f"{name}: bytes changed since the record: run make record"
TG, TO = tbench["layouts"]["group"], tbench["layouts"]["owner"]
report_specs = [ParamSpec(f"w{i}", tuple(s), d) for i, (s, d) in
                enumerate(zip(tbench["shapes"], tbench["tp_dims"]))]
timed_groups = build_plan([report_specs], 2, 0, 2, tbench["bucket_numel"], "group",
                          hw=hw).groups
assert TG["groups"] == {f"{b}.{i}": list(m) for (b, i), m in timed_groups.items()}
# the prose: two of the four ranks
assert hw["parallel_ranks"] == 2 and TG["groups"] == {"0.0": [0, 1]}
assert TG["bytes_ratio"] < G["bytes_ratio"]
keep("ch15-timed-members", "ranks 0 and 1, one TP group")
keep("ch15-timed-ratio", ratio_text(TG["muon_overhead_ratio_all"]))
keep("ch15-timed-owner", ratio_text(TO["muon_overhead_ratio_all"]))
two, four = TG["muon_overhead_ratio_all"], G["muon_overhead_ratio_all"]
vs_flops = ("lower than with four members, outside the noise" if beats(two, four) else
            "higher than with four members" if beats(four, two) else
            "a tie with four members inside the noise")
keep("ch15-timed-vs-flops", vs_flops)
keep("ch15-timed-bytes", f"{G['bytes_ratio'] / TG['bytes_ratio']:.1f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
Sized by time, the 4096 x 4096 matrix goes to two members, {{ch15-timed-members}}.
Its overhead ratio is {{ch15-timed-ratio}}, {{ch15-timed-vs-flops}}
({{ch15-rec-group}} above), and it sends {{ch15-timed-bytes}} times fewer bytes
than with four. Each run has its own one-process baseline, so compare ratios, not seconds; the
owner layout's ratio shows the drift between runs: {{ch15-timed-owner}} here against
{{ch15-rec-owner}} before.
""")

# %% [markdown]
# ## Turning it on
#
# The group layout and this chapter's other options are keywords of the constructor (checked
# against one process on 2 x 1 to 2 x 4):
#
# ```python
# from muongrid import DistributedMuon, hardware
#
# opt = DistributedMuon(
#     groups, grid,
#     layout="group",                   # owner's plan, plus groups
#     hw=hardware.h100(),               # groups sized by time on a profile
#     ns_batch=True,                    # one call per shape on each owner
#     ns_coefficients="polar_express",  # default "muon"; or "cubic"
#     ns_form="standard")               # or "gram" (groups too)
# ```
#
# `hardware.profile(flops=..., efficiency=..., ranks_per_node=..., intra=(alpha, beta),
# inter=(alpha, beta))` describes your cluster (`parallel_ranks=` where ranks share cores); every
# rank must pass the same one, and without one groups are sized by FLOPs. Below, the plan for four ranks and two large matrices with no
# profile, the H100 one and a made-up slow machine (1 GFLOP/s per rank, nodes of four); then the
# optimizer runs the slow machine's plan against one process.

# %%
import json
import tempfile
from pathlib import Path

from muongrid import hardware
from muongrid.plan import ParamSpec, build_plan

shapes, dims = "20x36,36x20,116x218,120x142,24x24", "1,0,0,0,none"
slow = hardware.profile(flops=1e9, efficiency=1.0, ranks_per_node=4,
                        intra=(1e-6, 1e9), inter=(1e-4, 1e8))
specs = [[ParamSpec(f"w{i}", tuple(map(int, s.split("x"))),
                    -1 if d == "none" else int(d))
          for i, (s, d) in enumerate(zip(shapes.split(","), dims.split(",")))]]
profiles = {"no profile (FLOPs)": None, "hardware.h100()": hardware.h100(),
            "slow machine": slow}
plans = {name: build_plan(specs, 2, 0, 2, 4000, "group", hw=hw).groups
         for name, hw in profiles.items()}
table(["hw=", "groups (matrix: ranks)"],
      [[name, ", ".join(f"w{k[1]}: {list(m)}" for k, m in g.items()) or "none: every "
        "matrix has one owner"] for name, g in plans.items()])
with tempfile.TemporaryDirectory() as tmp:   # the profile as a file, as --hw takes it
    profile_file = Path(tmp) / "slow_machine.json"
    profile_file.write_text(json.dumps(slow))
    timed_out = run(f"verify.py --dp 2 --tp 2 --layout group --hw {profile_file} "
                    f"--groups 1 --shapes {shapes} --tp-dims {dims} "
                    "--bucket-numel 4000 --atol 1e-3", log="collapsed")
timed = last_json(timed_out)["layouts"]["group"]
print("groups the optimizer formed:", timed["groups"],
      f" largest |parameter - reference|: {timed['max_abs_diff']:.1e}")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
assert plans["hardware.h100()"] == {}
assert all(m == tuple(range(m[0], m[0] + len(m)))
           for m in plans["no profile (FLOPs)"].values())
assert timed["groups"] == {"0.2": [0, 1, 2], "0.3": [0, 3]} and timed["groups_agree"]
planned = {f"{k[0]}.{k[1]}": list(m) for k, m in plans["slow machine"].items()}
assert planned == timed["groups"]   # the optimizer ran the plan build_plan gives
assert timed["ok"] and timed["max_abs_diff"] <= 1e-3 and timed["state_dict_roundtrip"]
assert "g0-1-2+g0-3" == timed["ledger"]["phases"]["ns_group_gram"]["group"]
keep("ch15-timed-diff", "bit for bit" if timed["max_abs_diff"] == 0 else
     f"within {timed['max_abs_diff']:.1e}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
Without a profile each large matrix gets a FLOP-sized window of contiguous ranks. On the H100
figures neither gets a group: its Newton-Schulz takes less than the latency of eleven
collectives. On the slow machine the first gets ranks 0, 1 and 2, the second 0 and 3: not
contiguous, since a group inside a node takes its least-busy ranks. The run matches one
process {{ch15-timed-diff}}, and rank 0's ledger row names both its subgroups
(`g0-1-2+g0-3`).
""")

# %% [markdown]
# From the command line, `python scripts/train.py --dp 2 --tp 2 --layout group --hw h100` trains
# the tiny GPT with it (`--hw` also takes a JSON file);
# `python scripts/verify.py --dp D --tp T --layout group --hw PROFILE --shapes ...` shows which
# ranks each group spans and checks the result against one process; `--ns-batch`, `--ns-form gram`
# and `--ns-coefficients polar_express` add the other options.
#
# ## What is built and what is not
#
# Also built: a third way to share a matrix (`ns_form="gram"`: `ns_gram_group` all-reduces the
# norm and one Gram per step, two collectives instead of eleven) and the projections for a
# 1T-class mixture of experts (`plan_at_scale.py --model kimi-k2`). **Not built**: the
# projections price neither the Gram form over a group nor expert parallelism, and are a model,
# not a measurement; the profile is given, not measured on the cluster.
#
# ## Summary
#
# - Once ranks outnumber matrices, the largest matrix's owner bounds the step while ranks idle.
# - A group of ranks orthogonalises one matrix with one Gram all-reduce per step, or the row
#   form's all-gathers for a near-square one. It pays only where its traffic is cheap next to the
#   FLOPs it saves, so size groups by time (`hw=`).
# - Same-shape batching turns many expert matrices into a few calls; Polar Express is closer to
#   the polar factor in the same matmuls; the Gram form saves FLOPs on rectangles.
#
# ## Exercises
#
# 1. How many bytes does one rank of a group all-reduce for a 4096 x 4096 matrix in five steps
#    (fp32 Grams, no `split_b`), and how does that compare with the matrix in bf16?
# 2. On the 64 x 16 grid, does Llama-3-70B's projected Newton-Schulz time change from 128 x 8?
#    Why or why not?

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
_, ex1 = sharded_collectives(4096, 4096)
assert ex1 == 4 * (1 + 5 * 4096 * 4096)
keep("ch15-ex1-mb", f"{ex1 / 1e6:.0f}")
keep("ch15-ex1-ratio", f"{ex1 / (2 * 4096 * 4096):.0f}")
for key in ("owner_ns_ms", "group_ns_ms"):
    assert big[0][key] == big[1][key], key
assert big[1]["owner_bytes_per_rank_mean"] < 0.6 * big[0]["owner_bytes_per_rank_mean"]
keep("ch15-ex2-ms", f"{big[1]['owner_ns_ms']:.0f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
:::{admonition} Solutions
:class: dropdown

1. {{ch15-ex1-mb}} MB (one scalar and five 4096 x 4096 fp32 Grams), which is
   {{ch15-ex1-ratio}} times the matrix in bf16; a ring all-reduce sends about twice its
   input per rank on top. For a square matrix the group moves more than the matrix itself.
2. No: {{ch15-ex2-ms}} ms on both. Newton-Schulz runs on whole matrices and the owner
   and group choice look only at FLOPs, the number of ranks (1,024 on both) and which ranks
   share a node (8 consecutive on both); the TP split changes how the pieces travel to the
   owners (the bytes per rank halve on 64 x 16), not who computes.
:::
""")

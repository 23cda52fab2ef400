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
# # 4. The ZeRO-1 virtual buffer
#
# ```{admonition} What this chapter runs
# The ZeRO-1 plan computed in the notebook, then [`scripts/inspect_grid.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/inspect_grid.py) on 6 processes (3 x 2)
# to check it. About 15 seconds on a 2-core laptop.
# Reading: about 25 minutes at 200 words, 8 lines of code or one figure a minute, plus running it. Read first: {doc}`chapter 2 <02_distributed_map>` and {doc}`chapter 3 <03_grid>`.
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
# ZeRO-1 gives each data-parallel rank the optimizer state for `1/dp` of the parameters, which
# needs a precise meaning for matrices of different shapes.
# Moonshot's proof of concept (and Megatron's distributed optimizer {cite:p}`nvidia2025megatrondistopt`) give it one: lay the
# parameters end to end in a flat {term}`virtual buffer`, cut it into {term}`buckets <bucket>`, and split every
# bucket evenly over the DP ranks. `dist_meta` is the record that tells each rank where a
# parameter lives.
#
# **Learning goals.** After this chapter you can
#
# - lay out a parameter group as a virtual buffer with buckets and padding;
# - read a `dist_meta`: `group_idx`, `bucket_idx`, `shape`, `global_range`, `local_range`,
#   `tp_split_dim`;
# - find the matrices that straddle a shard boundary, and say why they are the reason
#   Distributed Muon must gather;
# - compute how much optimizer state a rank keeps.

# %% [markdown]
# ## From parameters to a flat buffer
#
# Take one parameter group, the proof of concept's five matrices, with `tp = 2`.
# The virtual buffer is the TP-local slices (chapter 3) laid end to end. Nothing is allocated
# for it: it is a coordinate system in which "elements 25,088 to 81,632" means "the matrix `w2`".
#
# The buffer is cut into **buckets** on parameter boundaries: a bucket is the unit of one
# collective. Fewer, larger collectives are faster (each has a fixed latency), but a gathered
# bucket must fit in memory, so buckets are capped (here at 100,000 elements; a bigger matrix
# gets a bucket of its own). Each bucket is padded to a multiple of `dp` and
# split into `dp` equal **shards**; DP rank `r` owns shard `r` of every bucket. `build_plan` in
# [`muongrid/plan.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/plan.py) does all of this, as pure arithmetic:

# %%
from IPython.display import Markdown
from muongrid.lab.page import keep, listing, say, show

from muongrid.lab.notebook import table
from muongrid.lab.synthetic import DEFAULT_SHAPES, DEFAULT_TP_DIMS
from muongrid.plan import ParamSpec, build_plan

DP, TP, BUCKET = 3, 2, 100_000
specs = [
    [
        ParamSpec(f"w{i}", s, d)
        for i, (s, d) in enumerate(zip(DEFAULT_SHAPES, DEFAULT_TP_DIMS))
    ]
]
plans = [build_plan(specs, DP, r, TP, BUCKET) for r in range(DP)]
buckets = plans[0].buckets[0]
print(
    f"global_buffer_size (padded): {plans[0].global_buffer_size[0]:,} elements in "
    f"{len(buckets)} buckets"
)
table(["bucket", "starts at", "elements", "padding", "shards", "shard size", "holds"],
      [[b.bucket_idx, b.start, b.numel, b.padded_numel - b.numel, b.dp, b.shard_numel,
        ", ".join(specs[0][i].name for i in b.param_indices)] for b in buckets])

# %% [markdown]
# How `build_plan` cuts a group into buckets (read from the file when the book is built):

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing('plan.py', pyobject='split_into_buckets', caption='muongrid/plan.py')

# %% [markdown]
# ## The plan, drawn
#
# {numref}`fig-ch4-plan` draws it.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-ch4-plan", "caption": "The virtual buffer of the five matrices for dp = 3, tp = 2 and buckets of at most 100,000 elements. Upper strip: each coloured band is a matrix at its `global_range`, hatched grey is padding; a matrix or padding too narrow to label inside is named above it, with an arrow. Thick black lines are bucket boundaries; dashed lines cut each bucket into the DP ranks' shards; the lower strip says which DP rank owns each element (the last bucket holds only `w4`, so its three shards are thin). The explorers below draw the same strips in the same order and colours."}} jupyter={"source_hidden": true}
import matplotlib.pyplot as plt

from muongrid.lab import palette
from muongrid.lab.diagrams import book_style

book_style()


def draw_plan(plans, ax, title=""):
    metas, buckets = plans[0].metas[0], plans[0].buckets[0]
    end = buckets[-1].start + buckets[-1].padded_numel
    callouts = []  # (x, text): too narrow to label inside, named above the strip
    for i, m in enumerate(metas):
        lo, hi = m.global_range
        ax.barh(1, hi - lo, left=lo, height=0.8, color=palette.matrix(i), ec="white")
        if hi - lo > 0.04 * end:
            ax.text((lo + hi) / 2, 1, m.name, ha="center", va="center", fontsize=12)
        else:
            callouts.append(((lo + hi) / 2, m.name))
    for b in buckets:
        if b.padded_numel > b.numel:
            ax.barh(1, b.padded_numel - b.numel, left=b.start + b.numel, height=0.8,
                    color=palette.NEUTRAL["padding"], hatch="///")
            callouts.append((b.start + b.numel, f"padding: {b.padded_numel - b.numel}"))
        ax.axvline(b.start, color="k", lw=2)
        for r in range(b.dp):
            lo, hi = b.shard_range(r)
            ax.barh(0, hi - lo, left=lo, height=0.5, color=palette.dp_shard(r),
                    ec="grey")
            if hi - lo > 0.04 * end:
                ax.text((lo + hi) / 2, 0, f"dp {r}", ha="center", va="center",
                        fontsize=11)
            if r:
                ax.axvline(lo, color="grey", ls="--", lw=1)
    ax.axvline(end, color="k", lw=2)
    last, high = -end, True
    for x, text in sorted(callouts):  # a callout close to the one before goes higher
        high = x - last < 0.12 * end and not high
        ha = "left" if x < 0.05 * end else "right" if x > 0.95 * end else "center"
        shift = {"left": 0.02, "right": -0.04 if high else -0.02, "center": 0}[ha] * end
        ax.annotate(text, xy=(x, 1.4), xytext=(x + shift, 2.3 if high else 1.7), ha=ha,
                    va="bottom", fontsize=10, arrowprops=dict(arrowstyle="->", lw=1),
                    bbox=dict(fc="white", ec="none", pad=1))
        last = x
    ax.set(
        yticks=[0, 1],
        yticklabels=["owner", "parameters"],
        xlim=(0, end),
        ylim=(-0.5, 2.9),
        xlabel="offset in the virtual buffer",
        title=title,
    )
    ax.ticklabel_format(axis="x", style="sci", scilimits=(3, 3))


def straddling(plans):
    """Names of the matrices that more than one DP rank owns a piece of."""
    return [
        m.name
        for i, m in enumerate(plans[0].metas[0])
        if sum(p.metas[0][i].local_numel > 0 for p in plans) > 1
    ]


fig, ax = plt.subplots(figsize=(7, 3.4))
draw_plan(plans, ax)
fig.tight_layout()
show(fig)
plt.close(fig)
cut = straddling(plans)
print("straddling:", ", ".join(cut))

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
# the caption: the last bucket holds only w4
assert [specs[0][i].name for i in plans[0].buckets[0][-1].param_indices] == ["w4"]
keep(
    "ch4-straddling",
    Markdown(
        ", ".join(f"`{n}`" for n in cut[:-1]) + f" and `{cut[-1]}`"
        if len(cut) > 1
        else f"`{cut[0]}`"
    ),
)
keep("ch4-n-straddling", len(cut))

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
The dashed shard boundaries cut through {{ch4-n-straddling}} of the matrices:
{{ch4-straddling}}. Such a matrix **straddles** shard boundaries (a
{term}`straddling parameter`): no single DP rank holds all of its optimizer state. For elementwise AdamW that does not matter; for Muon it is the whole
problem: each owner of a piece of `w3` has part of its momentum matrix; Newton-Schulz needs
all of it.
""")

# %% [markdown]
# ## `dist_meta`, field by field
#
# For every parameter each rank keeps a `DistMeta` (the proof of concept's `dist_meta`). DP
# rank 1's:

# %% tags=["hide-input"] jupyter={"source_hidden": true}
# One column per matrix (the fields as rows, so that the table fits the page).
metas = plans[1].metas[0]
fields = {
    "group_idx": [m.group_idx for m in metas],
    "bucket_idx": [m.bucket_idx for m in metas],
    "shape": ["x".join(map(str, m.shape)) for m in metas],
    "full_shape": ["x".join(map(str, m.full_shape)) for m in metas],
    "global_range": [f"[{m.global_range[0]:,}, {m.global_range[1]:,})" for m in metas],
    "local_range": [f"[{m.local_range[0]:,}, {m.local_range[1]:,})" for m in metas],
    "tp_split_dim": [m.tp_split_dim for m in metas],
}
table(["field", *(m.name for m in metas)], [[k, *v] for k, v in fields.items()],
      align="l" + "r" * len(metas))

# %% [markdown]
# - `group_idx`: which parameter group's buffer (one group here, so 0; the community tutorial calls it
#   `buffer_idx`, and muongrid 0.4 did too).
# - `bucket_idx`: which bucket of that buffer.
# - `shape`: the **TP-local** shape, what this rank holds in the buffer. `full_shape` (our
#   addition) is the matrix after the TP gather, what Newton-Schulz and the lr adjustment see.
# - `global_range`: `[start, end)` of the parameter in the buffer; the same on every rank.
# - `local_range`: the part of `global_range` inside *this* rank's shard; empty (`start == end`)
#   where the rank owns none of the matrix.
# - `tp_split_dim`: 0 (rows) or 1 (columns) split over TP, -1 not split.
#
# In `build_plan`, each matrix takes the next `numel` elements of the buffer (`global_range`);
# its `local_range` is where that range meets this rank's shard:

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing('plan.py', start_after='BOOK-START dist-meta', end_before='BOOK-END dist-meta')

# %% [markdown]
# The optimizer's state for a matrix is a view of the rank's shard, between the two ends of
# `local_range`:

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing('sharding.py', pyobject='local_shard', caption='muongrid/sharding.py')

# %% [markdown]
# Over all DP ranks, the owned pieces of a matrix cover it exactly once (the tests check it for
# thousands of random layouts):

# %%
coverage = []
for i, spec in enumerate(specs[0]):
    pieces = sorted(
        p.metas[0][i].local_range for p in plans if p.metas[0][i].local_numel
    )
    lo, hi = plans[0].metas[0][i].global_range
    covered = (
        pieces[0][0] == lo
        and pieces[-1][1] == hi
        and all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    )
    owners = [r for r, p in enumerate(plans) if p.metas[0][i].local_numel]
    print(
        f"{spec.name}: owned by DP ranks {owners}; pieces cover it exactly once: "
        f"{covered}"
    )
    coverage.append(covered)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
assert all(coverage), "some matrix's owned pieces do not cover it exactly once"

# %% [markdown]
# ## The plan of a real run
#
# Is the plan computed above the one the distributed optimizer uses? The same configuration on 6
# processes, every rank's `dist_meta` compared with ours:

# %%
from muongrid.lab.notebook import last_json, run

real = last_json(
    run(f"inspect_grid.py --dp {DP} --tp {TP} --bucket-numel {BUCKET}")
)
mismatches = 0
for r in real["ranks"]:
    for reported, ours in zip(r["params"], plans[r["dp_rank"]].metas[0]):
        same = (
            tuple(reported["global_range"]) == ours.global_range
            and tuple(reported["local_range"]) == ours.local_range
            and reported["bucket_idx"] == ours.bucket_idx
            and tuple(reported["shape"]) == ours.shape
        )
        mismatches += not same
print(
    f"{len(real['ranks'])} ranks x {len(specs[0])} matrices compared, "
    f"{mismatches} differences"
)
state = {r["rank"]: r["state_bytes"] for r in real["ranks"]}
state_bf16 = {r["rank"]: r["state_bytes_bf16"] for r in real["ranks"]}
print(
    f"rank 0 keeps {state[0]['momentum']:,} bytes of momentum and "
    f"{state[0]['master']:,} of fp32 master\n"
    f"weights: {plans[0].local_state_numel():,} elements each, "
    f"1/{DP} of the padded buffer"
)
print(
    f"the same parameters held in bf16: {state_bf16[0]['momentum']:,} bytes of "
    f"momentum and {state_bf16[0]['master']:,} of fp32 master weights"
)
owned = [sum(m.local_numel for m in p.metas[0]) for p in plans]
padding = sum(b.padded_numel - b.numel for b in buckets)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert mismatches == 0, "the real run used a different plan"
# Every rank keeps the same state (equal shards); the parameter elements it owns
# differ by padding.
assert len({sum(b.values()) for b in state.values()}) == 1
assert sum(owned) == sum(b.numel for b in buckets) and owned[-1] == owned[0] - padding
keep("ch4-owned-first", f"{owned[0]:,}")
keep("ch4-owned-last", f"{owned[-1]:,}")
keep("ch4-padding", padding)
keep("ch4-state-numel", f"{plans[0].local_state_numel():,}")
# fp32 parameters are their own masters; bf16 ones keep an fp32 master of the shard
assert state[0]["master"] == 0
assert state_bf16[0]["master"] == 4 * plans[0].local_state_numel() == state[0]["momentum"]
keep("ch4-master-bf16", f"{state_bf16[0]['master']:,}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
Every rank keeps {{ch4-state-numel}} elements per state tensor (equal shards), but owns
{{ch4-owned-first}} parameter elements on DP ranks 0 and 1 and {{ch4-owned-last}} on DP
rank 2: the {{ch4-padding}} padding elements sit at the ends of buckets, in the last DP rank's
shards.

**Master weights and dtypes.** A *master* is the fp32 copy of a parameter that the optimizer
updates, so that steps too small to change a bf16 number still add up. The parameters of this run
are fp32, so each rank's shard of the parameter buffer is its own master (which is why the run
above counts no master bytes), and the momentum (fp32) is all the state a rank keeps. Given the same parameters in
bf16 (the run builds both), each rank keeps an fp32 master of its shard beside the momentum,
{{ch4-master-bf16}} bytes, as much again. The dtypes also set what travels
({doc}`chapter 6 <06_communication>`): gradients are reduce-scattered in the master's dtype,
fp32; the momentum goes to Newton-Schulz in bf16; parameters are all-gathered in their own dtype.
""")

# %% [markdown]
# ## Try your own shapes
#
# Move the slider of {numref}`fig-ch4-explorer` to change the DP size for the same five matrices
# (every position is a plan `build_plan` computed when the page was built). Hover over a band for
# its range.

# %% mystnb={"figure": {"name": "fig-ch4-explorer", "caption": "The plan of {numref}`fig-ch4-plan` for DP sizes 1 to 6 (tp = 2, buckets of at most 100,000 elements); the title names the straddling matrices and the optimizer state each rank keeps."}}
from muongrid.lab.explorers import Figure, plan_explorer

show(Figure(plan_explorer(specs, tp=TP, bucket=BUCKET, active_dp=DP)))

# %% [markdown]
# {numref}`fig-ch4-buckets` keeps dp = 3 and tp = 2 and moves the bucket size instead: smaller
# buckets cut the buffer in more places and change which matrices straddle. For your own shapes
# in Jupyter, pass `[[ParamSpec(name, (rows, cols), tp_dim), ...]]` to `plan_explorer` or
# `bucket_explorer` (`muongrid.lab.explorers`).

# %% mystnb={"figure": {"name": "fig-ch4-buckets", "caption": "The plan of {numref}`fig-ch4-plan` (dp = 3, tp = 2) for bucket sizes from 5,000 to 800,000 elements; the title gives the number of buckets and the straddling matrices."}}
from muongrid.lab.explorers import bucket_explorer

show(Figure(bucket_explorer(specs, dp=DP, tp=TP, active=BUCKET)))

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# The exercises' answers, computed (the solutions below quote them).
sizes = range(5_000, 800_001, 5_000)
straddlers = {
    b: straddling([build_plan(specs, 2, r, TP, b) for r in range(2)]) for b in sizes
}
fewest = min(len(v) for v in straddlers.values())
best = [b for b, v in straddlers.items() if len(v) == fewest]
assert (
    fewest >= 1
), "some bucket size leaves no matrix straddling: exercise 1's answer is wrong"
keep("ch4-ex1-fewest", fewest)
keep(
    "ch4-ex1-which",
    ", ".join(sorted({n for b in best for n in straddlers[b]}))
)
keep("ch4-ex1-from", f"{best[0]:,}")
dp4 = [build_plan(specs, 4, r, TP, BUCKET) for r in range(4)]
none_on_3 = [m.name for m in dp4[3].metas[0] if m.local_numel == 0]
keep("ch4-ex2-none", Markdown(", ".join(f"`{n}`" for n in none_on_3)))
keep("ch4-ex2-count", len(none_on_3))

# %% [markdown]
# ## Summary
#
# - A parameter group is a virtual flat buffer (`group_idx`) of TP-local parameters, cut into
#   buckets (`bucket_idx`) on parameter boundaries, each padded to a multiple of `dp`.
# - DP rank `r` owns shard `r` of every bucket; `local_range` is its part of a parameter.
# - *Straddling* matrices cross a shard boundary, so no rank holds their whole momentum; the
#   proof of concept gathers whole buckets (chapter 5).
#
# ## Exercises
#
# 1. Is there a bucket size for which no matrix straddles with `dp = 2` (and `tp = 2`)? Try a few
#    in the explorer. What would it take to have none?
# 2. With `dp = 4`, which matrices does rank 3 own nothing of? How much work will it do for them
#    in the proof of concept's step (chapter 5)?
# 3. Why must the buffer be padded at all? What would a reduce-scatter do with 7 elements over 2 ranks?

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
:::{admonition} Solutions
:class: dropdown

1. No. A matrix straddles when a shard boundary falls inside it, and with `dp = 2` every bucket
   is cut at its middle. Trying every bucket size from 5,000 to 800,000 in steps of 5,000 (a
   hidden cell of this page does), the fewest straddling matrices is
   {{ch4-ex1-fewest}} ({{ch4-ex1-which}}, from a bucket size of
   {{ch4-ex1-from}} up): alone in a bucket it is cut in half, and in a bucket with the
   others the middle falls inside it. To have none, the shards must be cut on matrix boundaries
   instead of at equal sizes: the aligned layout of chapter 8, at the price of uneven shards.
2. With `dp = 4` (`tp = 2`, buckets of at most 100,000), rank 3 owns nothing of
   {{ch4-ex2-none}} ({{ch4-ex2-count}} matrices; slider at dp = 4 in
   {numref}`fig-ch4-explorer`). In the proof of concept's step it still gathers their bucket and
   orthogonalises each of them in full (chapter 5), then keeps nothing of the result.
3. Reduce-scatter and all-gather need equal shards on every rank (the collectives take one
   shard size). Seven elements cannot be split into two equal shards; one padding element makes
   two shards of four.
:::
""")

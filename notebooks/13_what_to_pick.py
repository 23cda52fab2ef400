# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
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
# # 13. What to pick and what it costs
#
# ```{admonition} What this chapter runs
# Only arithmetic: the ZeRO-1 plan and the closed-form cost model of chapters 4, 6 and 8, no
# process and no kernel. A few seconds.
# ```
#
# The chapters before this one built, checked and measured several ways to run Muon on sharded
# models. This page puts them side by side: which to pick, and what each costs per rank and per
# step, computed here from the same plan the optimizer uses and the byte formulas that the tests
# hold the ledger to (`dmuon.lab.costmodel`, `dmuon.lab.choice`).

# %% tags=["hide-cell"]
# Set-up, the same in every chapter (`python -m dmuon.lab.notebook sync`).
# In Colab: fetch the book's code and install only what Colab lacks (never torch).
# Elsewhere nothing is installed here: `make setup` (or `pip install -e .`) installs it.
import importlib.util, os, subprocess, sys  # noqa: E401
REPOSITORY = "https://github.com/dmuon-book/distributed-muon"
if "google.colab" in sys.modules:
    if not os.path.isdir("/content/distributed-muon"):
        clone = ["git", "clone", "--depth", "1", REPOSITORY]
        if subprocess.run([*clone, "/content/distributed-muon"]).returncode:
            raise RuntimeError(
                f"could not clone {REPOSITORY}. If that is not the book's "
                "repository, set repository.url in _config.yml to it and run "
                "`python -m dmuon.lab.notebook sync`")
    os.chdir("/content/distributed-muon/notebooks")
    wanted = [("matplotlib", "matplotlib"), ("ipywidgets", "ipywidgets"),
              ("sklearn", "scikit-learn")]
    missing = [pip for module, pip in wanted
               if importlib.util.find_spec(module) is None]
    install = [sys.executable, "-m", "pip", "install", "-q"]
    if importlib.util.find_spec("dmuon") is None:  # the book's package, not its deps
        subprocess.run([*install, "--no-deps", ".."], check=True)
    if missing:
        subprocess.run([*install, *missing], check=True)
elif importlib.util.find_spec("dmuon") is None:
    raise ModuleNotFoundError(
        "the dmuon package is not installed: run `make setup` in the repository and "
        "start Jupyter from its .venv (or `pip install -e .` in this kernel's Python)")

# %% [markdown]
# ## The decision
#
# 1. **Is the model sharded with FSDP2 (`fully_shard`)?** Use **`FSDPMuon`** ({doc}`chapter 11 <11_fsdp2>`). FSDP2
#    already reduce-scatters the gradients and gathers the parameters; Muon adds only the trip of
#    each matrix to its one owner and back, and runs Newton-Schulz once per matrix.
#    (`torch.optim.Muon` also runs on FSDP2 parameters, but gathers every matrix on every rank.)
# 2. **Otherwise: ZeRO-1 data parallel, times tensor parallel if the model is tensor-parallel**, with
#    `DistributedMuon(..., layout="owner")` (chapters 8 and 12). Each matrix is orthogonalised once,
#    by an owner chosen to balance Newton-Schulz work over all ranks; only the pieces of a matrix
#    that are not already on its owner travel.
# 3. **Shapes that divide evenly** (many matrices of equal size, as in a transformer stack):
#    `layout="aligned"` cuts the shards on matrix boundaries, so nothing travels over DP for
#    Newton-Schulz. With uneven shapes the shards become uneven, and the gradient reduce-scatter
#    and parameter all-gather carry the padding: see the first table below.
# 4. **`layout="bucket"` only to reproduce the paper and the proof of concept**: every rank gathers
#    whole buckets and orthogonalises every matrix, so its bytes are the paper's 1.25 x AdamW on a
#    DP-only grid, and its Newton-Schulz work does not shrink as ranks are added.
#
# ## What each layout costs
#
# Two sets of matrices: the proof of concept's five (uneven shapes, one much larger than the
# rest) and a small transformer stack (four layers of QKV, attention output, MLP up and down:
# even shapes). Each on a DP-only grid of 4 and on a 2 x 2 grid. "x AdamW" is the bytes of the
# Muon step over those of Distributed AdamW on the same plan; "NS runs" is how many ranks run
# Newton-Schulz on each matrix; "busiest NS" is the Newton-Schulz work of the rank with the most;
# "state" is the optimizer state a rank keeps (fp32 master and momentum, padding included).

# %% tags=["hide-input"]
from myst_nb import glue

from dmuon.lab.choice import layout_costs
from dmuon.lab.notebook import table
from dmuon.lab.synthetic import DEFAULT_SHAPES, DEFAULT_TP_DIMS, stack_shapes
from dmuon.plan import DEFAULT_BUCKET_NUMEL

stack, stack_dims = stack_shapes(layers=4)
SETS = {
    "the proof of concept's five matrices": [
        dict(shapes=DEFAULT_SHAPES, tp_split_dims=DEFAULT_TP_DIMS, use_muon=True)
    ],
    "a 4-layer transformer stack (d_model 512)": [
        dict(shapes=stack, tp_split_dims=stack_dims, use_muon=True)
    ],
}
GRIDS = [(4, 1), (2, 2)]
costs = {
    (name, grid): layout_costs(groups, *grid, DEFAULT_BUCKET_NUMEL)
    for name, groups in SETS.items()
    for grid in GRIDS
}

for name in SETS:
    rows = []
    for grid in GRIDS:
        for c in costs[(name, grid)]:
            rows.append(
                [
                    f"{grid[0]} x {grid[1]}",
                    c["layout"],
                    f"{c['bytes_per_rank'] / 1e6:.2f} MB",
                    f"{c['vs_adamw']:.2f}",
                    c["ns_runs_per_matrix"],
                    f"{c['busiest_ns_flops'] / 1e9:.1f} GFLOP",
                    f"{c['state_bytes_per_rank'] / 1e6:.2f} MB",
                    c["overlap"],
                ]
            )
    print(f"{name}:")
    table(
        [
            "grid",
            "layout",
            "sent per rank",
            "x AdamW",
            "NS runs",
            "busiest NS",
            "state",
            "overlap",
        ],
        rows,
        align="llrrrrrl",
    )

# %% tags=["remove-cell"]
# The claims of the text, checked on the numbers above (a build fails if one stops
# holding).
by = {(name, grid, c["layout"]): c for (name, grid), cs in costs.items() for c in cs}
poc, even = list(SETS)
for name in SETS:
    assert (
        by[(name, (4, 1), "bucket")]["vs_adamw"] == 1.25
    )  # the paper's bound, exactly
    for grid in GRIDS:
        bucket, owner = by[(name, grid, "bucket")], by[(name, grid, "owner")]
        assert (
            owner["ns_runs_per_matrix"] == 1
            and bucket["ns_runs_per_matrix"] == grid[0] * grid[1]
        )
        assert owner["bytes_per_rank"] <= bucket["bytes_per_rank"]
        assert owner["busiest_ns_flops"] <= bucket["busiest_ns_flops"]
assert by[(even, (4, 1), "aligned")]["vs_adamw"] == 1.0  # nothing over DP for NS
assert (
    by[(poc, (4, 1), "aligned")]["vs_adamw"] > by[(poc, (4, 1), "owner")]["vs_adamw"]
)  # uneven: padding
assert (
    by[(poc, (4, 1), "aligned")]["state_bytes_per_rank"]
    > by[(poc, (4, 1), "owner")]["state_bytes_per_rank"]
)
gain = (
    by[(even, (4, 1), "bucket")]["busiest_ns_flops"]
    / by[(even, (4, 1), "owner")]["busiest_ns_flops"]
)
glue("ch13-stack-ns-gain", f"{gain:.1f}", display=False)
glue(
    "ch13-poc-aligned", f"{by[(poc, (4, 1), 'aligned')]['vs_adamw']:.2f}", display=False
)

# %% [markdown]
# Read the tables this way:
#
# - **bucket** moves exactly 1.25 x AdamW's bytes on a DP-only grid, more with TP (every matrix is
#   also gathered over TP), and every rank runs Newton-Schulz on every matrix.
# - **owner** moves no more than bucket, on every grid here, and runs Newton-Schulz once per
#   matrix: on the stack of equal layers the busiest rank does {glue:text}`ch13-stack-ns-gain` times
#   less Newton-Schulz work than under bucket on 4 ranks. On the proof of concept's shapes one
#   matrix holds most of the work, so its owner is the busiest rank and the gain is small: Newton-
#   Schulz of a matrix is not split ({doc}`chapter 8 <08_beyond_poc>`).
# - **aligned** moves nothing over DP for Newton-Schulz on the even stack (1.00 x AdamW on 4 x 1),
#   but on the proof of concept's uneven shapes its shards are uneven, the collectives carry the
#   padding, and it costs {glue:text}`ch13-poc-aligned` x AdamW, with more state per rank.
# - **overlap**: the owner layouts prefetch by default (each bucket's transfers start before any
#   Newton-Schulz), which they need so that the owners work at once; bucket runs as the proof of
#   concept did.
#
# ## Under FSDP2
#
# With an FSDP2 model the gradient reduce-scatter and the parameter gathers are FSDP2's (how many,
# and in which precision, depends on how it is configured), so the table compares only what Muon
# adds: the trips of each matrix to its {term}`owner` and back, under ZeRO-1 with the owner layout
# and under FSDP2 with `FSDPMuon` (the routes `FSDPMuon` computes, on FSDP2's blocks of rows), on
# DP-only grids.

# %% tags=["hide-input"]
from dmuon.lab.choice import fsdp2_extra, zero1_owner_extra

rows, extra = [], {}
for name, groups in SETS.items():
    shapes = groups[0]["shapes"]
    for dp in (2, 4):
        fsdp = fsdp2_extra(shapes, dp)
        zero1 = zero1_owner_extra(
            [dict(groups[0], tp_split_dims=[-1] * len(shapes))],
            dp,
            DEFAULT_BUCKET_NUMEL,
        )
        extra[(name, dp)] = (zero1, fsdp["extra_bytes_per_rank"])
        rows.append(
            [
                name,
                f"{dp} x 1",
                f"{zero1 / 1e6:.2f} MB",
                f"{fsdp['extra_bytes_per_rank'] / 1e6:.2f} MB",
                f"{fsdp['busiest_ns_flops'] / 1e9:.1f} GFLOP",
            ]
        )
table(
    [
        "matrices",
        "grid",
        "Muon's extra, ZeRO-1 owner",
        "Muon's extra, FSDP2 + FSDPMuon",
        "busiest NS (FSDP2)",
    ],
    rows,
    align="llrrr",
)
# The text below: FSDP2 never moves less for Muon than ZeRO-1's owner layout, and more
# on uneven shapes.
assert all(f >= z for z, f in extra.values())
assert all(f > z for (name, _), (z, f) in extra.items() if name == poc)

# %% [markdown]
# FSDP2 cuts every matrix into blocks of rows on every rank, so every matrix has pieces away from
# its owner; ZeRO-1's flat buffer leaves a matrix that falls inside one rank's shard whole there.
# So Muon's extra traffic under FSDP2 is never below the owner layout's here, and above it on the
# proof of concept's uneven shapes ({doc}`chapter 11 <11_fsdp2>` measures the same on a real
# model). Either way Newton-Schulz runs once per matrix. The choice between them is the model's:
# a model already under `fully_shard` keeps FSDP2 and takes `FSDPMuon`.
#
# Time is another matter: bytes turn into seconds through the network's latency and bandwidth, and
# Newton-Schulz through the GPUs' matmul rate. {doc}`Chapter 6 <06_communication>` prices the
# bytes on a cluster, {doc}`chapter 7 <07_profiling>` profiles a step, and
# {doc}`chapter 8 <08_beyond_poc>` measures the layouts against each other.
#
# ## Summary
#
# - FSDP2 model: `FSDPMuon`. Otherwise ZeRO-1 (x TP) with `layout="owner"`.
# - `layout="aligned"` when the matrices divide evenly into the DP shards; `layout="bucket"` to
#   reproduce the paper's numbers.
# - Every figure on this page is computed from the plan and the cost model; `dmuon.lab.choice`
#   gives the same table for your own shapes and grid.
#
# ## Exercises
#
# Each one is a call to `dmuon.lab.choice` (`layout_costs(groups, dp, tp, bucket_numel)` for a
# list of parameter groups like `SETS[...]` above; `fsdp2_extra` and `zero1_owner_extra` as in the
# FSDP2 cell), so it runs in a second.
#
# 1. Take the 4-layer stack to 8 DP ranks (`layout_costs(SETS[even], 8, 1,
#    DEFAULT_BUCKET_NUMEL)`). Which layout sends the fewest bytes per rank? Is `aligned` still at
#    1.00 x AdamW, and why?
# 2. Give the stack tensor parallelism: a 4 x 2 grid. How many times more Newton-Schulz work does
#    the busiest rank do under `bucket` than under `owner`, and how do their bytes compare with
#    AdamW's?
# 3. In the FSDP2 table, how many times Muon's extra bytes under ZeRO-1's owner layout does FSDP2 +
#    `FSDPMuon` send for the proof of concept's matrices on 4 ranks?
#
# :::{admonition} Solutions
# :class: dropdown
#
# 1. `owner`, at {glue:text}`ch13-ex1-owner` x AdamW. `aligned` rises to
#    {glue:text}`ch13-ex1-aligned` x AdamW (and {glue:text}`ch13-ex1-state` the state per rank of
#    `owner`): its shards must end on matrix boundaries, and the stack's 16 matrices of three sizes
#    cannot be cut into 8 equal runs of whole matrices, so every shard is padded to the largest and
#    the gradient reduce-scatter and parameter all-gather carry the padding. On 4 ranks they could
#    (4 layers, one per rank), which is why the table shows 1.00 there.
# 2. {glue:text}`ch13-ex2-gain` times: every one of the 8 ranks runs Newton-Schulz on every matrix
#    under `bucket`, while `owner` spreads the matrices over the ranks. Bytes:
#    {glue:text}`ch13-ex2-bucket` x AdamW for `bucket` (the TP gathers come on top of the paper's
#    1.25) against {glue:text}`ch13-ex2-owner` for `owner`.
# 3. {glue:text}`ch13-ex3-ratio` times (the row "the proof of concept's five matrices, 4 x 1" of
#    the FSDP2 table: {glue:text}`ch13-ex3-fsdp` against {glue:text}`ch13-ex3-zero1`). FSDP2 cuts
#    every matrix into blocks of rows on every rank, so every matrix has pieces away from its
#    owner, while ZeRO-1's flat buffer leaves the matrices that fall inside one shard whole there.
# :::

# %% tags=["remove-cell"]
# The answers to the exercises, computed here and checked against the reasons the
# solutions give.
stack_groups = SETS["a 4-layer transformer stack (d_model 512)"]
on8 = {c["layout"]: c for c in layout_costs(stack_groups, 8, 1, DEFAULT_BUCKET_NUMEL)}
fewest = min(on8.values(), key=lambda c: c["bytes_per_rank"])
assert fewest["layout"] == "owner"
assert on8["aligned"]["vs_adamw"] > 1.0  # padding on 8 ranks
assert on8["aligned"]["state_bytes_per_rank"] > on8["owner"]["state_bytes_per_rank"]
glue("ch13-ex1-owner", f"{on8['owner']['vs_adamw']:.2f}", display=False)
glue("ch13-ex1-aligned", f"{on8['aligned']['vs_adamw']:.2f}", display=False)
state_ratio = (on8["aligned"]["state_bytes_per_rank"]
               / on8["owner"]["state_bytes_per_rank"])
glue("ch13-ex1-state", f"{state_ratio:.2f} times", display=False)
on42 = {c["layout"]: c for c in layout_costs(stack_groups, 4, 2, DEFAULT_BUCKET_NUMEL)}
assert on42["bucket"]["ns_runs_per_matrix"] == 8
assert on42["owner"]["ns_runs_per_matrix"] == 1
assert on42["bucket"]["vs_adamw"] > 1.25 > on42["owner"]["vs_adamw"]
gain42 = on42["bucket"]["busiest_ns_flops"] / on42["owner"]["busiest_ns_flops"]
glue("ch13-ex2-gain", f"{gain42:.1f}", display=False)
glue("ch13-ex2-bucket", f"{on42['bucket']['vs_adamw']:.2f}", display=False)
glue("ch13-ex2-owner", f"{on42['owner']['vs_adamw']:.2f}", display=False)
zero1_poc4, fsdp_poc4 = extra[(poc, 4)]
assert fsdp_poc4 > zero1_poc4
glue("ch13-ex3-ratio", f"{fsdp_poc4 / zero1_poc4:.1f}", display=False)
glue("ch13-ex3-fsdp", f"{fsdp_poc4 / 1e6:.2f} MB", display=False)
glue("ch13-ex3-zero1", f"{zero1_poc4 / 1e6:.2f} MB", display=False)

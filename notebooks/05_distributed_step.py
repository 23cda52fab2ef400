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
# # 5. One distributed Muon step
#
# ```{admonition} What this chapter runs
# [`scripts/from_scratch.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/from_scratch.py) on 2, 3 and 4 processes, [`scripts/trace_step.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/trace_step.py) on 2 and 4 processes, [`scripts/verify.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/verify.py) on five grids of 2 to 4 processes, and
# three short runs that put the proof of concept's two bugs back. About 1-2 minutes
# on a 2-core laptop.
# Reading: about 60 minutes at 200 words, 8 lines of code or one figure a minute, plus running it. Read first: {doc}`chapter 1 <01_muon>` and {doc}`chapter 4 <04_zero1_buffer>`.
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
# Chapters 3 and 4 left every rank with a TP slice of each matrix and the optimizer state for a
# DP shard of a flat buffer that cuts through matrices. Newton-Schulz needs each update matrix
# whole. Moonshot's Distributed Muon {cite:p}`liu2025muonscalable` brings it together with a
# sequence of gathers and slices:
#
# **DP gather -> TP gather -> Newton-Schulz -> TP shard -> DP shard.**
#
# **Learning goals.** After this chapter you can
#
# - list the stages of a Distributed Muon step, with the shape, dtype and group of each;
# - write the step yourself in plain `torch.distributed`, and check it against the engine;
# - say what each stage costs in bytes, and which stage AdamW does not need;
# - explain why a distributed run can and should match one process bit for bit;
# - recognise the two proof-of-concept bugs by their symptoms.

# %% [markdown]
# ## The flow
#
# Each rank holds its TP-local parameters and gradients. One step, per bucket, in eight stages
# (the numbers are the ones used in the figures and the code below):
#
# 1. **Gradients**: copy the bucket's gradients into a flat fp32 buffer and *reduce-scatter* it
#    over the DP group, dividing by `dp`: each rank receives the averaged gradient of its shard.
# 2. **Momentum** on the shard: the EMA of chapter 1, elementwise, then the *Nesterov update*
#    (the gradient moved toward the new momentum), which is what Newton-Schulz orthogonalises.
# 3. **DP gather**: cast the shard of the Nesterov update to bf16 and *all-gather* it over DP:
#    every rank now has the whole bucket's update (the TP-local slices).
# 4. **TP gather**: for each matrix split over TP, all-gather the slices over the TP group and join
#    them along `tp_split_dim`: the whole matrix.
# 5. **Newton-Schulz** on the whole matrix.
# 6. **TP shard, then DP shard**: keep this TP rank's slice of the result, and of that the part in
#    this rank's shard (`local_range`).
# 7. **Update** the fp32 master shard: weight decay and the scaled Muon step.
# 8. **Parameters**: *all-gather* the master shards over DP, so every rank has the new parameters.
#
# Stages 1, 2 (with Adam's math), 7 and 8 are exactly Distributed AdamW under ZeRO-1. Stages 3-6 are
# what Muon adds.

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
from muongrid.lab.page import keep, listing, say, show, source_of
from muongrid.lab.synthetic import DEFAULT_SHAPES
from muongrid.plan import DEFAULT_BUCKET_NUMEL, SHARD_NUMEL, bucket_limit

keep("ch5-bucket-numel", f"{bucket_limit('auto', 1):,}")
keep("ch5-bucket-pow", f"$2^{{{DEFAULT_BUCKET_NUMEL.bit_length() - 1}}}$")
keep("ch5-shard-pow", f"$2^{{{SHARD_NUMEL.bit_length() - 1}}}$")
assert 2 ** (DEFAULT_BUCKET_NUMEL.bit_length() - 1) == DEFAULT_BUCKET_NUMEL
keep("ch5-five-numel", f"{sum(r * c for r, c in DEFAULT_SHAPES):,}")
assert all(bucket_limit("auto", dp) == DEFAULT_BUCKET_NUMEL for dp in (1, 2, 3, 4))
assert sum(r * c for r, c in DEFAULT_SHAPES) <= DEFAULT_BUCKET_NUMEL  # one bucket, as said

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
A *bucket* is a run of consecutive matrices of one group, at most `bucket_numel` elements
long (a larger matrix gets a bucket of its own). By default (`bucket_numel="auto"`) that is
{{ch5-bucket-pow}} = {{ch5-bucket-numel}} elements on up to 4 DP ranks, grown beyond so that
each rank's shard keeps {{ch5-shard-pow}} (`muongrid.plan.bucket_limit`). The five matrices this
chapter traces hold {{ch5-five-numel}} elements in all, so on every grid here they make one
bucket.
""")

# %% [markdown]
# ## The step from scratch

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
SCRATCH = dict(start_after="BOOK-START from-scratch", end_before="BOOK-END from-scratch")
scratch_code = source_of("scripts/from_scratch.py", **SCRATCH)
launch_code = scratch_code[scratch_code.index("def run_rank("):]
keep("ch5-scratch-lines", sum(1 for line in scratch_code[:len(scratch_code) - len(launch_code)]
                              .splitlines() if line.strip()))
keep("ch5-launch-lines", sum(1 for line in launch_code.splitlines() if line.strip()))
assert max(map(len, scratch_code.splitlines())) <= 88  # no line wraps at 1280 px

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
[`scripts/from_scratch.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/from_scratch.py) writes the eight stages in
{{ch5-scratch-lines}} lines of plain `torch.distributed`, for one parameter group, and starts
its processes in {{ch5-launch-lines}} more. Every call is `torch.distributed`'s own, under its own
name: `new_group` makes the DP and TP groups (`make_groups`), `reduce_scatter` and `all_gather`
take one tensor per rank in a list (here views of one flat buffer: `chunk(dp)`), and
`init_process_group` joins a process to the job. Their flat forms, `reduce_scatter_tensor` and
`all_gather_into_tensor`, take the flat buffer itself; torch 2.13 renamed those to
`reduce_scatter_single` and `all_gather_single` and warns at the old names, while older torch
has only the old ones. The list forms are long-standing and kept their names, so the listing
uses them.

The flat buffer and its `dp` padded shards are chapter 4's, with the whole group as one bucket; a
rank keeps the fp32 master and momentum of its own shard only. Stages 3-6 are one method,
`orthogonalise`, which an exercise below replaces. Newton-Schulz is chapter 1's `zeropower_ns5`,
imported: nothing in it is distributed.
""")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing("scripts/from_scratch.py", start_after="BOOK-START from-scratch",
        end_before="BOOK-END from-scratch")

# %% [markdown]
# `launch(fn, dp, tp)` runs `fn(dp, tp)` in `dp * tp` processes: each joins the job over gloo
# (`init_process_group`, meeting at a free port) and can then make its groups and its optimizer.
# `mp.start_processes` is `mp.spawn`'s general form; `start_method="fork"` starts every rank from
# the running process, torch already imported, where `mp.spawn` would start a new interpreter per
# rank (seconds each). On macOS and Windows, where fork is unsafe or missing, write `"spawn"` and
# call `launch` only where `__name__ == "__main__"`. On a GPU cluster, `torchrun` starts the
# processes and each calls `init_process_group("nccl")` itself.
#
# The script steps this class and muongrid's `DistributedMuon(layout="bucket")` side by side on
# the same grid and gradients (different on every DP rank), over five matrices whose buffers
# divide by neither 2 nor 3, and compares every parameter's bits after each step. On 2 x 2 the
# ranks are started by the listing's own `launch` (`--launch listing`; by default muongrid's
# launcher starts them, which also runs under `torchrun`). `--plant` adds copies of the class with
# one line changed:

# %%
from muongrid.lab.notebook import last_json, run, table

scratch = {}
for dp, tp, plant, how in [(2, 1, "lost-momentum", "muongrid"),
                           (2, 2, "tp-lr,no-mean", "listing")]:
    out = run(f"from_scratch.py --dp {dp} --tp {tp} --plant {plant} --launch {how}",
              log="collapsed")
    scratch[f"{dp} x {tp}"] = last_json(out)
rows = [[grid, r["launch"], "from scratch", r["equal"], f"{r['max_abs_diff']:.1e}"]
        for grid, r in scratch.items()]
rows += [[grid, r["launch"], f"planted: {name}", p["equal"], f"{p['max_abs_diff']:.1e}"]
         for grid, r in scratch.items() for name, p in r["planted"].items()]
HEAD = ["grid", "ranks started by", "optimizer", "bit for bit", "largest difference"]
table(HEAD, rows, align="lllll")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert all(r["equal"] and r["max_abs_diff"] == 0 for r in scratch.values())
assert scratch["2 x 2"]["launch"] == "listing"  # the prose says the listing's launch ran it
planted = {name: p for r in scratch.values() for name, p in r["planted"].items()}
assert not planted["lost-momentum"]["equal"] and not planted["tp-lr"]["equal"]
assert planted["no-mean"]["equal"], "the prose says no-mean is invisible with dp = 2"
keep("ch5-scratch-steps", scratch["2 x 2"]["steps"])
keep("ch5-tp-lr-diff", f"{planted['tp-lr']['max_abs_diff']:.1e}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
On both grids the class equals the engine bit for bit after {{ch5-scratch-steps}} steps:
the same arithmetic in the same order gives the same bits. The check catches a
momentum computed and thrown away (`lerp` for `lerp_`) and an lr scaled by the TP-local shape
(`tp-lr`, off by {{ch5-tp-lr-diff}}). It cannot see a sum of the DP gradients in place of
their mean (`no-mean`), and rightly: with `dp = 2` the sum is exactly twice the mean, and
Newton-Schulz divides by the norm first. With `dp = 3` the bits differ (try
`--dp 3 --plant no-mean`).
""")

# %% [markdown]
# ## Where the engine does the same
#
# Each stage has its place in `muongrid` (line counts read from the source). The engine is
# longer for reasons that are not Muon:

# %% tags=["hide-input"] jupyter={"source_hidden": true}
ENGINE = [  # (from scratch, where the engine does it, what its extra lines are for)
    ("make_groups", "grid.py", "Grid.build",
     "a device mesh; a timeout on every group; checks the layout"),
    ("offsets, shard", "plan.py", "build_plan",
     "buckets bound each collective; four layouts; owners"),
    ("1. reduce_scatter, /= dp", "store.py", "Store.reduce_scatter",
     "the next backward writes into the buffer; missing gradients"),
    ("2. lerp_, lerp", "updates.py", "muon_momentum_foreach_",
     "one foreach pass over many pieces; a step that may be skipped"),
    ("3. all_gather (bf16)", "flows.py", "BucketFlow.run",
     "bucket by bucket, with prefetch; the ledger counts bytes"),
    ("4-6. TP gather, NS, slices", "flows.py", "BucketFlow._orthogonalise_bucket",
     "every TP gather started before the first Newton-Schulz; a trace hook"),
    ("7. mul_, add_", "distributed.py", "Applier",
     "one pass per lr scale; records what was updated, for a guard"),
    ("8. all_gather (fp32)", "store.py", "Store.gather",
     "parameters are views of the buffer: gathered in place"),
]
table(["from scratch", "muongrid", "lines", "what the extra lines do"],
      [[ours, f"{path}: {name}", len(source_of(path, pyobject=name).splitlines()), why]
       for ours, path, name, why in ENGINE], align="llrl")

# %% [markdown]
# Two things make the engine's stages 1, 7 and 8 cheap. A bucket's parameters are *views of one
# flat buffer* laid out as the collectives move it, in the optimizer's *store* ([`muongrid/store.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/store.py)), so an fp32
# parameter's master shard *is* this rank's slice of it (only bf16 and fp16 parameters keep an
# fp32 master apart) and stage 8 gathers in place. And the elementwise stages (2 and 7) run as
# *one foreach pass* over all pieces: on a GPU, a few kernels instead of thousands.
#
# ## The code, stage by stage
#
# The optimizer is `ZeroOneOptimizer` in [`muongrid/distributed.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/distributed.py)
# (`DistributedMuon` is a thin subclass of it); stages 3-6 are the layout's *flow*, here the proof
# of concept's `BucketFlow` in [`muongrid/flows.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/flows.py). The excerpts are read
# from those files when the book is built.
# `step()` first takes up whatever was written to the parameters since the last step
# (`store.refresh()`), then calls one method for stages 1-7 and one for stage 8:

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing('distributed.py', pyobject='ZeroOneOptimizer.step')

# %% [markdown]
# Stages 1-7 for a Muon group. The generator `updates` (the store's) hands the flow each bucket's pieces of the
# Nesterov update (stages 1-2); the flow hands back this rank's piece of every orthogonalised matrix
# (stages 3-6), which stage 7 applies to the master shard. The last line checks, after every step,
# that exactly the matrices the plan gives this rank ran Newton-Schulz here and that every matrix it
# holds a piece of got its update (a matrix skipped or updated without orthogonalisation fails the
# step, naming it):

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing('distributed.py', start_after='BOOK-START muon-group', end_before='BOOK-END muon-group')

# %% [markdown]
# **Stage 1**, the gradient reduce-scatter (the same as AdamW's). The gradients are already in the
# bucket's flat gradient buffer: during backward a hook on each parameter copied autograd's gradient
# to its place there once and pointed `p.grad` at that place, so further backwards (accumulation, or a
# loop that zeroes in place) add into the buffer. The step copies in, in one `foreach` copy, only the
# gradients that did not come that way (set by hand, say), and writes zeros for a missing one:

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing('store.py', pyobject='Store.reduce_scatter')

# %% [markdown]
# Of that shard, each parameter's piece is a view (`local_shard`), and those pieces are what the
# next stages work on.
#
# **Stage 2**, momentum and the Nesterov update. Both are elementwise, so they run on the pieces unchanged:
# `Store.momentum` gathers every piece of the buckets the flow asks for (one bucket at a
# time for this layout, the whole group at once for the owner layouts) and makes one call of

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing('updates.py', pyobject='muon_momentum_foreach_', caption='muongrid/updates.py')

# %% [markdown]
# `lerp_(grad, 1 - momentum)` is the EMA of chapter 1, and the Nesterov update is a second
# `lerp` toward the buffer: that update, not the momentum, is what the next stages gather and
# orthogonalise.
#
# **Stage 3**, the DP gather of each bucket's Nesterov update (bf16), started per bucket. `flat_shard` lays the pieces
# out as this rank's shard of the bucket and casts them to bf16 in the same copy, straight into this
# rank's part of a gather buffer that the flow made once (a few of them, used in turn), and the
# all-gather fills in the other ranks' parts in place:

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing('flows.py', pyobject='BucketFlow.run')

# %% [markdown]
# **Stages 4-6** for every matrix of a gathered bucket: cut the matrix out of the bucket *as a
# matrix*, TP gather, Newton-Schulz, TP shard, DP shard (the comments name the stages):

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing('flows.py', pyobject='BucketFlow._orthogonalise_bucket')

# %% [markdown]
# The helpers it calls are a few lines each: cutting a matrix out of the gathered bucket (with
# `.view(meta.shape)`: the proof of concept's second bug, below, was a flat `.view(-1)` here),
# joining the TP slices, and keeping this DP rank's part:

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing('sharding.py', pyobject='bucket_matrix', caption='muongrid/sharding.py')

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing('sharding.py', pyobject='tp_unshard', caption='muongrid/sharding.py')

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing('sharding.py', pyobject='dp_shard_of', caption='muongrid/sharding.py')

# %% [markdown]
# **Stage 7**, decoupled weight decay and the scaled step, on the master shard's pieces.
# `apply.add` collects the pieces by their scaled learning rate (the lr adjusted for the matrix's
# shape, so one list per shape) and `apply.flush` makes one call per list:

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing('updates.py', pyobject='apply_update_foreach_', caption='muongrid/updates.py')

# %% [markdown]
# **Stage 8**, the parameter all-gather (AdamW's too). Where the parameters are views of the bucket's
# buffer, each rank's shard of the buffer already holds its new values (for fp32 parameters the master
# *is* that shard; a bf16 parameter's fp32 master is rounded into it first), and the all-gather fills
# in the other ranks' shards in place; a bucket that is not bound (DTensor parameters, unless the
# optimizer is asked to bind them too, or parameters that share storage) is gathered and unpacked into
# its parameters:

# %% tags=["remove-input"] jupyter={"source_hidden": true}
listing('store.py', pyobject='Store.gather')

# %% [markdown]
# ## A step, traced
#
# [`scripts/trace_step.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/trace_step.py) runs one step of the real optimizer on a 2 x 2 grid with its trace hook
# on: at each stage the optimizer reports the tensor it holds. Follow the 676 x 876 matrix `w3`,
# which is split over TP by columns and straddles the DP shard boundary:

# %%
from muongrid.lab.notebook import last_json, run

trace = last_json(run("trace_step.py --dp 2 --tp 2 --show w3 --layouts bucket,owner",
                      log="collapsed"))

# %% [markdown]
# {numref}`fig-ch5-flow` draws, for every rank, which part of `w3` it holds at each stage;
# {numref}`fig-ch5-stages` follows rank 0 with the shapes and dtypes.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-ch5-flow", "caption": "One Distributed Muon step on a 2 x 2 grid, following the 676 x 876 matrix `w3` (split over TP by columns, dashed). Each row is a rank; the filled part is what the rank holds of `w3`, numbered as the stages of the list above: its DP shard of the Nesterov update (2), the whole TP half after the DP gather (3), the whole matrix after the TP gather (4), orthogonalised (5), and the elements it keeps (6). Labels: shapes (or element counts of flat buffers, the whole bucket for 2 and 3) and dtypes from the run's trace."}} jupyter={"source_hidden": true}
import matplotlib.pyplot as plt

from muongrid.lab import palette
from muongrid.lab.diagrams import book_style, step_flow_diagram
from muongrid.lab.synthetic import DEFAULT_SHAPES, DEFAULT_TP_DIMS
from muongrid.plan import DEFAULT_BUCKET_NUMEL, ParamSpec, build_plan

book_style()
specs = [[ParamSpec(f"w{i}", s, d)
          for i, (s, d) in enumerate(zip(DEFAULT_SHAPES, DEFAULT_TP_DIMS))]]
w3_metas = [next(m for m in build_plan(specs, 2, d, 2, DEFAULT_BUCKET_NUMEL).metas[0]
                 if m.name == "w3") for d in range(2)]
# the plan drawn is the one the run used: the same number of w3 elements kept
for r in trace["ranks"]:
    kept = next(e for e in r["events"]
                if e["name"] == "w3" and e["stage"] == "dp_shard")["numel"]
    assert kept == w3_metas[r["dp_rank"]].local_numel
show(step_flow_diagram(trace, w3_metas))
plt.close("all")

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-ch5-stages", "caption": "One step on rank 0 (dp 0, tp 0), following `w3`: the shape and dtype of what the optimizer holds at each stage, read from the trace (left column first), numbered as in the list above. Stage 2 shows the Nesterov update (momentum's look-ahead), in the bf16 that the DP gather sends; the momentum itself stays fp32. Blue: as in AdamW's step; orange: what Muon adds."}} jupyter={"source_hidden": true}
ORDER = ["grad_shard", "momentum_shard", "dp_gathered", "ns_input", "tp_gathered",
         "orthogonalised", "tp_shard", "dp_shard"]
LABEL = {
    "grad_shard": "1. grad shard\n(after reduce-scatter)",
    "momentum_shard": "2. Nesterov update\n(sent as bf16)",
    "dp_gathered": "3. DP gather\n(whole bucket)",
    "ns_input": "3. matrix, TP-local",
    "tp_gathered": "4. TP gather\n(whole matrix)",
    "orthogonalised": "5. Newton-Schulz",
    "tp_shard": "6. TP shard",
    "dp_shard": "6. DP shard\n(my elements)",
}
rank0 = trace["ranks"][0]
w3_bucket = next(
    e["name"] for e in rank0["events"] if e["stage"] == "dp_gathered"
)  # w3's bucket (there is one)
stages = [
    next(
        e for e in rank0["events"] if e["stage"] == s and e["name"] in ("w3", w3_bucket)
    )
    for s in ORDER
]

fig, ax = plt.subplots(figsize=(6.4, 6.4))
for i, e in enumerate(stages):  # two columns of four stages, top to bottom
    x, y = i // 4, 3 - i % 4
    muon_only = e["stage"] not in ("grad_shard", "momentum_shard")
    tint = palette.OPTIMIZER_TINT["muon" if muon_only else "adamw"]
    ax.text(x, y + 0.14, LABEL[e["stage"]].replace("\n", " "), ha="center",
            va="center", fontsize=11, bbox=dict(boxstyle="round", fc=tint, ec="grey"))
    shape = (
        "x".join(map(str, e["shape"]))
        if len(e["shape"]) > 1
        else f"{e['numel']:,} elements"
    )
    ax.text(
        x, y - 0.22, f"{shape}, {e['dtype']}", ha="center", va="center", fontsize=10
    )
    if y < 3:
        ax.annotate(
            "", xy=(x, y + 0.34), xytext=(x, y + 0.62), arrowprops=dict(arrowstyle="->")
        )
# where the stages go on (an arrow across would cross the boxes)
ax.text(0, -0.5, "continued at the top of the right column", ha="center", va="center",
        fontsize=9, color="grey", style="italic")
ax.set(xlim=(-0.6, 1.6), ylim=(-0.6, 3.5))
ax.axis("off")
fig.tight_layout()
show(fig)
plt.close(fig)

# %% [markdown]
# Read the shapes: the gradient shard is flat (the DP shard of the bucket, all matrices of the
# bucket mixed). The DP gather restores the whole bucket, out of which `w3`'s TP-local block
# (676 x 438) is cut *and viewed as a matrix*; the TP gather joins the two column halves into the
# full 676 x 876 matrix; Newton-Schulz runs on it; then the rank keeps its TP half and, of that, its
# DP part. Every rank does this for every matrix of the bucket:

# %%
from muongrid.lab.notebook import table

w3 = {r["rank"]: [e for e in r["events"] if e["name"] == "w3"] for r in trace["ranks"]}
kept = {r: next(e for e in w3[r] if e["stage"] == "dp_shard")["numel"] for r in w3}
whole = {
    r: next(e for e in w3[r] if e["stage"] == "orthogonalised")["shape"] for r in w3
}
table(["rank", "dp", "tp", "orthogonalised", "elements kept"],
      [[r["rank"], r["dp_rank"], r["tp_rank"], "x".join(map(str, whole[r["rank"]])),
        kept[r["rank"]]] for r in trace["ranks"]])
print(
    f"the two DP ranks of a TP slice keep {kept[0] + kept[2]:,} = 676 x 438 elements "
    f"between them"
)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert kept[0] + kept[2] == 676 * 438

# %% [markdown]
# So the proof of concept's layout does **redundant work**: all `dp x tp` ranks run
# Newton-Schulz on every matrix, and each keeps a sliver (chapter 6 measures it).
#
# ## What each stage costs
#
# Every collective went through the ledger ([`muongrid/comm.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/comm.py)). Bytes per rank for this step:

# %%
phases = trace["ledger"]["phases"]
total = ["total", "", "", sum(p["calls"] for p in phases.values()),
         trace["ledger"]["bytes_sent"]]
table(["phase", "group", "dtype", "calls", "bytes sent per rank"],
      [[name, p["group"], p["dtype"], p["calls"], p["bytes_sent"]]
       for name, p in phases.items()] + [total])

# %% [markdown]
# The DP gather moves half the bytes of the gradient reduce-scatter: bf16 (2 bytes) against
# fp32 (4). Distributed AdamW moves 4 + 4 bytes a parameter and Distributed Muon 4 + 2 + 4, so
# on a DP-only grid Muon moves 1.25 x AdamW's bytes; the TP gather comes on top
# ({doc}`chapter 6 <06_communication>`).
#
# ## Step through it: the bucket and owner layouts
#
# {numref}`fig-ch5-explorer` follows the whole step on four grids, for the proof of concept's
# layout and for chapter 8's *owner* layout, which sends each matrix's pieces to one rank, its
# owner, and runs Newton-Schulz there once. The run above stepped both layouts with the same
# gradients; three more runs cover the other grids:

# %%
from muongrid.lab.step_explorer import stage_rows, step_explorer

steps = [
    trace if (dp, tp) == (2, 2) else
    last_json(run(f"trace_step.py --dp {dp} --tp {tp} --layouts bucket,owner",
                  log="collapsed"))
    for dp, tp in [(2, 1), (1, 2), (2, 2), (4, 1)]
]

# %% [markdown]
# Pick a grid with the buttons above the figure and move the slider through the stages (a grid
# keeps the stage you are at). Each box is a rank (rows: DP rank, columns: TP rank; the 4 x 1
# grid's four ranks fill two rows of two) and each bar a matrix, filled as far as the rank holds it
# after the stage, labelled with the shape (or the element count of a flat piece) and dtype that
# the run reported; hovering a bar says where that matrix runs Newton-Schulz. Under each layout,
# the bytes each rank sent, and to whom, in that stage, from the ledger. A ring collective
# (all-gather, reduce-scatter) is drawn as the ring it is: each rank sends to the next rank of its
# group, which passes on what is not its own, so on 4 x 1 the cells make a ring. An all-to-all
# goes straight to each rank. Hovering a cell names the pieces of that transfer: each matrix's TP
# slice and element range, the rank that keeps it (whose DP shard holds it) and, in the owner
# layout's all-to-alls, the matrix's owner.

# %% mystnb={"figure": {"name": "fig-ch5-explorer", "caption": "One Distributed Muon step, stage by stage, from traced runs on four grids (buttons), for the bucket layout (left) and the owner layout (right). Top: what each rank holds of each matrix after the stage (bar: its share of the whole matrix; label: shape or element count, and dtype, from the trace). Bottom: the bytes each rank sent to each other rank in the stage (rows: from, columns: to), from the ledger, ring collectives as rings; hovering a cell names the matrix pieces it carried, who keeps them and their owner. Stage 0 is before the step."}}
show(step_explorer(steps, active_grid=(2, 2), active_stage=3))

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
rows = stage_rows(steps)
for s in steps:  # the figure's bytes are the ledger's, rank by rank
    for layout, r in ((run_["layout"], r) for run_ in s["runs"] for r in run_["ranks"]):
        shown = sum(x["bytes_sent"] for x in rows
                    if (x["dp"], x["tp"], x["layout"], x["rank"]) == (s["dp"], s["tp"], layout, r["rank"]))
        assert shown == r["ledger"]["bytes_sent"]
on_2x2 = {layout: [x for x in rows if (x["dp"], x["tp"], x["layout"]) == (2, 2, layout)]
          for layout in ("bucket", "owner")}
ns_runs = {k: sum(x["ns_runs"] for x in v if x["stage"] == 5) for k, v in on_2x2.items()}
ns_bytes = {k: sum(x["bytes_sent"] for x in v if x["stage"] in (3, 4, 6))
            for k, v in on_2x2.items()}
assert ns_runs["owner"] == len(trace["shapes"]) < ns_runs["bucket"]
# what the paragraph says about the send matrices, checked on this run
at = {(x["layout"], x["stage"], x["rank"]): x for v in on_2x2.values() for x in v}
w3_owner = next(r for r in range(4) if any(h["name"] == "w3" for h in at["owner", 5, r]["holds"]))
for r in range(4):
    assert set(at["bucket", 3, r]["sends"]) == {r ^ 2}  # its DP partner
    assert set(at["bucket", 4, r]["sends"]) == {r ^ 1}  # its TP partner
    sent = at["owner", 3, r]["sends"]
    assert r == w3_owner or max(sent, key=sent.get) == w3_owner
    for stage in (1, 8):
        assert at["bucket", stage, r]["sends"] == at["owner", stage, r]["sends"]
assert len({at["bucket", 3, r]["bytes_sent"] for r in range(4)}) == 1
assert max(range(4), key=lambda r: at["owner", 6, r]["bytes_sent"]) == w3_owner
# the paragraph above the figure: 4 x 1's rings, and its boxes in two rows of two
from muongrid.lab.step_explorer import box_grid

ring = {x["rank"]: set(x["sends"]) for x in rows
        if (x["dp"], x["tp"], x["layout"], x["stage"]) == (4, 1, "bucket", 3)}
assert ring == {r: {(r + 1) % 4} for r in range(4)} and box_grid(4, 1) == (2, 2)
keep("ch5-ns-runs-bucket", ns_runs["bucket"])
keep("ch5-ns-runs-owner", ns_runs["owner"])
keep("ch5-ns-mb-bucket", f"{ns_bytes['bucket'] / 1e6:.2f} MB")
keep("ch5-ns-mb-owner", f"{ns_bytes['owner'] / 1e6:.2f} MB")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
Step through the 2 x 2 grid. The bucket layout runs Newton-Schulz
{{ch5-ns-runs-bucket}} times (every matrix on every rank), the owner layout
{{ch5-ns-runs-owner}}, once per matrix. What travels for it (stages 3, 4 and 6, all ranks
together): {{ch5-ns-mb-bucket}} in the bucket layout's DP and TP gathers, against
{{ch5-ns-mb-owner}} to the owners and back. The bucket layout's send matrices are regular
(each rank sends the same to its DP partner, then to its TP partner); the owner layout's are
not: in stage 3 every other rank sends most to the owner of the largest matrix, `w3`, and in
stage 6 that owner sends the most. Stages 2 and 7 keep the momentum and the master in fp32; only the Nesterov update that
stage 3 sends is cast to bf16. Stages 1 and 8, and the state, are the same in both layouts.
""")

# %% [markdown]
# ## Is it right? Checking against one process
#
# [`scripts/verify.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/verify.py) runs Distributed Muon beside single-process Muon (on rank 0) for several
# steps, with different gradients on every DP rank, and compares every rank's parameters with the
# reference after each step: uneven shapes, straddling matrices and several parameter groups
# included. Five grids (each log folded):

# %%
checks = []
for dp, tp, opt in [(2, 1, "muon"), (3, 1, "muon"), (2, 2, "muon"), (1, 4, "muon"),
                    (2, 2, "hybrid")]:
    out = run(f"verify.py --dp {dp} --tp {tp} --optimizer {opt} --steps 2",
              log="collapsed")
    checks.append(last_json(out))

# %% tags=["hide-input"] jupyter={"source_hidden": true}
table(["grid", "optimizer", "steps", "max abs. difference from one process",
       "bytes per rank per step"],
      [[f"{c['dp']} x {c['tp']}", c["optimizer"], c["steps"], c["max_abs_diff"],
        c["ledger"]["bytes_sent"]] for c in checks],
      align="llrrr")
all_zero = all(c["max_abs_diff"] == 0 for c in checks)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
keep("ch5-verdict",
     "Every difference is exactly zero" if all_zero else "NOT every difference is zero")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
{{ch5-verdict}}, and "exact" is the right standard: on one machine each rank runs the
*same kernels on the same numbers* as the reference (the momentum is elementwise, the gathers
move bytes untouched, Newton-Schulz sees the same whole matrix). Only the gradient average
could add in a different order, so the test gradients are multiples of $2^{-12}$ whose sums
are exact in fp32 in any order. Any nonzero difference is a bug. Across machines or GPU models
kernels differ and `--atol` sets a tolerance.
""")

# %% [markdown]
# ## The proof of concept's two bugs
#
# [`muongrid/lab/poc_bugs.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/lab/poc_bugs.py) puts each of the tutorial's two bugs {cite:p}`wei2025muondistributed` back
# into this engine as a one-method change; `verify.py --poc-bug ...` runs the check with it.
#
# **Bug 1: a stale `params`.** The second loop over parameter groups forgot
# `params = group["params"]` and reused the list left over from the first loop, the last
# group's. With one group nothing shows. With two groups of the same shapes, no error is raised,
# but one group's new parameters are written into the other group's tensors:

# %%
stale = last_json(run("verify.py --dp 2 --shapes 64x64,64x64 --tp-dims none,none "
                     "--groups 2 --poc-bug stale-params",
                     expect_failure=True, log="collapsed"))
print(
    f"with the bug: max difference {stale['max_abs_diff']:.3e} after {stale['steps']} "
    f"steps, and no error raised"
)

# %% [markdown]
# A silent bug: only a comparison with a reference catches it, and only with more than one
# parameter group. (With groups of different shapes it crashes instead.)
#
# **Bug 2: a flat view.** After the DP gather, the proof of concept took each matrix out of the flat
# bucket with `.view(-1)` instead of `.view(dist_meta.shape)`, and Newton-Schulz received a vector:

# %%
flat = run("verify.py --dp 2 --shapes 64x64,64x96 --tp-dims none,none "
           "--poc-bug flat-view", expect_failure=True, log="collapsed")
print(next(line for line in flat.splitlines() if line.startswith("ValueError")))

# %% [markdown]
# The report said this bug "only manifested with certain DP/TP configurations": a matrix split
# over TP is rebuilt from `dist_meta.shape` by the TP gather, which hides the flat view. With
# every matrix split over TP, the buggy code passes:

# %%
hidden = last_json(run("verify.py --tp 2 --shapes 64x64,64x96 --tp-dims 0,1 "
                      "--poc-bug flat-view", log="collapsed"))
print(
    f"flat-view bug with every matrix split over TP: ok={hidden['ok']}, max difference "
    f"{hidden['max_abs_diff']}"
)

# %% [markdown]
# Both bugs have regression tests ([`tests/test_distributed.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_distributed.py)) that assert the check catches them.
# What happens when a rank fails mid-step is {doc}`chapter 10 <10_checkpoints_failures>`'s
# subject.

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# The exercises' answers, computed (the solutions below quote them).
from muongrid.lab.costmodel import dp_gather_bytes

dp3 = [build_plan(specs, 3, d, 1, DEFAULT_BUCKET_NUMEL) for d in range(3)]
w1_owners = [d for d, p in enumerate(dp3)
             if next(m for m in p.metas[0] if m.name == "w1").local_numel]
assert len(w1_owners) == 1, "exercise 1's answer says one DP rank owns w1"
keep("ch5-ex1-which", ", ".join(map(str, w1_owners)))
groups = [dict(shapes=DEFAULT_SHAPES, tp_split_dims=DEFAULT_TP_DIMS, use_muon=True)]
whole, straddlers = (
    dp_gather_bytes(groups, 2, 2, DEFAULT_BUCKET_NUMEL, v)
    for v in ("bucket", "straddlers")
)
# the closed form is what the traced step sent
assert whole == phases["ns_gather_dp"]["bytes_sent"]
keep("ch5-ex3-whole", f"{whole:,.0f}")
keep("ch5-ex3-straddlers", f"{straddlers:,.0f}")
# exercise 4's solution, run against the engine's owner layout: 2 x 1, and 3 x 1 (a buffer 3 does
# not divide, matrices cut by shard boundaries)
OWNER = "--code scripts/from_scratch_owner.py --class OwnerMuon --layout owner"
owner_runs = {dp: last_json(run(f"from_scratch.py --dp {dp} {OWNER}", log="collapsed"))
              for dp in (2, 3)}
assert all(r["equal"] and r["max_abs_diff"] == 0 and r["layout"] == "owner"
           and r["cls"] == "OwnerMuon" and "OwnerMuon" in r["defined"] for r in owner_runs.values())
owner_code = source_of("scripts/from_scratch_owner.py", start_after="BOOK-START owner",
                       end_before="BOOK-END owner")
assert max(map(len, owner_code.splitlines())) <= 88 and "all_to_all_single" in owner_code
keep("ch5-owner-code", owner_code.strip("\n"))
keep("ch5-owner-steps", owner_runs[3]["steps"])
# the engine's owners (balanced Newton-Schulz work) against the solution's i % dp, on 3 x 1
from muongrid.lab.synthetic import build_problem

r3 = owner_runs[3]
problem = build_problem("muon", [tuple(x) for x in r3["shapes"]], r3["tp_dims"], 2, r3["seed"], 1)
plan3 = build_plan([[ParamSpec(n, tuple(x), -1) for n, x in zip(g["names"], g["shapes"])]
                    for g in problem.groups], 3, 0, 1, "auto", "owner")
other = sum(plan3.owner_of(m) != i % 3 for metas in plan3.metas for i, m in enumerate(metas))
assert other > 0, "the solution's prose says the engine picks other owners"
keep("ch5-owner-other", other)
keep("ch5-owner-all", sum(map(len, plan3.metas)))

# %% [markdown]
# ## Summary
#
# - Distributed Muon per bucket: reduce-scatter gradients (fp32), momentum and the Nesterov update
#   on the shard, DP gather of the update (bf16, whole bucket), TP gather (per matrix),
#   Newton-Schulz on the whole matrix, keep the TP then the DP shard, update the fp32 master
#   shard, all-gather the parameters.
# - The DP and TP gathers are Muon's extra communication; in the proof of concept's layout every
#   rank also orthogonalises every matrix of the bucket.
# - On one machine a correct implementation matches single-process Muon exactly, a test that
#   catches both proof-of-concept bugs.
#
# ## Exercises
#
# 1. Run `trace_step.py --dp 3 --tp 1 --show w1`. How many DP ranks own a piece of `w1`? (Its five
#    matrices make one bucket at the default bucket size: see "The flow".)
# 2. Put bug 1 back and run `verify.py` with `--groups 1`. Does the check catch it? What does that
#    tell you about testing distributed optimizers?
# 3. How many bytes would the DP gather move if each rank gathered only the matrices it owns a piece
#    of? (Chapter 6 works it out.)
# 4. Change the class: write stages 3-6 (`orthogonalise`) with one owner per matrix, chapter 8's
#    layout, for data parallelism alone (`tp = 1`). Each rank sends its part of every matrix to that
#    matrix's owner in one `dist.all_to_all_single`, the owner runs Newton-Schulz once per matrix,
#    and a second `all_to_all_single` gives every rank its part of each result. Put your class in a
#    file (it runs after the listing, so it can subclass `FromScratchMuon`) and check it against the
#    engine's owner layout, on a grid that does not divide the buffer:
#    `python scripts/from_scratch.py --dp 3 --code mine.py --class MyMuon --layout owner`.
#    Does the choice of owners change any bit?

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
:::{admonition} Solutions
:class: dropdown

1. One, DP rank {{ch5-ex1-which}}. A rank keeps a piece of `w1` only where its shard
   overlaps `w1`'s `global_range`; with `dp = 3` and one bucket, `w1` lies inside the first
   shard, so the other two ranks keep nothing of it (chapter 4's explorer shows the shards for
   any `dp`).
2. With one group the stale list *is* the right list, so the check passes: the bug is invisible.
   A test of a distributed optimizer must use several parameter groups (and shapes), or it tests
   less than the code does.
3. Only the straddling matrices need a gather, and only among the ranks that share them: on the
   2 x 2 grid traced above, {{ch5-ex3-straddlers}} bytes per rank on average instead of
   the {{ch5-ex3-whole}} of the whole-bucket DP gather (`dp_gather_bytes(...,
   "straddlers")`, which chapter 6 derives).
4. One way, [`scripts/from_scratch_owner.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/from_scratch_owner.py) (the
   chapter ran it on 2 x 1 and 3 x 1, {{ch5-owner-steps}} steps each: equal to
   `DistributedMuon(layout="owner")` bit for bit on both). The owners do not change a bit: on
   3 x 1 the engine, which balances the Newton-Schulz work, gives {{ch5-owner-other}} of the
   {{ch5-owner-all}} matrices another owner than `i % dp`, and the parameters are the same,
   since every owner runs the same Newton-Schulz on the same whole bf16 matrix and the other
   stages are elementwise.

```python
{{ch5-owner-code}}
```
:::
""")

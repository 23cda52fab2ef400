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
# # 16. Other distributed Muon implementations, and how they differ
#
# ```{admonition} What this chapter runs
# One 4-rank check of two layouts ([`scripts/verify.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/verify.py)), for its
# communication ledger, and arithmetic: the ZeRO-1 plan and closed forms of the earlier chapters
# for Llama-3-8B's matrices, beside the other implementations' formulas
# ([`muongrid/lab/rivals.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/lab/rivals.py)). About twenty seconds on
# two idle cores, most of it the 4-rank run.
# Reading: about 20 minutes, plus running it. Read first: {doc}`chapter 8 <08_beyond_poc>`.
# ```
#
# This book's package was called `dmuon` until version 0.4.0. X-Square-Robot publishes a
# distributed Muon under the same name {cite:p}`chen2026dmuon`, so ours is now `muongrid`, and
# this page says how the projects that distribute Muon differ: Moonshot's proof of concept
# {cite:p}`moonshot2025moonlight`, X-Square's DMuon, torchtitan's `DistMuon`
# {cite:p}`liang2024torchtitan`, Megatron-LM's layer-wise optimizer
# {cite:p}`nvidia2025megatronlayerwise` with NVIDIA's Emerging-Optimizers
# {cite:p}`nvidia2025emergingoptimizers`, and Microsoft's Dion repository {cite:p}`ahn2025dion`.
# Each was read in its own code, at the commit named below; what we could not check there is
# said as such. Their communication formulas are then set beside this book's ledger and cost
# model, for the same matrices on the same number of ranks.
#
# **Learning goals.** After this chapter you can
#
# - say, for each implementation, where Newton-Schulz runs, what crosses the network in a step,
#   how tensor parallelism is handled, how checkpoints are written and how it is tested;
# - turn a published per-step communication formula into elements per rank and check it against
#   a ledger of what moved;
# - place muongrid's layouts (bucket, owner, aligned, group) and `FSDPMuon` among them.

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
# ## The field at a glance
#
# Every implementation must give Newton-Schulz a whole matrix (or a whole Gram matrix), while the
# training system keeps the matrix cut into pieces. They differ in which rank does the work and
# how the pieces get there and back.
#
# | implementation | Newton-Schulz runs on | what moves for a Muon matrix, per step | tensor parallel |
# |---|---|---|---|
# | Moonshot's proof of concept | every rank, every matrix | ZeRO-1's reduce-scatter and all-gather, plus whole buckets gathered over DP | every TP rank gathers the matrix |
# | X-Square's DMuon 0.2.0 | one owner rank | the gradient reduced to the owner, the parameter broadcast from it | shards gathered to one TP owner, update scattered back |
# | torchtitan `DistMuon` | one owner, or a share of a batch of blocks | an all-to-all from FSDP2's shards to the owner and one back | storage layouts it can route (not checked for TP) |
# | Megatron-LM + Emerging-Optimizers | the DP rank that owns the matrix | reduce-scatter and all-gather in buckets cut on matrix boundaries | gather the matrix, or one Gram all-reduce per step |
# | Dion's `Muon` | one rank per matrix of a same-shape batch | an all-to-all per shape there and one back, zero-padded | not supported for Muon |
# | muongrid `DistributedMuon` | every rank (bucket), one owner (owner, aligned) or a group (group) | ZeRO-1's reduce-scatter and all-gather, plus pieces to owners and back | TP shards travel with the DP pieces |
# | muongrid `FSDPMuon` | one owner | FSDP2's own, plus one all-to-all each way | FSDP2 x TP |
#
# | implementation | checkpoints | tests |
# |---|---|---|
# | Moonshot's proof of concept | not read here | not read here; rebuilt and checked in this book's chapters 4-6 |
# | X-Square's DMuon 0.2.0 | a full state dict gathered to rank 0, `torch.save` | distributed tests on 2-8 GPUs (NCCL), by hand; CI builds the docs |
# | torchtitan `DistMuon` | DTensor state through DCP | need 2 or 4 CUDA devices |
# | Megatron-LM + Emerging-Optimizers | Megatron's sharded (distributed) checkpoints | Emerging-Optimizers: gloo, 4 and 8 processes, in CI; Megatron: CUDA |
# | Dion's `Muon` | DTensor state through DCP | CUDA (NCCL); no CI workflow in the repository |
# | muongrid (both) | DCP in global coordinates, any grid and layout | gloo on a CPU in CI, bit for bit against one process |
#
# ## Each one, read in its code
#
# ### Moonshot's proof of concept
#
# Moonshot's code {cite:p}`moonshot2025moonlight` (its README links the Megatron-LM pull request
# [#1428](https://github.com/NVIDIA/Megatron-LM/pull/1428), "a proof of concept for Distributed
# Muon", still open) is what {doc}`chapters 4 to 7 <04_zero1_buffer>` rebuild: ZeRO-1's
# flat buffer cut evenly over DP, every bucket all-gathered over DP in bf16 and every matrix over
# TP, Newton-Schulz on every matrix on every rank. muongrid's `layout="bucket"` is that flow, and
# the paper's bound of 1.25 x AdamW is exactly what it sends on a DP-only grid
# ({doc}`chapter 6 <06_communication>`). Its tests are not read here; the two bugs the community
# found in it have regression tests in this book ({doc}`chapter 5 <05_distributed_step>`).
#
# ### X-Square-Robot's DMuon 0.2.0
#
# Read at commit [f002f24](https://github.com/X-Square-Robot/dmuon/blob/f002f24a7e7397ae4b92ee6fd33fe62c75e9deb2/README.md) (6 August 2026, version 0.2.0, Apache-2.0), with its
# paper's abstract {cite:p}`chen2026dmuon`; the paper's full text was not available to us, so
# its formulas come from the repository's documentation.
#
# Checked in the code:
#
# - **One owner per matrix, beside FSDP2 rather than inside it.** `dedicate_params` marks the
#   Muon matrices and gives each an owner by a longest-processing-time rule over the whole model
#   (`dmuon/_core/partition.py`: a cost mixing Newton-Schulz FLOPs and size; matrices under 5 M
#   elements of one layer packed into one unit). Importing `dmuon` patches FSDP2's
#   `_get_managed_states` so that `fully_shard` leaves those matrices alone
#   ([architecture page](https://github.com/X-Square-Robot/dmuon/blob/f002f24a7e7397ae4b92ee6fd33fe62c75e9deb2/docs/design/architecture.md), section 6). The owner keeps the
#   matrix; DMuon's own layer hooks broadcast it before forward (and again before backward when
#   it was freed: the default `reshard_after_forward=True`, "DMuon-Z3") and reduce the gradient
#   to the owner after backward (`dist.reduce` with `ReduceOp.AVG`,
#   `dmuon/_backends/fsdp2/group.py`). The broadcast runs in the parameter's dtype, or in
#   `compute_dtype` when one is given; the reduce in the gradient's dtype unless a `grad_dtype`
#   policy says otherwise. A DDP backend (`dedicate_params_ddp`) does the same without FSDP2.
# - **Gram Newton-Schulz by default**: `Muon(..., ns_backend="gram")`, a Gram-space iteration
#   with restarts adapted from Dao-AILab's gram-newton-schulz (their `NOTICE`), with SYRK kernels
#   chosen per GPU; `"direct"` is the classic iteration.
# - **CUDA-graph replay of Newton-Schulz**, on by default (`dmuon/optim/ns_graph.py`: one graph per
#   input shape, captured on the second call; `DMUON_NS_CUDA_GRAPH=0` turns it off).
# - **Tensor parallelism**: a matrix split over TP is gathered to one TP owner (`dist.gather`),
#   orthogonalised whole and scattered back (`dist.scatter`), per
#   [their TP guide](https://github.com/X-Square-Robot/dmuon/blob/f002f24a7e7397ae4b92ee6fd33fe62c75e9deb2/docs/guides/tp-support.md); an option (`tp_distributed_gram`) runs a
#   distributed Gram iteration over the TP group instead.
# - **Checkpoints are gathered to rank 0**: `get_model_state_dict` and `get_optimizer_state_dict`
#   (`dmuon/checkpoint.py`, `rank0_only=True` by default) broadcast every owned matrix and its
#   momentum so that rank 0 holds the whole state, which the guide then writes with `torch.save`.
# - **Tests**: the unit tests of the partition and policies run on a CPU; the distributed tests
#   call `init_process_group("nccl")` (all but two) and are launched by hand with `torchrun` on 2,
#   4 or 8 GPUs (`dmuon/tests/README.md`). The only workflow in the repository builds the
#   documentation.
# - **Communication**: their [cost page](https://github.com/X-Square-Robot/dmuon/blob/f002f24a7e7397ae4b92ee6fd33fe62c75e9deb2/docs/reference/communication-cost.md) states, per
#   step and per rank, $2\frac{N-1}{N}P_M$ for the DDP backend and for DMuon-Z2,
#   $3\frac{N-1}{N}P_M$ for DMuon-Z3, $3$ or $4\frac{N-1}{N}P_M$ for FSDP2 with a Muon
#   that gathers every matrix, and an HSDP table ($P_M$: elements of the Muon matrices, $N$: the
#   shard group). The page says its byte-level NCCL trace check is still planned.
#
# Not checked: the paper's speed-ups (no GPU cluster here, no full text), the SYRK kernels, and
# whether their LPT reaches the bound it quotes on real models.
#
# ### torchtitan's `DistMuon`
#
# Read at commit [b5bcd76](https://github.com/pytorch/torchtitan/blob/b5bcd76c66d0acb1a08b176d9639425bc55e0b2a/torchtitan/distributed/flex_shard/README.md) (21 August 2026),
# `torchtitan/distributed/flex_shard/`. `build_dist_muon` takes DTensor parameters and, per
# parameter, a compute layout: `Owned` (the whole matrix on one rank, chosen per bucket by a
# longest-processing-time rule on an estimate of Newton-Schulz FLOPs, `dist_muon.py`) or
# `BlockShard` (a parameter that stacks many small matrices, such as heads or experts, shared out
# in whole blocks). Momentum is applied on the storage shards; the Newton-Schulz input travels to
# the compute layout and the result back by packed `all_to_all_single` calls, one pair per bucket,
# in buffers of the parameter's dtype (`_optimizer_reshard_runtime.py`); Newton-Schulz runs in
# bf16. The optimizer refuses anything but one CUDA device per process, so its tests need two or
# four CUDA devices (`skipUnless`). The compute layout is not saved; a checkpoint restores the
# DTensor state into an optimizer rebuilt with the same layouts (its README). Not checked: which
# tensor-parallel storage layouts it can route, and its speed.
#
# ### Megatron-LM and Emerging-Optimizers
#
# Read at Megatron-LM [d98e8a6](https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/core/optimizer/layer_wise_optimizer.py) (22 August
# 2026) and Emerging-Optimizers [fd77292](https://github.com/NVIDIA-NeMo/Emerging-Optimizers/blob/fd7729267109a8848709e9406bf19e53e970c3f4/emerging_optimizers/orthogonalized_optimizers/muon_utils.py).
# Megatron's `LayerWiseDistributedOptimizer` gives each DP rank whole matrices: its gradient
# buckets are cut so that no matrix crosses a shard boundary, matrices packed by a
# longest-processing-time rule on their Newton-Schulz cost with a cap on padding; gradients are
# reduce-scattered and the updated parameters all-gathered. Under TP, Emerging-Optimizers'
# `newton_schulz_tp` (used by Megatron's `TensorParallelMuon`) has two modes: "duplicated"
# all-gathers the matrix over TP and every TP rank orthogonalises it whole; "distributed" keeps
# the shards and all-reduces, at every step, the Gram matrix of the dimension that is not split
# (the function warns that splitting the short side wastes work). Megatron adds "blockwise",
# which orthogonalises each TP shard alone: a different update, not the same math. `split_qkv`
# orthogonalises Q, K and V separately. **QK-clip** (`megatron/core/optimizer/qk_clip.py`, run
# after `optimizer.step()` in training): each attention layer's per-head maximum logit is
# all-reduced (max) over the data-parallel group, and where a group of heads exceeds the
# threshold, its query and key rows are scaled down on each rank's TP share of heads, in the
# fp32 master and the model weight. Checkpoints go through Megatron's distributed checkpointing
# (`sharded_state_dict`). Emerging-Optimizers runs its distributed Newton-Schulz tests on a CPU
# with gloo, with 4 and 8 processes, in its CI (`L0_Tests_CPU.sh`); Megatron's layer-wise tests
# need CUDA. Not checked: padding in practice, and speed.
#
# ### Dion's `Muon` (microsoft/dion)
#
# Read at commit [0a059a4](https://github.com/microsoft/dion/blob/0a059a4542e5aa74b40dcd1dce363836c7afcd48/dion/megabatch_base.py) (7 August 2026). For FSDP2 models, its
# `Muon` puts every parameter of one shape in one batch ("megabatch"), pads the batch with zero
# matrices to a multiple of the world size and each rank's block to `ceil(rows / n)` rows, and
# runs one `all_to_all` there and one back per shape, in bf16: rank $j$ receives whole matrices
# $jk, \dots, jk + k - 1$ of the padded batch ($k = \lceil c / n \rceil$ of $c$ matrices) and
# orthogonalises them. Work is balanced by count, not FLOPs. Its README's table marks FSDP2 + TP
# as unsupported for Muon (only the older Dion supports it). Optimizer states are DTensors saved
# with DCP. Its tests that launch ranks need CUDA (NCCL), and the repository has no CI workflow.
# Not checked: the Triton kernels and speed.

# %% [markdown]
# ## Their formulas against our ledger
#
# Bytes per step are deterministic, so formulas can be checked exactly. The unit is **elements
# one rank sends per step, averaged over the ranks**: a ring all-gather or reduce-scatter of $P$
# elements over $N$ ranks has each rank send $\frac{N-1}{N}P$; a pipelined broadcast or reduce
# has $N-1$ of the $N$ ranks forward the tensor once, the same $\frac{N-1}{N}P$ on average. That
# is the convention of DMuon's page and of this book's ledger, so the two can be compared
# directly; dtypes come after.
#
# First on a grid this machine runs: `verify.py` on 4 ranks, owner and aligned layouts, one
# step, and each rank's ledger. DMuon's formula for its DDP backend (reduce to the owner,
# broadcast back) is $2\frac{N-1}{N}P_M$. ZeRO-1's reduce-scatter and all-gather move the
# same share of every element, but of the flat shards, padding included.

# %%
import math

from muongrid.lab.page import keep, listing, say, show

from muongrid.lab import choice, costmodel, rivals, scale
from muongrid.lab.notebook import last_json, run, table
from muongrid.lab.synthetic import build_problem

DP = 4
live = last_json(run(f"verify.py --dp {DP} --tp 1 --layout owner,aligned --steps 1",
                     log="collapsed"))
problem = build_problem("muon")  # what verify.py ran: the same matrices, in two groups
p_live = sum(r * c for g in problem.groups for r, c in g["shapes"])


def ledger_mean(layout: str, phase: str) -> float:
    """Bytes one rank sent in ``phase`` in the run's last step, mean over the ranks."""
    ranks = live["layouts"][layout]["ledger_per_rank"]
    sent = [r["phases"].get(phase, {}).get("bytes_sent", 0) for r in ranks]
    return sum(sent) / len(sent)


rows, same = [], {}
for layout in ("owner", "aligned"):
    plan = costmodel.plans_for(problem.groups, DP, 1, live["bucket_numel"], layout)[0]
    padded = DP * sum(b.shard_numel for buffer in plan.buckets for b in buffer)
    zero1 = (ledger_mean(layout, "grad_reduce_scatter") / costmodel.GRAD_BYTES
             + ledger_mean(layout, "param_all_gather") / costmodel.PARAM_BYTES)
    pieces = (ledger_mean(layout, "ns_to_owner")
              + ledger_mean(layout, "ns_from_owner")) / costmodel.NS_BYTES
    theirs = rivals.dmuon(padded, DP, "ddp")["total"]
    same[layout] = math.isclose(zero1, theirs, rel_tol=1e-12)
    rows.append([layout, p_live, padded, round(zero1), round(theirs),
                 round(rivals.dmuon(p_live, DP, "ddp")["total"]), round(pieces)])
table(["layout", "P_M", "in the shards", "ledger: RS + AG", "2(N-1)/N x shards",
       "2(N-1)/N x P_M", "ledger: to/from owners"], rows)
live_pad = {r[0]: r[2] / r[1] for r in rows}

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert live["ok"]
assert all(same.values()), f"the ledger's ZeRO-1 bytes differ from DMuon's formula: {same}"
keep("ch16-live-owner-pad", f"{live_pad['owner']:.3f}")
keep("ch16-live-aligned-pad", f"{live_pad['aligned']:.2f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
The ledger's reduce-scatter and all-gather equal DMuon's formula applied to what the shards hold
(the cell asserts it, for the mean over the ranks). The owner layout's even shards hold the
matrices' elements {{ch16-live-owner-pad}} times over (padding only rounds up to a
multiple of the ranks); the aligned layout's, cut on matrix boundaries,
{{ch16-live-aligned-pad}} times: five matrices of very different sizes cannot be split
into four equal runs of whole matrices, and every shard is padded to the largest. DMuon's
reduce and broadcast are one collective per owner, with no shard to pad; the owner layout pays
instead in pieces of matrices that cross a shard boundary, sent to their owner and back in bf16
(the last column). `tests/test_rivals.py` checks the same identity on other grids.
""")

# %% [markdown]
# ### A real model: Llama-3-8B's matrices on 8 and 64 ranks
#
# The same comparison for the 224 Muon matrices of Llama-3-8B (32 layers of q, k, v, o, gate,
# up and down; the shapes of [`muongrid/lab/model_shapes.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/lab/model_shapes.py)), on one
# node of 8 ranks and on 64, data parallel only. Our side comes from the plan and the closed form
# the ledger is tested against (`costmodel`; `scale.bytes_per_rank` for every rank at
# once), and for `FSDPMuon` from the routes it runs (`choice.fsdp2_extra`). FSDP2's own gathers
# and reduce-scatters are priced by their definition (`rivals.fsdp2`), the same for every
# FSDP2-based row. The rows marked "derived" are our reading of code that states no formula.

# %%
from muongrid.plan import DEFAULT_BUCKET_NUMEL, build_plan

from muongrid.lab.model_shapes import llama3_8b

mats = llama3_8b()[0][0]     # the Muon group (the other: embeddings, norms)
shapes = [m.full_shape for m in mats]
split_dims = [m.tp_split_dim for m in mats]
P = sum(r * c for r, c in shapes)
ONE_BUCKET = 2 * P                   # a bucket larger than every matrix together


def ours(n: int, t: int = 1, layout: str = "owner", bucket: int = DEFAULT_BUCKET_NUMEL):
    """Our ZeRO-1 closed form, mean over the n x t ranks: elements, and bytes."""
    if layout == "bucket":           # every rank sends the same: the costmodel form
        groups = [dict(shapes=shapes, tp_split_dims=split_dims, use_muon=True)]
        mean = costmodel.step_bytes(groups, n, t, bucket, layout="bucket")
    else:
        plan = build_plan([mats], n, 0, t, bucket_numel=bucket, layout=layout,
                          muon=[True])
        ranks = scale.bytes_per_rank(plan, [True])
        mean = {k: sum(r[k] for r in ranks) / len(ranks) for k in ranks[0]}
    zero1 = (mean["grad_reduce_scatter"] / costmodel.GRAD_BYTES
             + mean["param_all_gather"] / costmodel.PARAM_BYTES)
    ns = sum(mean.get(k, 0) for k in ("ns_gather_dp", "ns_gather_tp", "ns_to_owner",
                                      "ns_from_owner")) / costmodel.NS_BYTES
    return dict(zero1=zero1, ns=ns, elements=zero1 + ns, bytes=mean["total"])


def fsdp2_own(n: int) -> float:
    """FSDP2's forward and backward all-gathers and reduce-scatter (resharding)."""
    return sum(rivals.fsdp2(P, n).values())


NS = (8, 64)
mine = {n: dict(owner=ours(n), aligned=ours(n, layout="aligned"),
                aligned_one=ours(n, layout="aligned", bucket=ONE_BUCKET),
                bucket=ours(n, layout="bucket")) for n in NS}
fsdpmuon = {n: choice.fsdp2_extra(shapes, n)["extra_bytes_per_rank"]
            / costmodel.NS_BYTES for n in NS}
LINES = [  # (label, source, elements per rank per step for n)
    ("DMuon, DDP backend or Z2", "their page",
     lambda n: rivals.dmuon(P, n, "ddp")["total"]),
    ("muongrid ZeRO-1, owner", "closed form", lambda n: mine[n]["owner"]["elements"]),
    ("muongrid ZeRO-1, aligned", "closed form",
     lambda n: mine[n]["aligned"]["elements"]),
    ("... aligned, one bucket", "closed form",
     lambda n: mine[n]["aligned_one"]["elements"]),
    ("muongrid ZeRO-1, bucket (the PoC)", "closed form",
     lambda n: mine[n]["bucket"]["elements"]),
    ("DMuon-Z3 (default)", "their page", lambda n: rivals.dmuon(P, n, "z3")["total"]),
    ("FSDP2 + a Muon gathering all", "their page",
     lambda n: rivals.naive_fsdp2_muon(P, n)["total"]),
    ("FSDP2 + muongrid FSDPMuon", "FSDP2 + routes",
     lambda n: fsdp2_own(n) + fsdpmuon[n]),
    ("FSDP2 + torchtitan DistMuon", "derived",
     lambda n: fsdp2_own(n) + rivals.row_shard_owner_all_to_all(shapes, n)["total"]),
    ("FSDP2 + Dion's Muon", "derived",
     lambda n: fsdp2_own(n) + rivals.dion_megabatch(shapes, n)["total"]),
]
elements = {label: {n: f(n) for n in NS} for label, _, f in LINES}
FLOOR = "DMuon, DDP backend or Z2"
table(["per rank per step, x P_M", "from", *[f"N = {n}" for n in NS]],
      [[label, src, *[f"{elements[label][n] / P:.3f}" for n in NS]]
       for label, src, _ in LINES], align="llrr")
print(f"P_M = {P:,} elements in {len(shapes)} matrices; the default bucket holds "
      f"{DEFAULT_BUCKET_NUMEL:,} elements, smaller than every one of them")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# The page's statements about these rows, checked, and the figures it quotes.
for n in NS:
    share = (n - 1) / n
    # Even shards hold no padding here, so owner's RS + AG is DMuon's floor exactly.
    assert math.isclose(mine[n]["owner"]["zero1"], elements[FLOOR][n])
    assert mine[n]["aligned_one"]["zero1"] >= elements[FLOOR][n]
    # Every matrix is larger than a bucket: each is cut over all n ranks, and the owner
    # gets (n - 1) / n of it and sends it back: (n - 1) / n^2 per rank, each way.
    assert math.isclose(mine[n]["owner"]["ns"], 2 * share * P / n)
    assert math.isclose(fsdpmuon[n], mine[n]["owner"]["ns"])
    titan = rivals.row_shard_owner_all_to_all(shapes, n)["total"]
    assert math.isclose(titan, fsdpmuon[n])
# 8 ranks take 4 layers each: one bucket of whole matrices balances exactly
assert math.isclose(mine[8]["aligned_one"]["zero1"], elements[FLOOR][8])
keep("ch16-p", f"{P / 1e9:.2f} billion")
for n in NS:
    keep(f"ch16-owner-extra-{n}", f"{mine[n]['owner']['ns'] / P:.3f}")
    keep(f"ch16-aligned-{n}", f"{mine[n]['aligned']['elements'] / P:.1f}")
    pad = mine[n]["aligned_one"]["zero1"] / (2 * (n - 1) / n * P)
    keep(f"ch16-aligned-one-pad-{n}", f"{pad:.3f}")
dion64 = rivals.dion_megabatch(shapes, 64)
keep("ch16-dion-zeros-64", f"{dion64['padding'] / dion64['total']:.0%}")
gap = elements["FSDP2 + muongrid FSDPMuon"][8] - elements["DMuon-Z3 (default)"][8]
keep("ch16-z3-gap-8", f"{gap / P:.3f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
What the rows say, all for the same {{ch16-p}} elements:

- **DMuon's design is the floor of its family.** Reducing the gradient straight to its owner
  and broadcasting the result moves $2\frac{N-1}{N}P_M$, what a ring all-reduce moves: the
  least a scheme that leaves the whole parameter on every rank can move, as their page says. muongrid's owner layout moves that in its reduce-scatter
  and all-gather, and on top the pieces of each matrix that lie away from its owner:
  {{ch16-owner-extra-8}} $P_M$ on 8 ranks and {{ch16-owner-extra-64}} on 64.
  Every Llama matrix is larger than the default bucket ($2^{20}$ elements), so each is cut over
  all $N$ ranks and $\frac{N-1}{N}$ of it travels to its owner and back.
- **The aligned layout is the one that can reach that floor, but not with default buckets.** It
  cuts shards on matrix boundaries, so nothing travels for Newton-Schulz; but a matrix larger
  than a bucket then sits on one rank and every other rank's shard is padded to its size:
  {{ch16-aligned-8}} $P_M$ on 8 ranks, {{ch16-aligned-64}} on 64. With one
  bucket for all matrices the shards balance, to {{ch16-aligned-one-pad-8}} times the
  floor on 8 ranks and {{ch16-aligned-one-pad-64}} on 64 (224 matrices of three sizes do
  not split evenly 64 ways). This is Megatron's layer-wise design, which packs whole matrices into
  shards with a cap on the padding; DMuon's per-owner reduce has no padding at all.
- **Among the FSDP2 designs**, DMuon-Z3 replaces FSDP2's three collectives on the Muon matrices
  with three transfers of its own, and needs no optimizer-side gather: $3\frac{N-1}{N}P_M$.
  `FSDPMuon`, torchtitan's `Owned` and Dion's megabatch leave FSDP2 as it is and add an
  all-to-all there and back, $2\frac{N-1}{N^2}P_M$ ({{ch16-z3-gap-8}} $P_M$ on 8
  ranks): the same pieces in all three, since every Llama row count divides by 8 and 64. Dion
  pads its batches: on 64 ranks the 32 down projections are padded with 32 zero matrices, and
  {{ch16-dion-zeros-64}} of its all-to-all traffic is zeros.
""")


# %% [markdown]
# ### The same in bytes
#
# Elements become bytes through dtypes, and here the implementations differ as much as in design.
# muongrid's ZeRO-1 reduce-scatters gradients in the fp32 master dtype, all-gathers parameters in
# their own dtype (`DistributedMuon._all_gather_params`) and moves Newton-Schulz pieces in bf16.
# DMuon broadcasts in the parameter's dtype, or in the `compute_dtype` it is given, and reduces
# in the gradient's dtype (bf16 when the forward copy is bf16) unless a `grad_dtype` policy says
# fp32. FSDP2 is taken with the usual mixed precision (`param_dtype=bfloat16`,
# `reduce_dtype=float32`: bf16 gathers, fp32 reduce-scatter, fp32 shards); torchtitan's
# all-to-all buffers take the shards' dtype (fp32), Dion's and `FSDPMuon`'s travel in bf16.

# %%
def fsdp2_bytes(n: int) -> float:
    """FSDP2 with bf16 gathers and an fp32 reduce-scatter (resharding)."""
    f = rivals.fsdp2(P, n)
    return 2 * (f["forward_all_gather"] + f["backward_all_gather"]) \
        + 4 * f["backward_reduce_scatter"]


def dmuon_bytes(n: int, mode: str, param: int, grad: int) -> float:
    """DMuon's transfers: broadcasts of ``param`` bytes, reduces of ``grad`` bytes."""
    d = rivals.dmuon(P, n, mode)
    reduce = d.get("reduce_to_owner", 0) + d.get("backward_reduce", 0)
    return param * (d["total"] - reduce) + grad * reduce


def owner_bf16(n: int) -> float:
    """Our owner layout with bf16 parameters: fp32 reduce-scatter, bf16 all-gather."""
    o = mine[n]["owner"]
    return 4 * o["zero1"] / 2 + 2 * o["zero1"] / 2 + 2 * o["ns"]


BYTE_LINES = [  # (label, dtypes, bytes per rank per step for n)
    ("DMuon, DDP or Z2", "fp32", lambda n: dmuon_bytes(n, "ddp", 4, 4)),
    ("muongrid ZeRO-1, owner", "fp32 (closed form)",
     lambda n: mine[n]["owner"]["bytes"]),
    ("DMuon, DDP or Z2", "bf16, bf16 reduce", lambda n: dmuon_bytes(n, "ddp", 2, 2)),
    ("DMuon, DDP or Z2", "bf16, fp32 reduce", lambda n: dmuon_bytes(n, "ddp", 2, 4)),
    ("muongrid ZeRO-1, owner", "bf16, fp32 reduce", owner_bf16),
    ("DMuon-Z3", "bf16, bf16 reduce", lambda n: dmuon_bytes(n, "z3", 2, 2)),
    ("DMuon-Z3", "bf16, fp32 reduce", lambda n: dmuon_bytes(n, "z3", 2, 4)),
    ("FSDP2 + muongrid FSDPMuon", "FSDP2 mixed, bf16",
     lambda n: fsdp2_bytes(n) + 2 * fsdpmuon[n]),
    ("FSDP2 + torchtitan DistMuon", "FSDP2 mixed, fp32",
     lambda n: fsdp2_bytes(n)
     + 4 * rivals.row_shard_owner_all_to_all(shapes, n)["total"]),
    ("FSDP2 + Dion's Muon", "FSDP2 mixed, bf16",
     lambda n: fsdp2_bytes(n) + 2 * rivals.dion_megabatch(shapes, n)["total"]),
]
gb = {(label, dt): {n: f(n) / 1e9 for n in NS} for label, dt, f in BYTE_LINES}
table(["GB per rank per step", "parameters, gradients", *[f"N = {n}" for n in NS]],
      [[label, dt, *[f"{gb[label, dt][n]:.2f}" for n in NS]]
       for label, dt, _ in BYTE_LINES],
      align="llrr")
same_fp32 = (gb["muongrid ZeRO-1, owner", "fp32 (closed form)"][8]
             / gb["DMuon, DDP or Z2", "fp32"][8])
same_bf16 = (gb["muongrid ZeRO-1, owner", "bf16, fp32 reduce"][8]
             / gb["DMuon, DDP or Z2", "bf16, fp32 reduce"][8])
bf16_reduce = (gb["DMuon, DDP or Z2", "bf16, bf16 reduce"][8]
               / gb["DMuon, DDP or Z2", "bf16, fp32 reduce"][8])

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert same_fp32 > 1 and same_bf16 > 1 and bf16_reduce < 1
keep("ch16-bytes-fp32", f"{same_fp32:.3f}")
keep("ch16-bytes-bf16", f"{same_bf16:.3f}")
keep("ch16-bytes-bf16-reduce", f"{1 - bf16_reduce:.0%}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
With the same dtypes on both sides, muongrid's owner layout sends {{ch16-bytes-fp32}}
times DMuon's bytes on 8 ranks with fp32 parameters and {{ch16-bytes-bf16}} times with
bf16 parameters (the pieces sent to owners). DMuon's default with a bf16 forward copy also
reduces gradients in bf16, {{ch16-bytes-bf16-reduce}} fewer bytes than with an fp32
reduce: a precision choice (summing N bf16 gradients), not a saving of the design, and one that
muongrid does not make. Under FSDP2, the all-to-all's dtype separates the three that share a
design: torchtitan's fp32 buffers send twice the bytes of the bf16 ones for the same pieces.
""")

# %% [markdown]
# ### HSDP: the page's table and the algorithm
#
# DMuon's HSDP mode adds a replicate axis of $R$ copies of the shard group (one per node, say):
# each matrix's gradient is reduced inside the owner's row, then across the $R$ rows within the
# owner's shard column; after the step the owner broadcasts it back along that column. Their
# page writes $\frac{R-1}{R}P_M$ per rank for each of the two replicate phases. But only one
# rank in $N$ of each row is in a given matrix's shard column, so averaged over all $NR$ ranks the
# two phases move $\frac{R-1}{NR}P_M$ each. The check: with that, HSDP moves exactly what one
# flat reduce and broadcast over $NR$ ranks would, as it must (both move every element to one
# owner and back), and what our ZeRO-1 reduce-scatter and all-gather move on $NR$ ranks.

# %%
N8, R8 = 8, 8
page = rivals.dmuon(P, N8, "z2", replicate=R8, as_documented=True)
derived = rivals.dmuon(P, N8, "z2", replicate=R8)
flat = ours(N8 * R8)["zero1"]


def replicate(d: dict) -> str:
    return f"{(d['replicate_reduce'] + d['replicate_broadcast']) / P:.3f}"


table(["8 shards x 8 replicas, x P_M", "replicate phases", "total"],
      [["DMuon's page", replicate(page), f"{page['total'] / P:.3f}"],
       ["DMuon, averaged over the 64 ranks", replicate(derived),
        f"{derived['total'] / P:.3f}"],
       ["muongrid ZeRO-1 RS + AG, 64 DP ranks", "", f"{flat / P:.3f}"]], align="lrr")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert math.isclose(derived["total"], rivals.dmuon(P, N8 * R8, "ddp")["total"])
assert math.isclose(derived["total"], flat)  # rows divide by 64: ZeRO-1 has no padding

# %% [markdown]
# We read the page's figure as the traffic of a rank that takes part for every matrix, an upper
# bound rather than a mean; the repository's own byte-level check of HSDP is still to come, so
# this is our derivation from the algorithm as the architecture page describes it, stated here so
# that it can be checked.
#
# ### With tensor parallelism: 8 DP x 8 TP
#
# On 64 ranks as 8 x 8, each matrix is split over TP (q, k, v, gate and up by rows, o and down by
# columns). DMuon dedicates each TP shard over DP and gathers a matrix's shards to one TP owner
# (derived from its TP guide); Megatron's layer-wise optimizer gives the matrix to one DP rank,
# whose TP group either gathers it whole on every member or all-reduces a Gram matrix at every
# Newton-Schulz step (derived from `newton_schulz_tp`); muongrid's owner layout sends the TP
# shards to the owner in the same all-to-all as the DP pieces (closed form).

# %%
N, T = 8, 8
tp_rows = [
    ("DMuon-Z2 x TP", "derived", rivals.dmuon_tp(P, N, T, "z2")["total"]),
    ("Megatron, duplicated", "derived",
     rivals.megatron_tp(shapes, N, T, split_dims, "duplicated")["total"]),
    ("Megatron, distributed", "derived",
     rivals.megatron_tp(shapes, N, T, split_dims, "distributed")["total"]),
    ("muongrid ZeRO-1 x TP, owner", "closed form", ours(N, T)["elements"]),
]
table(["8 x 8, per rank per step, x P_M", "from", "elements"],
      [[label, src, f"{v / P:.3f}"] for label, src, v in tp_rows], align="llr")
tp = {label: v for label, _, v in tp_rows}

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
keep("ch16-tp-gram-ratio",
     f"{tp['Megatron, distributed'] / tp['Megatron, duplicated']:.1f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
Under TP every design moves the DP share of each TP rank's $P_M/T$, and they differ in how a
matrix is made whole. Gathering it to one rank (DMuon, muongrid) costs least; gathering it on
every member of the owner's TP group (Megatron's "duplicated") more; the Gram all-reduce
(Megatron's "distributed") {{ch16-tp-gram-ratio}} times the duplicated total here,
because a Llama matrix's Gram over its unsplit 4,096-wide side, five times, is larger than the
matrix. That mode saves memory and idle TP ranks, not bytes.
""")

# %% [markdown]
# ## How muongrid's layouts compare
#
# - **`bucket`** is Moonshot's proof of concept: every rank gathers and orthogonalises everything.
#   It is kept to reproduce the paper's numbers ({doc}`chapter 6 <06_communication>`).
# - **`owner`** shares DMuon's principle, one owner per matrix balanced by a
#   longest-processing-time rule, but on top of ZeRO-1's even flat shards instead of beside FSDP2. It pays the pieces that cross
#   shard boundaries twice, in bf16; DMuon reduces the gradient straight to the owner and pays
#   nothing extra in elements, but its broadcast and reduce run one collective per owner and layer.
# - **`aligned`** has the idea of Megatron's layer-wise optimizer: shards on matrix boundaries. It reaches the
#   floor only when its buckets hold many matrices; with matrices larger than a bucket it pads
#   badly (the table above), so on such models use `owner`, or buckets larger than the matrices.
# - **`group`** has no counterpart in the others for a matrix on ZeRO-1: the nearest are
#   Megatron's "distributed" mode and DMuon's optional TP Gram, both over the TP group the matrix
#   is split over; muongrid picks a group of any ranks when one matrix holds more than its share
#   of the work ({doc}`chapter 15 <15_muon_at_scale>`).
# - **`FSDPMuon`** is the design torchtitan's `Owned` and Dion's megabatch share: FSDP2 unchanged,
#   one all-to-all there and back. Ours sends bf16 (torchtitan: the parameter's dtype), balances
#   owners by Newton-Schulz FLOPs over all matrices (Dion: by count per shape, with zero padding)
#   and supports FSDP2 x TP (Dion's Muon does not).
#
# What muongrid offers that we did not find in the others' repositories: every layout's step
# checked bit for bit against one process on CPU grids in CI, checkpoints that load on any grid
# and layout, and a ledger held to a closed form. What they have and muongrid does not: DMuon's
# CUDA-graph and SYRK Newton-Schulz and its HSDP scheduling; torchtitan's per-head and
# per-expert blocks; Megatron's QK-clip in the training loop and its pipeline parallelism;
# Dion's low-rank optimizers and Triton kernels.
#
# ## Summary

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
- Five other projects distribute Muon; all but Moonshot's proof of concept give each matrix one
  owner over data parallelism. They differ in how the pieces reach it: a reduce and a broadcast
  (DMuon), ZeRO-1 shards cut on matrix boundaries (Megatron), or an all-to-all next to FSDP2
  (torchtitan, Dion, muongrid's `FSDPMuon`).
- DMuon's stated formulas hold as mean elements per rank for one shard group: our ledger's
  reduce-scatter and all-gather equal its $2\frac{N-1}{N}$ on the elements our shards hold.
  Its HSDP table counts each replicate phase $N$ times over the mean.
- For Llama-3-8B on 8 and 64 ranks, muongrid's owner layout moves {{ch16-owner-extra-8}}
  and {{ch16-owner-extra-64}} $P_M$ per rank more than DMuon's floor; with matrices
  larger than a bucket the aligned layout pads far more. In bytes, dtypes (a bf16 gradient
  reduce, an fp32 all-to-all) move the totals as much as the designs do.
- The numbers on this page come from `muongrid.lab.rivals` (their formulas, derived where they
  state none), the plan and the closed form; the commits read are named in each section.
""")

# %% [markdown]
# ## Exercises
#
# Each is a call to `muongrid.lab.rivals` or to `ours(...)` above.
#
# 1. On how many DP ranks does DMuon-Z3 first move more than twice $P_M$ per rank, and what does
#    muongrid's ZeRO-1 owner layout move there?
# 2. Give Dion 48 ranks instead of 64. How much of its all-to-all traffic is zeros, and why?
# 3. For an 8 x 8 grid, how many more elements per rank does muongrid's owner layout move than
#    DMuon-Z2 x TP, and where does the difference come from?

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# The answers to the exercises, computed here and checked against the solutions.
first = next(n for n in range(2, 100) if rivals.dmuon(P, n, "z3")["total"] > 2 * P)
assert first == 4
keep("ch16-ex1-n", first)
keep("ch16-ex1-owner", f"{ours(first)['elements'] / P:.3f}")
d48 = rivals.dion_megabatch(shapes, 48)
assert d48["padding"] > 0 and 14336 % 48
keep("ch16-ex2-zeros", f"{d48['padding'] / d48['total']:.0%}")
diff = (ours(N, T)["elements"] - rivals.dmuon_tp(P, N, T, "z2")["total"]) / P
assert math.isclose(ours(N, T)["zero1"], rivals.dmuon_tp(P, N, T, "z2")["total"]
                    - 2 * (T - 1) / (N * T * T) * P)  # the same DP share
assert math.isclose(diff, 2 / (N * T) * ((N * T - 1) / (N * T) - (T - 1) / T))
keep("ch16-ex3-diff", f"{diff:.3f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
:::{admonition} Solutions
:class: dropdown

1. On {{ch16-ex1-n}} ranks ($3\frac{N-1}{N} > 2$ from $N = 4$); the owner layout moves
   {{ch16-ex1-owner}} $P_M$ there.
2. {{ch16-ex2-zeros}}: 48 divides neither 64 nor 32, so each shape's batch is padded
   with zero matrices to 96 or 48, and no row count of Llama's (1,024, 4,096, 14,336) divides
   by 48, so every block is padded with zero rows too.
3. {{ch16-ex3-diff}} $P_M$. Both move the same DP share of every element. DMuon's
   reduce already leaves each TP shard whole on its DP owner, so only the $\frac{T-1}{T}$ of the
   matrix held by the other TP shards' owners travels. Our reduce-scatter leaves each TP shard
   spread over the 8 DP ranks (every matrix is larger than a bucket), so the owner collects
   $\frac{NT-1}{NT}$ of the matrix from all 64 ranks, and sends it back.
:::
""")

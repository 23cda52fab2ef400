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
# One 4-rank check of two layouts ([`scripts/verify.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/verify.py)) for its
# communication ledger, and arithmetic: the ZeRO-1 plan and closed forms for Llama-3-8B's
# matrices beside the other implementations' formulas
# ([`muongrid/lab/rivals.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/lab/rivals.py)). About twenty seconds on two idle cores.
# Reading: about 35 minutes at 200 words, 8 lines of code or one figure a minute, plus running it. Read first: {doc}`chapter 8 <08_beyond_poc>`.
# ```
#
# This page compares the projects that distribute Muon: Moonshot's proof of concept
# {cite:p}`moonshot2025moonlight`, X-Square-Robot's DMuon {cite:p}`chen2026dmuon` (whose name this
# book's package bore until version 0.4.0; ours is now `muongrid`), torchtitan's `DistMuon`
# {cite:p}`liang2024torchtitan`, Megatron-LM's layer-wise optimizer
# {cite:p}`nvidia2025megatronlayerwise` with NVIDIA's Emerging-Optimizers
# {cite:p}`nvidia2025emergingoptimizers`, and Microsoft's Dion {cite:p}`ahn2025dion`. Each was
# read in its own code, at the commit named below; what we could not check there is said. Their
# communication formulas are then set beside this book's ledger, for the same matrices and ranks.
#
# **Learning goals.** After this chapter you can
#
# - say, for each implementation, where Newton-Schulz runs, what crosses the network in a step,
#   and how it handles tensor parallelism, checkpoints and tests;
# - turn a published communication formula into elements per rank and check it against a ledger;
# - place muongrid's layouts and `FSDPMuon` among them.

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
# how the pieces travel.
#
# | implementation | Newton-Schulz runs on | what moves for a Muon matrix, per step | tensor parallel |
# |---|---|---|---|
# | Moonshot's proof of concept | every rank, every matrix | ZeRO-1's reduce-scatter and all-gather, plus whole buckets gathered over DP | every TP rank gathers the matrix |
# | X-Square's DMuon 0.2.0 | one owner rank | the gradient reduced to the owner, the parameter broadcast from it | shards gathered to one TP owner, update scattered back |
# | torchtitan `DistMuon` | one owner, or a share of a stack of blocks | an all-to-all from FSDP2's shards to the owner and back | not checked |
# | Megatron-LM + Emerging-Optimizers | the DP rank that owns the matrix | reduce-scatter and all-gather in buckets cut on matrix boundaries | gather the matrix, or one Gram all-reduce per step |
# | Dion's `Muon` | one rank per matrix of a same-shape batch | an all-to-all per shape there and one back, zero-padded | not supported for Muon |
# | muongrid `DistributedMuon` | every rank (bucket), one owner (owner, aligned) or a group (group) | ZeRO-1's reduce-scatter and all-gather, plus pieces to owners and back | TP shards travel with the DP pieces |
# | muongrid `FSDPMuon` | one owner | FSDP2's own, plus one all-to-all each way | FSDP2 x TP |
#
# | implementation | checkpoints | tests |
# |---|---|---|
# | Moonshot's proof of concept | not read here | not read here; rebuilt and checked in chapters 4-7 |
# | X-Square's DMuon 0.2.0 | gathered to rank 0, `torch.save` | on 2-8 GPUs, by hand; CI builds the docs |
# | torchtitan `DistMuon` | DTensor state through DCP | need 2 or 4 CUDA devices |
# | Megatron-LM + Emerging-Optimizers | Megatron's distributed checkpoints | Emerging-Optimizers: gloo, 4 and 8 processes, in CI; Megatron: CUDA |
# | Dion's `Muon` | DTensor state through DCP | CUDA; no CI workflow |
# | muongrid (both) | DCP in global coordinates, any grid and layout | gloo on a CPU in CI, bit for bit against one process |
#
# ## Each one, read in its code
#
# ### Moonshot's proof of concept
#
# Moonshot's code {cite:p}`moonshot2025moonlight` (Megatron-LM pull request
# [#1428](https://github.com/NVIDIA/Megatron-LM/pull/1428), still open) is what
# {doc}`chapters 4 to 7 <04_zero1_buffer>` rebuild: muongrid's `layout="bucket"` is its flow, and
# the paper's 1.25 x AdamW is exactly what it sends on a DP-only grid
# ({doc}`chapter 6 <06_communication>`). The two bugs the community found in it have regression
# tests here ({doc}`chapter 5 <05_distributed_step>`).
#
# ### X-Square-Robot's DMuon 0.2.0
#
# Read at commit [f002f24](https://github.com/X-Square-Robot/dmuon/blob/f002f24a7e7397ae4b92ee6fd33fe62c75e9deb2/README.md) (6 August 2026, Apache-2.0), with its
# paper's abstract {cite:p}`chen2026dmuon` (the full text was not available to us).
#
# - **One owner per matrix, beside FSDP2.** `dedicate_params` gives each Muon matrix an owner by a
#   longest-processing-time rule (`dmuon/_core/partition.py`); importing `dmuon` patches FSDP2 so
#   that `fully_shard` leaves those matrices alone
#   ([architecture page](https://github.com/X-Square-Robot/dmuon/blob/f002f24a7e7397ae4b92ee6fd33fe62c75e9deb2/docs/design/architecture.md), section 6). Its layer
#   hooks broadcast each matrix from its owner before forward (and before backward: "DMuon-Z3",
#   the default) and reduce its gradient to the owner after backward (`dist.reduce`). A DDP
#   backend does the same without FSDP2.
# - **Newton-Schulz**: a Gram-space iteration by default (`ns_backend="gram"`), with SYRK kernels
#   and CUDA-graph replay (`dmuon/optim/ns_graph.py`).
# - **Tensor parallelism**: a TP-split matrix is gathered to one TP owner and scattered back
#   ([their TP guide](https://github.com/X-Square-Robot/dmuon/blob/f002f24a7e7397ae4b92ee6fd33fe62c75e9deb2/docs/guides/tp-support.md)), or (`tp_distributed_gram`)
#   orthogonalised by a Gram iteration over the TP group.
# - **Communication**: their [cost page](https://github.com/X-Square-Robot/dmuon/blob/f002f24a7e7397ae4b92ee6fd33fe62c75e9deb2/docs/reference/communication-cost.md) states, per
#   step and per rank, $2\frac{N-1}{N}P_M$ for the DDP backend and for DMuon-Z2,
#   $3\frac{N-1}{N}P_M$ for DMuon-Z3, $3$ or $4\frac{N-1}{N}P_M$ for FSDP2 with a Muon
#   that gathers every matrix, and an HSDP table ($P_M$: elements of the Muon matrices, $N$: the
#   shard group); a byte-level check is still planned. Not checked here: the paper's speed-ups,
#   the kernels, and how well the partition balances real models.
#
# ### torchtitan's `DistMuon`
#
# Read at commit [b5bcd76](https://github.com/pytorch/torchtitan/blob/b5bcd76c66d0acb1a08b176d9639425bc55e0b2a/torchtitan/distributed/flex_shard/README.md) (21 August 2026),
# `torchtitan/distributed/flex_shard/`. Each DTensor parameter gets a compute layout: `Owned`
# (the whole matrix on one rank, chosen per bucket by a longest-processing-time rule on FLOPs) or
# `BlockShard` (a stack of small matrices, such as heads or experts, shared out in whole blocks).
# Momentum is applied on the storage shards; the Newton-Schulz input travels to the compute
# layout and back by `all_to_all_single`, one pair per bucket, in the parameter's dtype. Not
# checked: which tensor-parallel layouts it can route, and its speed.
#
# ### Megatron-LM and Emerging-Optimizers
#
# Read at Megatron-LM [d98e8a6](https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/core/optimizer/layer_wise_optimizer.py) (22 August
# 2026) and Emerging-Optimizers [fd77292](https://github.com/NVIDIA-NeMo/Emerging-Optimizers/blob/fd7729267109a8848709e9406bf19e53e970c3f4/emerging_optimizers/orthogonalized_optimizers/muon_utils.py).
# Megatron's `LayerWiseDistributedOptimizer` gives each DP rank whole matrices: gradient buckets
# are cut on matrix boundaries, packed by a longest-processing-time rule with a cap on padding;
# gradients are reduce-scattered and parameters all-gathered. Under TP, `newton_schulz_tp` has
# two modes: "duplicated" all-gathers the matrix over TP and every TP rank orthogonalises it;
# "distributed" keeps the shards and all-reduces, every step, the Gram of the unsplit dimension.
# Megatron's "blockwise" orthogonalises each TP shard alone: a different update. Its QK-clip
# ({doc}`chapter 9 <09_training>`) all-reduces per-head maximum logits over DP. Not checked:
# padding in practice, and speed.
#
# ### Dion's `Muon` (microsoft/dion)
#
# Read at commit [0a059a4](https://github.com/microsoft/dion/blob/0a059a4542e5aa74b40dcd1dce363836c7afcd48/dion/megabatch_base.py) (7 August 2026). For FSDP2 models its
# `Muon` puts every parameter of one shape in one "megabatch", pads it with zero matrices to a
# multiple of the world size and each rank's block to `ceil(rows / n)` rows, and runs one bf16
# `all_to_all` there and one back per shape: rank $j$ orthogonalises whole matrices
# $jk, \dots, jk + k - 1$ ($k = \lceil c / n \rceil$ of $c$). Work is balanced by count, not
# FLOPs; FSDP2 + TP is unsupported for Muon. Not checked: the Triton kernels and speed.

# %% [markdown]
# ## Their formulas against our ledger
#
# Bytes per step are deterministic, so formulas can be checked exactly. The unit is **elements
# one rank sends per step, averaged over the ranks**: in a ring all-gather or reduce-scatter of $P$
# elements over $N$ ranks each rank sends $\frac{N-1}{N}P$; in a pipelined broadcast or reduce
# $N-1$ of the $N$ ranks forward it once, the same on average. DMuon's page and this book's ledger
# both count this way.
#
# First on a grid this machine runs: `verify.py` on 4 ranks, owner and aligned layouts, one step,
# against DMuon's DDP formula (reduce to the owner, broadcast back), $2\frac{N-1}{N}P_M$.

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
The ledger's reduce-scatter and all-gather equal DMuon's formula applied to what the shards hold,
padding included (the cell asserts it, for the mean over the ranks). The owner layout's even
shards hold the matrices' elements {{ch16-live-owner-pad}} times over; the aligned
layout's {{ch16-live-aligned-pad}} times: five matrices of very different sizes cannot
make four equal runs, so every shard is padded to the largest. On top, the owner layout sends
the pieces that cross a shard boundary to their owner and back in bf16 (the last column).
`tests/test_rivals.py` checks the identity on other grids.
""")

# %% [markdown]
# ### A real model: Llama-3-8B's matrices on 8 and 64 ranks
#
# The same for Llama-3-8B's 224 Muon matrices ([`muongrid/lab/model_shapes.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/lab/model_shapes.py)), data parallel only, on 8 and
# 64 ranks. Our side comes from the plan and the closed form the ledger is tested against, and for
# `FSDPMuon` from its routes (`choice.fsdp2_extra`); FSDP2's own collectives are priced by
# definition (`rivals.fsdp2`). Rows marked "derived" are our reading of code that states no
# formula.

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
The rows, all for the same {{ch16-p}} elements:

- **DMuon's design is the floor of its family.** Reducing the gradient to its owner and
  broadcasting the result moves $2\frac{N-1}{N}P_M$, what a ring all-reduce moves: the least
  for a scheme that leaves the whole parameter on every rank. muongrid's owner layout moves that
  plus the pieces of each matrix away from its owner: {{ch16-owner-extra-8}} $P_M$ more
  on 8 ranks and {{ch16-owner-extra-64}} on 64, since every Llama matrix is larger than a
  bucket ($2^{20}$ elements) and so cut over all $N$ ranks.
- **The aligned layout can reach that floor, but not with default buckets**: a matrix larger
  than a bucket sits on one rank and every other shard is padded to its size
  ({{ch16-aligned-8}} $P_M$ on 8 ranks, {{ch16-aligned-64}} on 64). With one
  bucket for all matrices the shards balance, to {{ch16-aligned-one-pad-8}} times the
  floor on 8 ranks and {{ch16-aligned-one-pad-64}} on 64 (224 matrices of three sizes do
  not split evenly 64 ways). Megatron's layer-wise design caps this padding.
- **Among the FSDP2 designs**, DMuon-Z3 replaces FSDP2's three collectives on the Muon matrices
  with three of its own: $3\frac{N-1}{N}P_M$. `FSDPMuon`, torchtitan's `Owned` and Dion's
  megabatch keep FSDP2's and add an all-to-all there and back, $2\frac{N-1}{N^2}P_M$
  ({{ch16-z3-gap-8}} $P_M$ on 8 ranks), the same pieces in all three since every Llama
  row count divides by 8 and 64. Dion pads its batches: on 64 ranks the 32 down projections get
  32 zero matrices, and {{ch16-dion-zeros-64}} of its all-to-all traffic is zeros.
""")


# %% [markdown]
# ### The same in bytes
#
# Elements become bytes through dtypes, where the implementations differ as much as in design.
# muongrid's ZeRO-1 reduce-scatters gradients in fp32, all-gathers parameters in their own dtype
# and moves Newton-Schulz pieces in bf16. DMuon broadcasts in the parameter's dtype (or a given
# `compute_dtype`) and reduces in the gradient's, bf16 with a bf16 forward copy, unless a
# `grad_dtype` policy says fp32. FSDP2 is taken with bf16 gathers and an fp32 reduce-scatter;
# torchtitan's all-to-all travels in fp32, Dion's and `FSDPMuon`'s in bf16.

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
bf16 parameters. With a bf16 forward copy DMuon reduces gradients in bf16 by default,
{{ch16-bytes-bf16-reduce}} fewer bytes than in fp32: a precision choice (summing N bf16
gradients) that muongrid does not make, not a saving of the design. Under FSDP2, torchtitan's
fp32 all-to-all sends twice the bytes of the bf16 ones.
""")

# %% [markdown]
# ### HSDP: the page's table and the algorithm
#
# DMuon's HSDP mode adds $R$ replicas of the shard group: a matrix's gradient
# is reduced in the owner's row, then across the $R$ rows in the owner's column, and the result is
# broadcast back along that column. Their page writes $\frac{R-1}{R}P_M$ per rank for each
# replicate phase. But only one rank in $N$ of each row is in a given matrix's column, so averaged
# over all $NR$ ranks each phase moves $\frac{R-1}{NR}P_M$. The check: HSDP then moves exactly
# what one flat reduce and broadcast over $NR$ ranks would, as it must, and what our ZeRO-1
# collectives move on $NR$ ranks.

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
# bound rather than a mean. This is our derivation; their byte-level check of HSDP is still to
# come.
#
# ### With tensor parallelism: 8 DP x 8 TP
#
# On 8 x 8 each matrix is split over TP (q, k, v, gate and up by rows, o and down by columns). The
# rows for DMuon and Megatron are derived from their code as read above; muongrid's owner layout
# sends the TP shards to the owner in the same all-to-all as the DP pieces (closed form).

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
Under TP every design moves the DP share of each TP rank's $P_M/T$; they differ in how a matrix
is made whole. Gathering it to one rank (DMuon, muongrid) costs least, gathering it on every
member of the TP group (Megatron's "duplicated") more, and the Gram all-reduce ("distributed")
{{ch16-tp-gram-ratio}} times the duplicated total: five 4,096-wide Grams are larger than
a Llama matrix. That mode saves memory and idle TP ranks, not bytes.
""")

# %% [markdown]
# ## How muongrid's layouts compare
#
# `bucket` is Moonshot's proof of concept. `owner` is DMuon's principle on ZeRO-1's even flat
# shards: it pays, twice and in bf16, the pieces that cross shard boundaries, where DMuon pays
# nothing extra in elements but runs one collective per owner and layer. `aligned` is Megatron's
# idea; with matrices larger than a bucket it pads badly, so use `owner` or larger buckets there.
# `group` has no counterpart on ZeRO-1 (the nearest, Megatron's "distributed" mode and DMuon's TP
# Gram, work over the TP group). `FSDPMuon` is the design of torchtitan's `Owned` and Dion's
# megabatch, in bf16, balanced by FLOPs, with FSDP2 x TP.
#
# Not found in the others' repositories: every layout checked bit for bit against one process on
# CPU grids in CI, checkpoints that load on any grid and layout, and a ledger held to a closed
# form. Not in muongrid: DMuon's CUDA-graph and SYRK Newton-Schulz and its HSDP; torchtitan's
# per-head and per-expert blocks; Megatron's QK-clip in the loop and pipeline parallelism; Dion's
# low-rank optimizers and Triton kernels.
#
# ## Summary

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
- All but Moonshot's proof of concept give each matrix one owner over data parallelism, reached
  by a reduce and a broadcast (DMuon), shards cut on matrix boundaries (Megatron), or an
  all-to-all beside FSDP2 (torchtitan, Dion, `FSDPMuon`).
- DMuon's formulas hold as mean elements per rank for one shard group; its HSDP table counts
  each replicate phase $N$ times over the mean.
- For Llama-3-8B on 8 and 64 ranks the owner layout moves {{ch16-owner-extra-8}} and
  {{ch16-owner-extra-64}} $P_M$ per rank above DMuon's floor; in bytes, dtypes move the
  totals as much as the designs do.
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

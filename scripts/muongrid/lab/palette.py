"""One colour per quantity, for every figure of the book.

A reader who has learnt in chapter 7 that Newton-Schulz is red should find it red in chapter 9, and
Muon should be the same orange in a bar chart, a line plot and an explorer. So the figures take their
colours from here, by the name of the quantity, and never write a colour of their own
(``tests/test_palette.py`` greps the plotting code for that). matplotlib and Plotly both take these
hex strings.

    from muongrid.lab import palette
    ax.plot(x, y, color=palette.OPTIMIZER["muon"])

The families (a quantity keeps its colour in every figure; two families may share a hue, since no
figure shows both):

- ``OPTIMIZER``: Muon orange, AdamW blue, as in the step overview on the book's first page.
- ``STEP``: where a training step's time goes (chapters 7 and 9, the profiles and the trace).
- ``PHASE``: the ledger's traffic phases; what AdamW also sends is blue, what Muon adds is orange/red.
- ``LAYOUT``: the three ZeRO-1 layouts, and chapter 15's Newton-Schulz placements beside ``owner``.
- ``PARALLEL``: data parallel against tensor parallel (chapter 3's grid).
- ``SHARD_CUT``: Muon on whole matrices against Newton-Schulz on row or column shards (chapter 11).
- ``MEMORY``: what one rank stores (chapter 2); ``STATE``: the optimizer state (chapters 5, 10).
- ``MATRIX`` and ``DP_SHARD``: the matrices of a plan and the DP ranks that own its shards (chapter 4).
- ``RANK``: one colour per rank, where a figure follows data from rank to rank (collectives, groups).
- ``NEUTRAL``: padding, reference lines and the like.
"""
from __future__ import annotations

OPTIMIZER = {"muon": "#dd8452", "adamw": "#4c72b0"}

STEP = {
    "step": "#595959",               # the whole step (a trace's outer range)
    "forward_backward": "#b0b0b0",
    "waiting": "#e3e3e3",            # waiting for the other ranks
    "communication": "#55a868",
    "newton_schulz": "#c44e52",
    "optimizer": "#8172b3",          # the rest of the optimizer's work
}

PHASE = {
    "grad_reduce_scatter": "#4c72b0",
    "param_all_gather": "#9fb8dc",
    "ns_gather_dp": "#dd8452",
    "ns_gather_tp": "#f0b78f",
    "ns_to_owner": "#c44e52",
    "ns_from_owner": "#e39a9c",
    "ns_group_gram": "#ccb974",      # the group layout's Gram all-reduces (LAYOUT's "group")
}

LAYOUT = {
    "bucket": "#8c8c8c",             # the proof of concept's layout: the baseline, grey
    "owner": "#da8bc3",
    "aligned": "#64b5cd",
    # chapter 6's DP-gather variants beside "bucket": gather only the straddling matrices, or
    # nothing (what the aligned layout achieves)
    "straddlers": "#a6761d",
    "none": "#64b5cd",
    "group": "#ccb974",              # chapter 15: one matrix over a group of ranks
    # chapter 15's older group rules, in hues of their own beside "group" (three beiges read as one):
    "group_scattered": "#8da0cb",    # FLOP-sized groups on any ranks
    "group_flops": "#66a182",        # FLOP-sized contiguous TP-local windows
    "ideal": "#d9d9d9",
}

PARALLEL = {"dp": "#c05621", "tp": "#2b6cb0", "tp_fill": "#dbe9f6"}

MEMORY = {"params": "#64b5cd", "grads": "#ccb974", "master": "#8172b3", "optimizer_state": "#937860"}

# The optimizer state a rank keeps (chapter 10), and the momentum against Newton-Schulz's output
# in chapter 5's flow of one step.
STATE = {"model": "#bbbbbb", "master": "#8172b3", "momentum": "#4c72b0", "exp_avg": "#55a868",
         "exp_avg_sq": "#c44e52", "orthogonalised": "#c44e52"}
# Light tints for boxes that belong to one optimizer (chapter 5: the stages Muon adds).
OPTIMIZER_TINT = {"muon": "#fbeee2", "adamw": "#e8eef7"}

MATRIX = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#ccb974"]
DP_SHARD = ["#dbe9f6", "#fde2c8", "#d9f0d3", "#f8d5d5", "#e2e2f5", "#f5e6c8", "#d8f3f3", "#eeeeee"]
# Chapter 11: Muon on whole matrices (its orange) against Newton-Schulz on shards cut by rows or by columns
SHARD_CUT = {"whole": OPTIMIZER["muon"], "rows": MATRIX[2], "columns": PARALLEL["tp"]}

RANK = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"]

NEUTRAL = {"padding": "#d3d3d3", "reference": "#888888", "sum": "#bab0ac", "edge": "#999999",
           "empty": "#f2f2f2"}   # a cell with nothing in it (chapter 5's send matrix)


def matrix(i: int) -> str:
    """The colour of the ``i``-th matrix of a plan (cycles after eight)."""
    return MATRIX[i % len(MATRIX)]


def dp_shard(r: int) -> str:
    """The (light) colour of DP rank ``r``'s shard in a plan's owner strip."""
    return DP_SHARD[r % len(DP_SHARD)]


def rank(r: int) -> str:
    """The colour of rank ``r`` where a figure follows data between ranks."""
    return RANK[r % len(RANK)]

# Chapter 1's Newton-Schulz maps: the cubic against Jordan's quintic, and the quintic after 3 and
# 5 steps.
NS_CURVE = {"cubic": "#4c72b0", "quintic": "#c44e52", "3 steps": "#dd8452", "5 steps": "#c44e52"}

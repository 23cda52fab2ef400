"""What travels in each stage of a traced step: which matrix pieces each rank sends to which rank, and whose.

Chapter 5's explorer (``step_explorer.py``) draws a send matrix per stage and names, on hover, the pieces of each
transfer. ``scripts/trace_step.py`` reports, for every rank, the ledger's record of each collective (its op, group,
dtype and bytes) and its plan: per matrix, its ``slice`` of the flattened TP-local matrix in this rank's DP shard
and, under an owner layout, the ``owner`` that orthogonalises it. From those alone this module says what moved:

- a ring collective (``all_gather``, ``reduce_scatter``) is drawn as a ring: each rank sends everything it sends
  to the next rank of its group (ranks in group order), which passes on what is not its own. In an all-gather
  over n ranks, rank k passes every shard but its next rank's (its own first, then those it received); in a
  reduce-scatter, partial sums of every shard but its own. Per rank that is the ledger's bytes (n - 1 shards):
  the algorithm's count, as the ledger keeps it, whatever the backend does underneath;
- an all-to-all goes straight to each rank, and its pieces follow from the plan: under the owner layout, my
  part of each matrix that rank owns (a matrix not split over TP: only from the owner's TP rank), and back, the
  owner's result for each rank's part.

Every transfer's pieces are checked against the ledger: an all-to-all's bytes are exactly its pieces', a ring's
are its pieces' plus the shards' padding (``padding``), never less. So the hover cannot name a piece that did not
travel, or leave out one that did.

    python -m pytest -q tests/test_step_explorer.py
"""
from __future__ import annotations

import math

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
RING = ("all_gather", "reduce_scatter")


def members(group: str, rank: int, dp: int, tp: int) -> list[int]:
    """The ranks of ``rank``'s ``group`` ("dp", "tp" or "world"), in group order (rank = dp_rank * tp + tp_rank)."""
    if group == "dp":
        return [d * tp + rank % tp for d in range(dp)]
    if group == "tp":
        return [rank // tp * tp + t for t in range(tp)]
    return list(range(dp * tp))


def _parts(report: dict) -> list[dict]:
    """A rank's pieces: per matrix with elements in its DP shard, its part of the flattened TP-local matrix."""
    out = []
    for m in report["matrices"]:
        a, b = m["slice"]
        if b > a:
            out.append(dict(name=m["name"], tp=report["tp_rank"] if m["tp_split_dim"] != -1 else None,
                            a=a, b=b, numel=b - a, of=math.prod(m["shape"]), kept_by=report["rank"],
                            owner=m.get("owner")))
    return out


def _whole_blocks(report: dict, tp_rank: int) -> list[dict]:
    """TP rank ``tp_rank``'s whole TP-local block of every matrix split over TP (what the TP gather moves)."""
    return [dict(name=m["name"], tp=tp_rank, a=0, b=math.prod(m["shape"]), numel=math.prod(m["shape"]),
                 of=math.prod(m["shape"]), kept_by=None, owner=m.get("owner"))
            for m in report["matrices"] if m["tp_split_dim"] != -1]


def transfers(ranks: list[dict], rank: int, phases: tuple, dp: int, tp: int) -> dict[int, dict]:
    """What ``rank`` sends in the ledger ``phases`` of one stage: receiving rank -> ``bytes``, ``kind`` ("ring
    all_gather over dp", "all_to_all"), ``pieces`` (name, TP slice, element range [a, b) of the flattened
    TP-local matrix, who keeps it, its owner) and ``padding`` (bytes of the shards' padding, rings only).
    ``ranks``: every rank's report of one run of ``trace_step.py``."""
    by_rank = {r["rank"]: r for r in ranks}
    me = by_rank[rank]
    out: dict[int, dict] = {}
    for rec in me["records"]:
        if rec["phase"] not in phases or not rec["bytes_sent"]:
            continue
        size = ITEMSIZE[rec["dtype"]]
        if rec["op"] in RING:
            group = members(rec["group"], rank, dp, tp)
            k = group.index(rank)
            to = group[(k + 1) % len(group)]
            # an all-gather passes every shard but the next rank's; a reduce-scatter, every shard but its own
            skip = to if rec["op"] == "all_gather" else rank
            if rec["group"] == "tp":
                pieces = [p for t, q in enumerate(group) if q != skip for p in _whole_blocks(by_rank[q], t)]
            else:
                pieces = [p for q in group if q != skip for p in _parts(by_rank[q])]
            kind = f"ring {rec['op'].replace('_', '-')} over {rec['group'].upper()}"
            entry = out.setdefault(to, dict(bytes=0, kind=kind, dtype=rec["dtype"], pieces=None, padding=0))
            entry["bytes"] += rec["bytes_sent"]
            if entry["pieces"] is None:   # one record per bucket (or matrix): the pieces are the stage's, once
                entry["pieces"] = pieces
        elif rec["op"] == "all_to_all":
            for q_text, b in rec["peers"].items():
                entry = out.setdefault(int(q_text), dict(bytes=0, kind="all-to-all", dtype=rec["dtype"],
                                                         pieces=[], padding=0))
                entry["bytes"] += b
        else:
            raise ValueError(f"{rec['op']} in phase {rec['phase']}: the explorer knows rings and all-to-alls")
    for q, entry in out.items():
        if entry["kind"] == "all-to-all":
            entry["pieces"] = _to_owner(me, by_rank[q], tp) if "ns_to_owner" in phases else _from_owner(me, by_rank[q])
        moved = sum(p["numel"] for p in entry["pieces"]) * ITEMSIZE[entry["dtype"]]
        entry["padding"] = entry["bytes"] - moved
        if entry["padding"] < 0 or (entry["kind"] == "all-to-all" and entry["padding"]):
            raise ValueError(f"rank {rank} -> {q} ({entry['kind']}): the ledger says {entry['bytes']} bytes, "
                             f"its pieces are {moved}: the trace and the plan disagree")
    return out


def _to_owner(me: dict, to: dict, tp: int) -> list[dict]:
    """My parts of the matrices ``to`` owns (a matrix not split over TP: only if I am on the owner's TP rank)."""
    return [p for p, m in zip(_parts_by_matrix(me), me["matrices"])
            if p is not None and m.get("owner") == to["rank"]
            and (m["tp_split_dim"] != -1 or me["tp_rank"] == to["tp_rank"])]


def _from_owner(me: dict, to: dict) -> list[dict]:
    """``to``'s parts of the matrices I own: the results it keeps."""
    return [p for p, m in zip(_parts_by_matrix(to), to["matrices"]) if p is not None and m.get("owner") == me["rank"]]


def _parts_by_matrix(report: dict) -> list[dict | None]:
    parts = {p["name"]: p for p in _parts(report)}
    return [parts.get(m["name"]) for m in report["matrices"]]


def describe(piece: dict, owner: bool = False) -> str:
    """One line of the hover: 'w3 (TP slice 1) el. 0-148,043 of 296,088 · kept by rank 2' (the rank whose DP shard
    holds it), and with ``owner`` (what goes to or comes from an owner) ' · its owner: rank 1'."""
    where = "" if piece["tp"] is None else f" (TP slice {piece['tp']})"
    part = "whole" if piece["numel"] == piece["of"] else f"el. {piece['a']:,}-{piece['b'] - 1:,} of {piece['of']:,}"
    who = [] if piece["kept_by"] is None else [f"kept by rank {piece['kept_by']}"]
    if owner and piece["owner"] is not None:
        who.append(f"its owner: rank {piece['owner']}")
    return f"{piece['name']}{where} {part}" + "".join(f" · {w}" for w in who)

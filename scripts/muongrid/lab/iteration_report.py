"""What ``scripts/iteration_bench.py`` prints: every rank's records (``iteration_run``) read into times, counts and
the closed forms, and the checks that gate on counts.

Times. An iteration's time is its slowest rank's; a run's is the median of its iterations; an option's whole
iteration is the median of its runs with their min and max, and its ratio to ZeRO's is taken run by run. A part
(forward, backward, the step's parts) is the median over every timed iteration of its slowest rank. What each
part is, per option:

    reduction   ours: the gradient reduce-scatter in step() (``backward``: launching it from backward and waiting
                for it, the ledger's seconds); DDP: its buckets all-reduced alone (a probe)
    exposed     ours: the same (nothing of it runs under backward); DDP and ``backward``: backward - backward
                under no_sync()
    exchange    ours: pieces to Newton-Schulz and back (gathers or all-to-alls); torch's: none
    NS          Newton-Schulz (the group layout's collectives for a grouped matrix inside it)
    gather      ours: the parameter all-gather; ZeRO: its broadcasts (_sync_params); DDP + torch.optim.Muon: none
    ballot      ours: the presence and NaN/Inf ballot's all-reduce (phase "contract"), the first collective of the
                step, with its wait for the slowest rank to finish backward (the ranks' skew, which DDP's options
                absorb inside backward, in its all-reduce; under ``backward``, also the reduce-scatters queued
                before it); the others: none
    update      the rest of step(), iteration by iteration: step - reduction (ours, in step()) - exchange - NS - gather
                - ballot (momentum, the update, copies, the NaN/Inf norms)

Counts (the gate). Bytes one rank sends per iteration, priced as the ledger prices them (``c10d_count``), and
collectives, from the counted iteration; Newton-Schulz calls and FLOPs per rank. Each option's bytes are set
beside the closed form (``costmodel``) at the measured dp, where they must be equal, and at dp 8, 64 and 1,024.
"""
from __future__ import annotations

import statistics

from ..newton_schulz import ns5_flops
from . import costmodel
from .choice import ns_flops_per_rank
from .iteration import OURS, OURS_KWARGS
from .verdicts import fastest_text, ratio_text, spread, spread_text

PARTS = ("forward", "backward", "step", "reduction", "exchange", "newton_schulz", "param_gather", "ballot", "update")
SCALE_DPS = (8, 64, 1024)
EXACT = ("bucket", "owner", "aligned", "backward")   # one process's result bit for bit on 2 ranks (not "group": its
#                                          Newton-Schulz of a shared matrix adds in another order)
LOSS_TOLERANCE = 1e-4   # |loss - ZeRO's loss| in the first AGREE_ITERATIONS: the script's docstring says why
AGREE_ITERATIONS = 3


def _median_of_max(per_rank: list[list[dict]], key: str) -> float:
    return statistics.median(max(r[i].get(key, 0.0) for r in per_rank) for i in range(len(per_rank[0])))


def _groups(census: dict) -> list[dict]:
    """An option's parameter groups in ``costmodel``'s form (DP only: nothing split over TP)."""
    return [dict(shapes=g["shapes"], tp_split_dims=[-1] * len(g["shapes"]), use_muon=g["use_muon"])
            for g in census["groups"]]


def closed_form(name: str, census: dict, buckets: list[int], dp: int, rank: int | None = None) -> int:
    """Bytes one rank sends per iteration under option ``name`` at ``dp`` ranks, from the closed forms alone
    (``rank=None``: the mean over ranks, for our layouts whose ranks differ)."""
    params = [n for g in census["groups"] for n in g["numels"]]
    if name in OURS:
        layout = OURS_KWARGS[name].get("layout", "owner")
        ours = costmodel.step_bytes(_groups(census), dp, 1, "auto", layout=layout, rank=rank)["total"]
        return ours + costmodel.ballot_bytes(census["n_params"], dp, census["check_finite"] is not None)
    ddp = costmodel.ddp_all_reduce_bytes(buckets, dp) + costmodel.broadcast_bytes(census["buffers"], dp)
    if name == "ddp":   # our DDP mode: the aligned plan's step without its reduce-scatter, and no ballot
        step = costmodel.step_bytes(_groups(census), dp, 1, "auto", layout="aligned", rank=rank)
        return ddp + step["total"] - step["grad_reduce_scatter"]
    return ddp + (costmodel.broadcast_bytes(params, dp) if name == "zero" else 0)


def ns_per_rank(name: str, census: dict, dp: int) -> list[int]:
    """Each rank's Newton-Schulz FLOPs per iteration at ``dp`` ranks, from the plans and the closed forms."""
    shapes = [s for g in census["groups"] if g["use_muon"] for s in g["shapes"]]
    if name == "torch":
        return [sum(ns5_flops(*s) for s in shapes)] * dp
    if name == "zero":
        owners = costmodel.zero_partition([s[0] * s[1] for s in shapes], dp)
        return [sum(ns5_flops(*s) for s, o in zip(shapes, owners) if o == r) for r in range(dp)]
    groups = _groups(census)
    layout = "aligned" if name == "ddp" else OURS_KWARGS.get(name, {}).get("layout", "owner")
    return ns_flops_per_rank(costmodel.plans_for(groups, dp, 1, "auto", layout, first_only=True)[0], groups)


def summarize(everyone: list[dict], dp: int, spec: dict, scale: tuple[int, ...] = SCALE_DPS) -> dict:
    names = everyone[0]["names"]
    out = dict(model=spec, dp=dp, options={}, checks={})
    ref = "zero" if "zero" in names else names[0]
    losses = {n: [statistics.fmean(r["warmup"][n][i] for r in everyone) for i in range(len(everyone[0]["warmup"][n]))]
              + [statistics.fmean(r["counted"][n]["loss"] for r in everyone)]
              + [statistics.fmean(r["timed"][n][i]["loss"] for r in everyone) for i in range(len(everyone[0]["timed"][n]))]
              for n in names}
    for n in names:
        timed = [r["timed"][n] for r in everyone]
        runs = sorted({t["run"] for t in timed[0]})
        whole = [statistics.median(max(r[i]["whole"] for r in timed) for i in range(len(timed[0]))
                                   if timed[0][i]["run"] == run) for run in runs]
        parts = {k: _median_of_max(timed, k) for k in PARTS}
        counted = [r["counted"][n] for r in everyone]
        census, summary = counted[0], counted[0]["summary"]
        buckets = [c["numel"] for c in census["calls"] if c["op"] == "all_reduce" and c["stage"] == "backward"]
        if n in OURS and not everyone[0]["no_sync"][n]:   # reduced in step(), after backward: all of it exposed
            parts["exposed"] = parts["reduction"]
            parts["backward_no_reduction"] = parts["backward"]
        else:   # reduced under backward (DDP, or ours with grad_reduce="backward"): what it adds to backward
            probes = [r["no_sync"][n] for r in everyone]
            parts["backward_no_reduction"] = statistics.median(max(p[i] for p in probes) for i in range(len(probes[0])))
            parts["exposed"] = parts["backward"] - parts["backward_no_reduction"]
            if n not in OURS:
                reductions = [r["reduction"][n] for r in everyone]
                parts["reduction"] = statistics.median(max(p[i] for p in reductions) for i in range(len(reductions[0])))
        bytes_rank = [c["summary"]["bytes"] for c in counted]
        row = dict(whole_runs=whole, whole=spread(whole), parts=parts,
                   bytes_per_rank=bytes_rank, calls_per_rank=[c["summary"]["calls"] for c in counted],
                   by_stage=summary["by_stage"], buckets=buckets,
                   ns_flops_per_rank=[c["ns_flops"] for c in counted], ns_calls_per_rank=[c["ns_calls"] for c in counted],
                   closed_form_per_rank=[closed_form(n, census, buckets, dp, rank=r) for r in range(dp)],
                   closed_form_at={str(d): closed_form(n, census, buckets, d) for d in scale},   # str: as JSON
                   ns_closed_form_per_rank=ns_per_rank(n, census, dp),
                   busiest_ns_at={str(d): max(ns_per_rank(n, census, d)) for d in scale},
                   loss_gap=max(abs(a - b) for a, b in zip(losses[n], losses[ref])),
                   first_loss_gap=max(abs(a - b) for a, b in zip(losses[n][:AGREE_ITERATIONS],
                                                                  losses[ref][:AGREE_ITERATIONS])),
                   final_param_gap=everyone[0]["final_gap"]["zero"][n])
        if n in OURS:
            row["ledger_bytes_per_rank"] = [c["ledger_bytes"] for c in counted]
        out["options"][n] = row
    for n, row in out["options"].items():
        if "zero" in out["options"]:
            z = out["options"]["zero"]["whole_runs"]
            row["vs_zero_runs"] = [a / b for a, b in zip(row["whole_runs"], z)]
        out["checks"].update(checks(n, row, everyone, dp))
    out["losses"] = losses
    out["groups"] = [dict(shapes=g["shapes"], use_muon=g["use_muon"]) for g in everyone[0]["counted"][names[0]]["groups"]]
    out["reference"] = ref
    return out


def checks(n: str, row: dict, everyone: list[dict], dp: int) -> dict:
    """The count gates of option ``n``: each a bool, named."""
    census = everyone[0]["counted"][n]
    stages = row["by_stage"]
    muon = [s for g in census["groups"] if g["use_muon"] for s in g["shapes"]]
    total_ns = sum(ns5_flops(*s) for s in muon)
    out = {f"{n}: bytes per rank equal the closed form": row["bytes_per_rank"] == row["closed_form_per_rank"],
           f"{n}: NS FLOPs per rank equal the plan's": row["ns_flops_per_rank"] == row["ns_closed_form_per_rank"],
           f"{n}: first {AGREE_ITERATIONS} losses within {LOSS_TOLERANCE} of the reference":
               row["first_loss_gap"] <= LOSS_TOLERANCE}
    if n in EXACT and dp == 2:   # a sum of two is exact in any order (the script's docstring)
        out[f"{n}: the same parameters as our first layout, bit for bit"] = everyone[0]["final_gap"]["ours"].get(n) == 0.0
    if n in OURS and OURS_KWARGS[n].get("grad_reduce") == "backward":
        # by bytes, not by op name: on gloo a reduce-scatter reaches the dispatcher as an all-to-all (comm.py)
        counted = [r["counted"][n] for r in everyone]
        out[f"{n}: the gradient reduce-scatters in backward, the rest in step()"] = set(stages) <= {"backward", "step"} \
            and all(0 < c["reduction_bytes"] == c["summary"]["by_stage"].get("backward", {}).get("bytes", 0)
                    for c in counted)
    if n in OURS:
        if OURS_KWARGS[n].get("grad_reduce") != "backward":
            out[f"{n}: nothing moves outside step()"] = set(stages) <= {"step"}
        out[f"{n}: each matrix orthogonalised once"] = sum(row["ns_flops_per_rank"]) == total_ns * (
            dp if n == "bucket" else 1)
        out[f"{n}: counted bytes = ledger + the ballot"] = all(
            b - lb == costmodel.ballot_bytes(census["n_params"], dp, census["check_finite"] is not None)
            for b, lb in zip(row["bytes_per_rank"], row["ledger_bytes_per_rank"]))
        return out
    out[f"{n}: DDP reduces every gradient element once"] = sum(row["buckets"]) == census["grad_numel"]
    if n == "ddp":
        out[f"{n}: step() reduces nothing and holds no ballot"] = "reduce_scatter" not in {
            c["op"] for c in census["calls"] if c["stage"] == "step"} and all(
            c["summary"]["by_stage"].get("step", {}).get("bytes", 0) == c["ledger_bytes"]
            for c in (r["counted"][n] for r in everyone))
        out[f"{n}: each matrix orthogonalised once"] = sum(row["ns_flops_per_rank"]) == total_ns
    if n == "torch":
        out[f"{n}: nothing moves in step()"] = "step" not in stages
    if n == "zero":
        owners = [costmodel.zero_partition(numels, dp) for numels in census["zero_numels"]]
        out[f"{n}: owners are costmodel.zero_partition's"] = owners == census["zero_owners"]
        out[f"{n}: one broadcast per parameter in step()"] = \
            stages.get("step", {}).get("calls") == sum(len(x) for x in census["zero_numels"])
    return out


def ratio(row: dict) -> str:
    return ratio_text(row["vs_zero_runs"]) if "vs_zero_runs" in row else "-"


# ---- what the chapters show (12: the section on DDP; 13: the decision) ---------------------------------------------

LABELS = dict(torch="DDP + torch.optim.Muon", zero="DDP + ZeRO", ddp="DDP + ours (grad_reduce='ddp')",
              bucket="ours, bucket", owner="ours, owner", aligned="ours, aligned", group="ours, group",
              backward="ours, owner, reduced in backward")


def time_rows(result: dict) -> list[list]:
    """Per option: the whole iteration (ms, median of the runs and min-max), its ratio to ZeRO's run by run, and
    backward, the reduction left exposed after it, Newton-Schulz and the step (ms)."""
    rows = []
    for n, row in result["options"].items():
        p = row["parts"]
        rows.append([LABELS[n], spread_text(row["whole_runs"]), ratio(row)]
                    + [f"{p[k] * 1e3:.0f}" for k in ("backward", "exposed", "newton_schulz", "step")])
    return rows


def count_rows(result: dict, at: int = 1024) -> list[list]:
    """Per option, per rank and iteration: bytes sent (the busiest rank), collectives (forward / backward / step),
    the busiest rank's Newton-Schulz GFLOP; and the closed form's bytes and busiest GFLOP at ``at`` ranks."""
    rows = []
    for n, row in result["options"].items():
        st = row["by_stage"]
        calls = " / ".join(str(st.get(k, {}).get("calls", 0)) for k in ("forward", "backward", "step"))
        rows.append([LABELS[n], f"{max(row['bytes_per_rank']):,}", calls, f"{max(row['ns_flops_per_rank']) / 1e9:.2f}",
                     f"{row['closed_form_at'][str(at)]:,.0f}", f"{row['busiest_ns_at'][str(at)] / 1e9:.2f}"])
    return rows


def time_verdict(result: dict, a: str, b: str = "zero") -> str:
    """``verdicts.fastest_text`` of two options' run medians: a winner only outside the noise."""
    runs = {LABELS[n]: result["options"][n]["whole_runs"] for n in (a, b)}
    return fastest_text(runs)

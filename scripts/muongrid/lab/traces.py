"""Read torch.profiler Chrome traces and split each training step into its parts, per rank.

The training scripts mark their work with ``record_function`` ranges, and ``comm.Comm`` marks
every collective, so a trace carries these user annotations:

    train_step          one whole step
    forward_backward    the model's forward and backward pass
    wait_for_peers      a barrier before the optimizer: time this rank waits for slower ranks
    optimizer.step      the optimizer (gradient reduce-scatter to parameter all-gather)
    comm:<phase>        a collective (comm_wait:<phase>: waiting for one started earlier)
    muon:newton_schulz  one Newton-Schulz call

``breakdown`` turns them into milliseconds per step: forward-backward, waiting, communication (the
optimizer's collectives only), Newton-Schulz, the rest of the optimizer, and the whole step.

On CUDA the CPU ranges time kernel launches, not kernels: the GPU runs behind the host, and an NCCL
collective returns once it is queued. A CUDA trace also holds each range as a ``gpu_user_annotation``
(from its first kernel's start to its last kernel's end, one event per stream), and then every part
but the step is read from those: the time the device spent in the range, on any stream. The step
itself stays the CPU range, which ends with a ``torch.cuda.synchronize`` (``profile_step.py``).
(HolisticTraceAnalysis reads the same files, but its analyses need GPU kernel events; CPU gloo traces
have none, so this small parser does the job for both.)
Open the JSON files themselves at https://ui.perfetto.dev or chrome://tracing.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path


def load_events(path: str | Path) -> list[dict]:
    """The complete events (``"ph": "X"``) of a Chrome trace, sorted by start time."""
    data = json.loads(Path(path).read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    return sorted((e for e in events if e.get("ph") == "X" and "dur" in e), key=lambda e: e["ts"])


def _within(events, start, end):
    return [e for e in events if start <= e["ts"] and e["ts"] + e["dur"] <= end + 1e-3]


def _total(events, match) -> float:
    """Time (ms) covered by the events whose name satisfies ``match``: nested or overlapping ones (a
    range on two CUDA streams) count once."""
    total, covered_until = 0.0, float("-inf")
    for e in events:
        if match(e["name"]):
            start, end = max(e["ts"], covered_until), e["ts"] + e["dur"]
            if end > start:
                total += end - start
                covered_until = end
    return total / 1000.0


def breakdown(events: list[dict], step_name: str = "train_step") -> list[dict]:
    """Per step (ms): step, forward_backward, waiting, optimizer, communication, newton_schulz, optimizer_compute.

    Communication is the collectives inside ``optimizer.step`` (so it never exceeds the optimizer); the barrier
    inside ``wait_for_peers`` counts as waiting, and a ``clip_grad_norm_`` before the step as the step's rest.
    """
    parts = "gpu_user_annotation" if any(e.get("cat") == "gpu_user_annotation" for e in events) else "user_annotation"
    steps = []
    for step in (e for e in events if e["name"] == step_name and e.get("cat") == "user_annotation"):
        inner = [e for e in _within(events, step["ts"], step["ts"] + step["dur"]) if e.get("cat") == parts]
        fb = _total(inner, lambda n: n == "forward_backward")
        wait = _total(inner, lambda n: n == "wait_for_peers")
        opt = _total(inner, lambda n: n == "optimizer.step")
        in_opt = sorted((e for o in inner if o["name"] == "optimizer.step" for e in _within(inner, o["ts"], o["ts"] + o["dur"])),
                        key=lambda e: e["ts"])
        comm = _total(in_opt, lambda n: n.startswith(("comm:", "comm_wait:")))  # so communication <= optimizer
        ns = _total(inner, lambda n: n == "muon:newton_schulz")
        steps.append(dict(step=step["dur"] / 1000.0, forward_backward=fb, waiting=wait, optimizer=opt,
                          communication=comm, newton_schulz=ns, optimizer_compute=opt - comm))
    return steps


def median_breakdown(steps: list[dict]) -> dict:
    """The median of each part over steps, and the optimizer's share of the step."""
    if not steps:
        raise ValueError("no training steps found in the trace (is every step inside record_function('train_step')?)")
    med = {k: statistics.median(s[k] for s in steps) for k in steps[0]}
    med["optimizer_share"] = med["optimizer"] / med["step"]
    med["optimizer_compute_share"] = med["optimizer_compute"] / med["step"]
    return med


def like_for_like_steps(ranks: list[dict]) -> dict:
    """Muon's and AdamW's step (ms) over the same forward-backward: the slowest rank's optimizer plus
    the mean forward-backward of both model copies. The copies run the same model on the same batches,
    so a difference between their forward-backward is noise, which a plain ratio of whole steps would
    credit to the optimizer (a Muon step "faster" than AdamW's). ``ranks``: per rank, per optimizer,
    a ``median_breakdown``."""
    kinds = ("muon", "adamw")
    fb = statistics.mean(rank[k]["forward_backward"] for rank in ranks for k in kinds)
    return {k: fb + max(rank[k]["optimizer"] for rank in ranks) for k in kinds}

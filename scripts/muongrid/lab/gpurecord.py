"""The project's one-GPU record, as the book cites it: an external run on one H100, read from its folder once and
kept in ``book/data/`` with its provenance.

The run (``../shared/gpu/h100-2026-11-26/`` beside a checkout: its README, logs, JSON and the tools that measured)
was made outside this book's build, on one NVIDIA H100 80GB HBM3 with torch 2.11.0+cu130 on 2026-11-26, at commit
7b306af, when the package was still called ``dmuon``. Its commands are in that folder's ``tools/run.sh``. The
book cannot rerun it (no GPU builds the book), so a page that shows it prints where it came from
(``provenance_text``) beside every figure, and marks what has changed in the code since (``CHANGED_SINCE``).

    python -m muongrid.lab.gpurecord ../shared/gpu/h100-2026-11-26     # (re)writes book/data/gpu_h100_2026-11-26.json
    record = load()                                                    # what the chapters read

Only this module parses the record's logs; the chapters read the JSON it writes.
"""
from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

from .provenance import ROOT, load_recorded

FILE = "gpu_h100_2026-11-26.json"
COMMIT = "7b306af"
WHAT = ("an external run of this project at commit 7b306af (the package then named dmuon) on one NVIDIA H100 "
        "80GB HBM3, torch 2.11.0+cu130, 2026-11-26, by the commands of tools/run.sh in its folder")
# What the optimizer's GPU step has become since the record (issue 31), so that no page passes the record's step
# times off as today's code: parameters are views of per-bucket buffers, updates are foreach/fused, no host sync.
CHANGED_SINCE = ("the optimizer step was rebuilt after this record (parameters are views of per-bucket buffers, "
                 "updates run foreach and fused, no host sync): its step times are those of commit 7b306af, and "
                 "the rebuilt step has not been timed on a GPU yet")


def _steps(log: str) -> list[dict]:
    """Each ``=== name: command`` block of ``gpu.log``: its command, exit code, seconds and the lines it kept."""
    out = []
    for block in re.split(r"(?m)^=== ", log)[1:]:
        head, *lines = block.splitlines()
        if head.startswith("done"):
            continue
        name, command = head.split(": ", 1)
        rc, ms = re.match(r"rc=(-?\d+) secs=(\d+)ms", lines[0]).groups()
        out.append(dict(name=name, command=command, rc=int(rc), seconds=int(ms) / 1e3, lines=lines[1:]))
    return out


def _profile_ms(text: str, section: str, op: str) -> float:
    """The "Self CUDA" milliseconds of ``op`` in one ``##### section`` table of ``profile.log`` (its first row)."""
    body = text.split(f"##### {section}", 1)[1].split("#####", 1)[0]
    for line in body.splitlines():
        if line.strip().startswith(op + " "):
            cells = re.findall(r"(\d+\.\d+)(ms|us)", line)
            values = [float(v) / (1e3 if unit == "us" else 1.0) for v, unit in cells]
            if values[3]:            # Self CPU, CPU total, CPU avg, Self CUDA, ...
                return values[3]
    raise ValueError(f"profile.log: no CUDA time for {op!r} under {section!r}")


def import_record(folder: Path) -> dict:
    """The record in ``folder`` as one dict (what ``main`` writes)."""
    folder = Path(folder)
    log = (folder / "gpu.log").read_text()
    head = log.splitlines()[:3]
    steps = _steps(log)
    ns_json = next(json.loads(x) for s in steps if s["name"] == "ns_speed_4096" for x in s["lines"] if x[:1] == "{")
    profile = (folder / "profile.log").read_text()
    fwd_bwd = json.loads((folder / "fwd_bwd.log").read_text().splitlines()[-1])
    graph = {k: v for line in (folder / "graph.log").read_text().splitlines() if line[:1] == "{"
             for k, v in json.loads(line).items()}
    for s in steps:   # keep the lines a reader reads (JSON lines are the scripts' machine output)
        s["lines"] = [x for x in s["lines"] if x[:1] != "{"]
    return dict(
        what=WHAT, commit=COMMIT, source=str(folder.name), imported_by=f"python -m muongrid.lab.gpurecord {folder}",
        started=head[0], gpu=head[1], software=head[2], steps=steps,
        bench=json.loads((folder / "bench.json").read_text()),
        ns_speed=ns_json, fwd_bwd=fwd_bwd, fwd_bwd_command="python tools/fwd_bwd.py", graph=graph,
        graph_command="python tools/graph_probe.py", profile_command="python tools/gpu_profile.py",
        profile_ms_two_steps=dict(
            ours_newton_schulz=_profile_ms(profile, "dmuon_owner_batch", "muon:newton_schulz"),
            ours_copies=_profile_ms(profile, "dmuon_owner_batch", "Memcpy DtoD (Device -> Device)"),
            torch_addmm=_profile_ms(profile, "torch_hybrid", "aten::addmm"),
            torch_mm=_profile_ms(profile, "torch_hybrid", "aten::mm")))


def count_step(model: str) -> dict:
    """One step of ours and of torch's on ``model``'s shapes (``lab/stepmodels.py``), counted on the meta device:
    ``step_bench.py``'s table without its two-rank columns (a third of its time)."""
    from .stepcost import measure
    from .stepmodels import named_params, ours_hybrid, torch_hybrid

    named = named_params(model, "meta")
    theirs = measure(torch_hybrid(named)).summary()
    mine = measure(ours_hybrid(named, "meta").step).summary()
    return dict(torch=theirs, ours=mine, bytes_ratio=mine["bytes_gib"] / theirs["bytes_gib"])


def time_step(step, device, warmup: int, steps: int) -> dict:
    """``step()`` timed as ``make record-gpu`` records it: after ``warmup`` calls, ``steps`` calls, each with
    its **host** time (until ``step()`` returned: what the training loop waits for) and, on a GPU, its
    **device** time (CUDA events around it, then synchronised), and the **peak memory** allocated over them
    beside what was allocated before. ``median_ms``/``fastest_ms`` are the device's on a GPU, the host's
    elsewhere. Off a GPU the device parts are None: absent, not zero."""
    import statistics
    import time

    import torch

    cuda = torch.device(device).type == "cuda"
    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    host, dev = [], []
    for _ in range(steps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        step()
        host.append(1e3 * (time.perf_counter() - t0))
        if cuda:
            end.record()
            end.synchronize()
            dev.append(start.elapsed_time(end))
    main = dev if cuda else host
    return dict(median_ms=statistics.median(main), fastest_ms=min(main), clock="device" if cuda else "host",
                host_ms=host, host_median_ms=statistics.median(host),
                device_ms=dev if cuda else None, device_median_ms=statistics.median(dev) if cuda else None,
                allocated_before_gib=before / 2**30 if cuda else None,
                peak_memory_gib=torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None)


def load() -> dict:
    """The record as ``book/data/`` keeps it."""
    return load_recorded(FILE)


def provenance_text(record: dict) -> str:
    """The lines a page prints under any figure of the record."""
    return (f"From the project's one-GPU record: {record['what']}.\n"
            f"  {record['gpu']}; {record['software']}; started {record['started']}\n"
            f"  kept in book/data/{FILE} ({record['imported_by']})")


def derived(record: dict) -> dict:
    """The rates the hardware table (``muongrid.hardware.H100_TABLE``) takes from the record, computed from it:
    the matmul ceiling, Newton-Schulz at 4096^2 and inside the step, forward + backward, and the bytes per second
    of the fused AdamW pass (read parameter, gradient and both moments, write all but the gradient: 28 bytes)."""
    llama = next(m for m in record["bench"]["models"] if m["model"] == "llama-1b")
    ns_s = record["profile_ms_two_steps"]["ours_newton_schulz"] / 2 / 1e3
    return dict(matmul_bf16=record["bench"]["matmul_bf16_tflops"] * 1e12,
                ns5_4096=record["ns_speed"]["best_ns5_gflops"] * 1e9,
                ns_in_step=llama["ns_tflop"] * 1e12 / ns_s,
                model_flops=record["fwd_bwd"]["8x2048"]["tflops"] * 1e12,
                elementwise=llama["params"] * 28 / (llama["runs"]["torch_adamw_fused"]["gpu_ms"] / 1e3))


# One step of ours and of torch's on Llama-3.2-1B shapes counted on the meta device at the record's commit, before
# the rebuild (../shared/step-cost.md, section 0, 2026-11-26; the counter is today's lab/stepcost.py): GiB written
# and read outside Newton-Schulz, against the record's measured GPU milliseconds (its bench.json).
PRIOR_COUNTS = dict(source="../shared/step-cost.md (2026-11-26), counted at commit 7b306af",
                    ours_outside_ns_gib=229.5, torch_outside_ns_gib=45.9)
OPTIMIZERS = {"torch_adamw_fused": "torch AdamW (fused), every parameter",
              "torch_hybrid": "torch.optim.Muon + AdamW (fused)", "dmuon_bucket": "ours, bucket",
              "dmuon_owner": "ours, owner", "dmuon_owner_batch": "ours, owner, ns_batch"}
SHOWN = ("verify_layouts", "train_save", "train_resume", "train_fsdp_vs_torch")   # what a run prints


def command_rows(record: dict) -> list[list]:
    """One row per command of the run: its name, the command, exit code and seconds (start-up included)."""
    return [[s["name"], f"`{s['command']}`", s["rc"], f"{s['seconds']:.1f}"] for s in record["steps"]]


def shell_lines(command: str, width: int = 76) -> list[str]:
    """``$ command`` broken at spaces into lines of at most ``width`` characters, continued with a backslash."""
    lines, line = [], "$"
    for word in command.split():
        if len(line) + 1 + len(word) > width - 2:
            lines.append(line + " \\")
            line = "   "
        line += " " + word
    return lines + [line]


def fit(line: str, width: int) -> list[str]:
    """A printed line in at most ``width`` characters: a table's wide gaps closed first, then wrapped."""
    if len(line) > width:
        line = re.sub(r" {3,}", "  ", line)
    return textwrap.wrap(line, width, subsequent_indent="    ", drop_whitespace=False,
                         replace_whitespace=False) or [""]


def printed(record: dict, names=SHOWN, width: int = 76) -> str:
    """The lines the run's logs kept for the commands ``names``, each under its command, within ``width``
    characters (what a notebook output shows at 1280 px without scrolling or folding)."""
    out = []
    for s in record["steps"]:
        if s["name"] in names:
            out += shell_lines(s["command"], width)
            out += [piece for line in s["lines"] if line.strip() for piece in fit(line.rstrip(), width)]
    return "\n".join(out)


def step_rows(record: dict) -> list[list]:
    """The record's optimizer-step table: per model and optimizer, GPU and host ms, syncs, x torch's step."""
    rows = []
    for m in record["bench"]["models"]:
        for key, name in OPTIMIZERS.items():
            r = m["runs"][key]
            rows.append([m["model"], name, f"{r['gpu_ms']:.1f}", f"{r['host_ms']:.1f}", r["syncs"],
                         f"{r['x_torch_hybrid']:.2f}"])
        rows.append([m["model"], "floor: NS at the matmul ceiling + one fused AdamW pass", f"{m['limit_ms']:.1f}",
                     "", "", f"{m['limit_ms'] / m['runs']['torch_hybrid']['gpu_ms']:.2f}"])
    return rows


def step_bench_rows(record: dict) -> list[list]:
    """The timed table of a ``scripts/step_bench.py --time`` record (``make record-gpu``): per model, torch's
    and our median ms (fastest), the floor and our step over torch's, and our host syncs."""
    rows = []
    for model, r in record["models"].items():
        t = r["time"]
        torch_run, ours = t["runs"]["torch"], t["runs"]["ours"]
        rows.append([model, f"{torch_run['median_ms']:.1f} ({torch_run['fastest_ms']:.1f})",
                     f"{ours['median_ms']:.1f} ({ours['fastest_ms']:.1f})", f"{t['floor_ms']:.1f}",
                     f"{t['ours_over_torch']:.2f}", ours["host_syncs"]])
    return rows


def start_page_markdown(record: dict) -> str:
    """A few sentences for the start page: what ran on a GPU and where the page about it is."""
    llama = next(m for m in record["bench"]["models"] if m["model"] == "llama-1b")["runs"]
    ns = record["ns_speed"]
    return (f"**On a GPU.** Every one-GPU path of the book's code passed under `torchrun` and NCCL on one "
            f"NVIDIA H100 (an external run at commit {COMMIT}, torch 2.11, 2026-11-26): Newton-Schulz ran at "
            f"{ns['best_ns5_gflops'] / 1e3:.0f} TFLOP/s on a 4096 x 4096 matrix, "
            f"{ns['best_ratio']:.0%} of a bf16 matmul of that size, and one optimizer step on Llama-3.2-1B "
            f"shapes took {llama['dmuon_owner_batch']['gpu_ms']:.0f} ms against torch.optim.Muon's "
            f"{llama['torch_hybrid']['gpu_ms']:.0f} ms, before this version's rebuild of the step "
            "(not yet timed on a GPU). {doc}`On a GPU <14_on_a_gpu>` shows the record.")


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    out = ROOT / "book" / "data" / FILE
    out.write_text(json.dumps(import_record(Path(args[0])), indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

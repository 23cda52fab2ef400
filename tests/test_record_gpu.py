"""``make record-gpu``'s recording path (``scripts/step_bench.py --time --out``), run here on the CPU: the record
writes where it is told (creating the folder), keeps the command with its flags, and holds host and device time
apart, peak memory and the GPU's model, driver, CUDA and NCCL versions, each reported as absent (None, with the
reason) where there is no GPU rather than left out or made up. A tiny model stands in for the real shapes (one
layer of two small matrices): the path is the one a GPU run takes, and it costs seconds on a CPU.

    PYTHONPATH=scripts python -m pytest -q tests/test_record_gpu.py
"""
from __future__ import annotations

import json

import step_bench  # the entry point, as make record-gpu runs it

from conftest import ROOT


def test_the_recording_path_on_a_cpu_reports_the_gpu_parts_absent(tmp_path, monkeypatch):
    from muongrid.lab import gpurecord, model_shapes, stepmodels
    from muongrid.plan import ParamSpec

    def tiny(layers):   # two small matrices, the second split by column under TP, an embedding and a gain
        return [[ParamSpec("layers.0.up", (48, 32), 0), ParamSpec("layers.0.down", (32, 48), 1)],
                [ParamSpec("embed", (100, 32), 0), ParamSpec("norm.0", (32,), -1)]], [True, False]

    monkeypatch.setitem(model_shapes.MODELS, "tiny", (tiny, 1))
    monkeypatch.setitem(stepmodels.BENCH, "tiny", ("tiny", None))
    out = tmp_path / "not-yet" / "step_bench_gpu.json"
    argv = ["--time", "--models", "tiny", "--warmup", "1", "--steps", "3", "--out", str(out)]
    assert step_bench.main(argv) == 0
    record = json.loads(out.read_text())
    assert record["command"] == "python scripts/step_bench.py " + " ".join(argv)
    assert record["device"] == "cpu"
    hw = record["hardware"]
    assert {k: hw[k] for k in ("gpu", "gpu_memory_gib", "driver", "cuda", "nccl")} == dict.fromkeys(
        ("gpu", "gpu_memory_gib", "driver", "cuda", "nccl"))
    assert hw["gpu_count"] == 0 and hw["absent"].startswith("no GPU: timed on cpu")
    for run in record["models"]["tiny"]["time"]["runs"].values():
        assert run["clock"] == "host" and len(run["host_ms"]) == 3 and all(t > 0 for t in run["host_ms"])
        assert run["median_ms"] == run["host_median_ms"] and run["fastest_ms"] == min(run["host_ms"])
        assert run["device_ms"] is None and run["device_median_ms"] is None
        assert run["peak_memory_gib"] is None and run["allocated_before_gib"] is None
        assert run["host_syncs"] is None                       # counted by CUDA's sync debug mode only
    assert gpurecord.step_bench_rows(record)[0][0] == "tiny"   # chapter 14's table reads it


def test_make_record_gpu_writes_outside_the_tracked_tree_unless_told():
    rule = (ROOT / "Makefile").read_text().split("\nrecord-gpu:")[1].split("\n\n")[0]
    assert "--out $(OUT)" in rule and "book/data" not in rule
    default = next(line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("OUT ?="))
    assert default.split("?=")[1].strip().startswith("_build/")   # ignored by git (.gitignore)
    assert "_build/" in (ROOT / ".gitignore").read_text().split()

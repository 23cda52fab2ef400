"""The one hardware table (``muongrid.hardware.H100_TABLE``) and the GPU record it cites.

Its measured rows are typed into the engine (which must not read ``book/data``), so they are held here to the
record they come from; the plans' profile is derived from the table; the rate the time model charges
Newton-Schulz stays below every rate the record measured (the model errs long, as the chapters say). The
record's tables fit the page. Nothing is launched (about a second).
"""
from __future__ import annotations

import json

import pytest

from conftest import ROOT
from muongrid import hardware
from muongrid.lab import gpurecord

SHARED = ROOT.parent / "shared" / "gpu" / "h100-2026-11-26"


def test_measured_rows_are_the_records():
    derived = gpurecord.derived(gpurecord.load())
    measured = {k for k, row in hardware.H100_TABLE.items() if row[2] == "measured"}
    assert measured == set(derived)
    for key in measured:
        assert hardware.figure(key) == pytest.approx(derived[key], rel=1e-3), key


def test_the_plans_profile_is_the_tables_and_ns_is_charged_below_every_measured_rate():
    assert hardware.H100 == dict(flops=hardware.figure("peak_bf16"), efficiency=hardware.figure("ns_efficiency"),
                                 gpus_per_node=hardware.figure("gpus_per_node"), nvlink=hardware.figure("nvlink"),
                                 infiniband=hardware.figure("infiniband"))
    charged = hardware.figure("peak_bf16") * hardware.figure("ns_efficiency")
    assert charged < min(hardware.figure(k) for k in ("ns5_4096", "ns_in_step", "matmul_bf16"))
    for key, (value, unit, kind, source) in hardware.H100_TABLE.items():
        assert kind.split(",")[0] in ("datasheet", "measured", "assumed") and unit and source, key


@pytest.mark.skipif(not SHARED.is_dir(), reason="the record's folder (../shared) is not beside this checkout")
def test_the_kept_record_is_what_its_folder_holds():
    kept = gpurecord.load()
    fresh = json.loads(json.dumps(gpurecord.import_record(SHARED)))
    assert {k: v for k, v in fresh.items() if k != "imported_by"} == {k: v for k, v in kept.items()
                                                                      if k != "imported_by"}


def test_the_records_tables_fit_the_page():
    record = gpurecord.load()
    assert all(len(line) <= 76 for line in gpurecord.printed(record).splitlines())
    assert all(s["rc"] == 0 for s in record["steps"]) and len(gpurecord.command_rows(record)) == 10
    long = "torchrun --standalone --nproc-per-node 8 scripts/loop_zero1_tp.py " + "--flag value " * 12
    lines = gpurecord.shell_lines(long, 60)
    assert len(lines) > 2 and all(len(x) <= 60 for x in lines) and " ".join(lines).count("value") == 12


def test_a_gpu_step_bench_record_becomes_a_table():
    """``make record-gpu`` writes step_bench.py's JSON; the GPU page turns its timed part into rows."""
    run = lambda median, fastest, syncs: dict(median_ms=median, fastest_ms=fastest, host_syncs=syncs)  # noqa: E731
    record = dict(models={"llama-1b": dict(time=dict(runs=dict(torch=run(111.4, 109.2, 0), ours=run(100.0, 98.0, 0)),
                                                      floor_ms=72.6, ours_over_torch=100.0 / 111.4))})
    assert gpurecord.step_bench_rows(record) == [["llama-1b", "111.4 (109.2)", "100.0 (98.0)", "72.6", "0.90", 0]]


def test_the_start_page_sentence_cites_the_record_and_its_age():
    """``start_page_markdown`` is what chapter 0 may show: the record's commit, its figures, and that the
    rebuilt step is not timed yet, with a link to chapter 14."""
    text = gpurecord.start_page_markdown(gpurecord.load())
    assert gpurecord.COMMIT in text and "104%" in text and "not yet timed" in text
    assert "{doc}`On a GPU <14_on_a_gpu>`" in text

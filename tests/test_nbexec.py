"""The guarded notebook executor (issue 16): a lost wake-up costs half a second, not a cell timeout;
a reply that never comes is named and its chapter retried; the build prints time per chapter.

The stress check (every chapter, many rounds) is not part of the suite: ``scripts/nbstress.py``.
"""
from __future__ import annotations

import asyncio
import time

import nbformat
import pytest
from jupyter_client.channels import AsyncZMQSocketChannel


from booktools import nbexec
from conftest import last_json, script

from nb_stall_repro import lost_wakeup


def test_plain_channel_sleeps_through_a_lost_wakeup_until_its_timeout():
    """The stall itself: jupyter_client returns the reply, with no error, only when the wait times out.
    (A lower bound: it cannot come early, however fast or slow the machine is.)"""
    seconds, kind = asyncio.run(lost_wakeup(AsyncZMQSocketChannel, timeout=3.0))
    assert kind == "execute_reply" and seconds >= 3.0


def test_sliced_channel_finds_the_same_reply_within_a_slice():
    """Same lost wake-up, muongrid's channel: found by the first slice's final check, and counted.
    The bound is the 20 s timeout, 40 slices away: only a real stall can reach it."""
    before = nbexec.SlicedChannel.late_wakeups
    seconds, kind = asyncio.run(lost_wakeup(nbexec.SlicedChannel, timeout=20.0))
    assert kind == "execute_reply" and seconds < 20.0
    assert nbexec.SlicedChannel.late_wakeups == before + 1
    channel, msg_type, waited = nbexec.SlicedChannel.late_log[-1]
    assert msg_type == "execute_reply" and waited >= 0


def test_watchdog_names_the_chapter_and_cell_when_the_reply_never_comes():
    client = nbexec.GuardedClient(nbformat.v4.new_notebook(), label="chapter 99_example")
    client._check_stall()  # nothing executing: no stall
    client._cell, client._idle_at = 7, time.monotonic() - nbexec.STALL_GRACE_S - 1
    with pytest.raises(nbexec.KernelStall, match=r"chapter 99_example, cell 7: the kernel went idle"):
        client._check_stall()
    client._idle_at = time.monotonic()  # idle just now: the reply may still be on its way
    client._check_stall()
    client._idle_at, client._heard = None, False  # sent long ago, and the kernel never said busy
    client._sent_at = time.monotonic() - nbexec.STALL_GRACE_S - 1
    with pytest.raises(nbexec.KernelStall, match=r"cell 7: sent \d+ s ago and the kernel has said nothing"):
        client._check_stall()
    client._heard = True  # busy: a long cell is not a stall
    client._check_stall()


def _notebook(tmp_path, source='print("hello")'):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return path


def test_a_stalled_chapter_is_executed_again_once_then_fails(tmp_path, monkeypatch):
    path = _notebook(tmp_path)
    calls = []
    real_execute = nbexec.GuardedClient.execute

    def stall_first(self, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise nbexec.KernelStall("chapter nb, cell 0: simulated")
        return real_execute(self, **kw)

    monkeypatch.setattr(nbexec.GuardedClient, "execute", stall_first)
    nb, report = nbexec.execute_chapter(path)
    assert report.retries == 1 and report.stalls == ["chapter nb, cell 0: simulated"]
    assert nb.cells[0].outputs[0]["text"] == "hello\n"

    monkeypatch.setattr(nbexec.GuardedClient, "execute",
                        lambda self, **kw: (_ for _ in ()).throw(nbexec.KernelStall("again")))
    with pytest.raises(nbexec.KernelStall, match="again"):
        nbexec.execute_chapter(path)


def test_cell_times_and_the_timing_table(tmp_path):
    nb, report = nbexec.execute_chapter(_notebook(tmp_path, "import time; time.sleep(0.3)"))
    assert report.slowest_cell[0] == 0 and report.slowest_cell[1] >= 0.3 and report.seconds >= report.slowest_cell[1]
    table = nbexec.timing_table([report])
    assert table.splitlines()[1].startswith("nb ") and table.splitlines()[-1].startswith("total")


def test_stress_script_runs_and_reports(tmp_path):
    proc = script("nbstress.py", "--synthetic", "--rounds", "1", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = last_json(proc.stdout)
    assert result["runs"] == 1 and result["stalls"] == 0 and result["client"] == "guarded"

"""Execute chapters with nbclient so that a lost ZeroMQ wake-up can never stall a build.

The stall (issue 16): a chapter waited exactly its per-cell timeout with the kernel idle, then went
on with every output present and no error. The wait is ``jupyter_client``'s
``AsyncZMQSocketChannel.get_msg(timeout)``, which awaits pyzmq's asyncio ``socket.poll(timeout)``.
pyzmq learns that a message arrived from ZeroMQ's ``ZMQ_FD``, an *edge-triggered* descriptor; when
that edge is consumed without the event loop seeing it, the reply sits in the socket and nothing
wakes the poll. When the timeout fires, pyzmq's ``_AsyncPoller.poll`` makes one last non-blocking
``zmq_poll`` (its ``on_poll_ready``), finds the reply, and returns it as if it had just arrived: so
nbclient sees a normal reply, 900 s late. (The same class of lost wake-up is pyzmq issue #2173,
"getsockopt(zmq.EVENTS) drains signaler, can cause zmq.asyncio recv to miss wakeups"; no fixed
release exists as of pyzmq 27.3.) ``scripts/nb_stall_repro.py`` measures it.

The work-around here, in three parts:

1. ``SlicedChannel``: every channel wait is a series of polls of at most ``SLICE_S`` seconds. Each
   poll that times out ends with that same non-blocking check, so a lost wake-up costs at most
   one slice instead of a whole timeout. Polls that were rescued this way are counted
   (``late_wakeups``), which is how the stress check sees the bug happen and be absorbed.
2. ``GuardedClient``: a watchdog. If the kernel has said it is idle after a cell (IOPub status)
   but the cell's reply has not come within ``STALL_GRACE_S``, or has published nothing at all for
   a cell sent that long ago, it raises ``KernelStall`` naming the chapter and cell, instead of
   waiting out the cell timeout. A reply without the idle status now
   fails too (``raise_on_iopub_timeout``) rather than dropping outputs silently.
3. ``execute_chapter`` retries a chapter once after a ``KernelStall`` and says so.

Use (what ``scripts/build_book.py`` and the test fixture call)::

    from booktools.nbexec import execute_chapter
    nb, report = execute_chapter("notebooks/05_distributed_step.ipynb")   # report: seconds, cells, retries
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty

import nbformat
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from nbclient import NotebookClient
from traitlets import Type

SLICE_S = 0.5          # longest single wait on a socket; a lost wake-up costs at most this
STALL_GRACE_S = 30.0   # kernel idle, no reply for this long: a stall (replies follow idle in milliseconds)
CELL_TIMEOUT_S = 600   # a real hang only (stalls are the watchdog's): the slowest cell takes about
                       # a minute on 2 idle cores and passed 300 s with 10 processes competing


def quiet_openmp() -> None:
    """Make OpenMP threads sleep, not spin, while they wait (``OMP_WAIT_POLICY=PASSIVE``, unless set).

    torch's CPU kernels run on OpenMP threads that by default spin for a while at every barrier.
    With more runnable threads than cores (a kernel, its launched ranks and the rest of a build on
    2 cores) the spinning threads take the cores the working ones need: chapter 1's training cell
    ran about 20x slower than alone and passed a 600 s timeout. Measured on this 2-core machine
    with other work running: 20 steps of that training took 28.6 s with the default policy, 7.7 s
    with PASSIVE (9.5 s with one thread). It must be set before a process loads OpenMP, so it is
    set here for the kernels this module starts, and by ``launch.py`` for the ranks it spawns."""
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


class KernelStall(RuntimeError):
    """The kernel finished a cell but its reply never reached the client."""


class SlicedChannel(AsyncZMQSocketChannel):
    """A channel whose ``get_msg`` never waits on the socket for more than ``SLICE_S`` at a time."""

    late_wakeups = 0           # polls that found a message only through the time-out's final check
    late_log: list = []        # (channel, message type, seconds the message had waited) per late wake-up
    on_wait = None             # called between slices (the watchdog); may raise
    channel_name = "?"

    async def get_msg(self, timeout: float | None = None):  # type: ignore[override]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = SLICE_S if deadline is None else max(0.0, min(SLICE_S, deadline - time.monotonic()))
            started = time.monotonic()
            if await self.socket.poll(int(step * 1000)):
                # Ready only once the slice's timer fired: pyzmq's final non-blocking check found a
                # message that no wake-up had announced (or one that came in the last 0.1 ms).
                late = step > 0 and time.monotonic() - started >= step - 1e-4
                msg = await self._recv()
                if late:
                    SlicedChannel.late_wakeups += 1
                    SlicedChannel.late_log.append((self.channel_name, msg["header"].get("msg_type"), _age(msg)))
                return msg
            if deadline is not None and time.monotonic() >= deadline:
                raise Empty
            if self.on_wait is not None:
                self.on_wait()


def _age(msg) -> float:
    """Seconds since the kernel stamped ``msg`` (its header's date)."""
    from datetime import datetime

    date = msg["header"].get("date")
    if isinstance(date, str):
        date = datetime.fromisoformat(date.replace("Z", "+00:00"))
    return (datetime.now().astimezone() - date).total_seconds() if date else float("nan")


def _named(name: str) -> type:
    return type(f"Sliced{name.title()}Channel", (SlicedChannel,), {"channel_name": name})


class SlicedKernelClient(AsyncKernelClient):
    shell_channel_class = Type(_named("shell"))
    iopub_channel_class = Type(_named("iopub"))
    control_channel_class = Type(_named("control"))
    stdin_channel_class = Type(_named("stdin"))


class GuardedClient(NotebookClient):
    """nbclient's client with sliced channels and a watchdog for a reply that never comes."""

    def __init__(self, nb, label: str = "notebook", **kw):
        quiet_openmp()  # before the kernel starts: it and the scripts it launches inherit it
        kw.setdefault("timeout", CELL_TIMEOUT_S)
        kw.setdefault("iopub_timeout", 10)
        kw.setdefault("raise_on_iopub_timeout", True)
        kw.setdefault("kernel_name", "python3")
        super().__init__(nb, **kw)
        self.label = label
        self.cell_seconds: dict[int, float] = {}
        self.on_cell_done = None   # called with the cell's index when its reply has arrived
        self._cell = None          # index of the cell being executed
        self._idle_at = None       # when the kernel reported idle for it
        self._sent_at = None       # when it was sent
        self._heard = False        # whether the kernel has published anything for it yet

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        km.client_class = f"{SlicedKernelClient.__module__}.{SlicedKernelClient.__name__}"
        return km

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        kc.shell_channel.on_wait = self._check_stall
        return kc

    def _check_stall(self):
        now = time.monotonic()
        if self._idle_at is not None and now - self._idle_at > STALL_GRACE_S:
            raise KernelStall(f"{self.label}, cell {self._cell}: the kernel went idle "
                              f"{now - self._idle_at:.0f} s ago but the cell's reply never "
                              "arrived (a lost ZeroMQ wake-up; see scripts/booktools/nbexec.py)")
        if self._sent_at is not None and not self._heard and now - self._sent_at > STALL_GRACE_S:
            raise KernelStall(f"{self.label}, cell {self._cell}: sent {now - self._sent_at:.0f} s ago and "
                              "the kernel has said nothing about it (not even busy)")

    def process_message(self, msg, cell, cell_index):
        self._heard = True  # the kernel has started this cell (status busy comes first)
        return super().process_message(msg, cell, cell_index)

    async def _async_poll_output_msg(self, parent_msg_id, cell, cell_index):
        await super()._async_poll_output_msg(parent_msg_id, cell, cell_index)
        self._idle_at = time.monotonic()

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        self._cell, self._idle_at, started = cell_index, None, time.monotonic()
        self._sent_at, self._heard = started, False
        try:
            out = await super().async_execute_cell(cell, cell_index, execution_count, store_history)
            if self.on_cell_done is not None and cell.cell_type == "code":
                self.on_cell_done(cell_index)
            return out
        finally:
            if cell.cell_type == "code":
                self.cell_seconds[cell_index] = time.monotonic() - started
            self._idle_at = self._sent_at = None


@dataclass
class Report:
    """What executing one chapter took."""
    name: str
    seconds: float = 0.0
    slowest_cell: tuple[int, float] = (-1, 0.0)
    retries: int = 0
    late_wakeups: int = 0
    stalls: list[str] = field(default_factory=list)


def execute_chapter(path: str | Path, cwd: str | Path | None = None, retries: int = 1,
                    timeout: float = CELL_TIMEOUT_S, on_cell_done=None) -> tuple[nbformat.NotebookNode, Report]:
    """Execute the notebook at ``path`` in ``cwd`` (default: its folder); retry after a stall.
    ``on_cell_done(index)`` is called as each code cell's reply arrives."""
    path = Path(path)
    report = Report(path.stem)
    before = SlicedChannel.late_wakeups
    started = time.monotonic()
    while True:
        nb = nbformat.read(path, as_version=4)
        client = GuardedClient(nb, label=f"chapter {path.stem}", timeout=timeout, record_timing=True,
                               resources={"metadata": {"path": str(cwd or path.parent)}})
        client.on_cell_done = on_cell_done
        try:
            client.execute()
            break
        except KernelStall as stall:
            report.stalls.append(str(stall))
            if report.retries >= retries:
                raise
            report.retries += 1
            print(f"[nbexec] {stall}; executing {path.stem} again", flush=True)
    report.seconds = time.monotonic() - started
    if client.cell_seconds:
        report.slowest_cell = max(client.cell_seconds.items(), key=lambda kv: kv[1])
    report.late_wakeups = SlicedChannel.late_wakeups - before
    return nb, report


def timing_table(reports: list[Report]) -> str:
    """A plain-text table: one line per chapter, then the total."""
    lines = [f"{'chapter':<28} {'seconds':>8} {'slowest cell':>14} {'retries':>7} {'late wake-ups':>13}"]
    for r in reports:
        lines.append(f"{r.name:<28} {r.seconds:8.1f} {f'#{r.slowest_cell[0]} {r.slowest_cell[1]:.1f}s':>14} "
                     f"{r.retries:7d} {r.late_wakeups:13d}")
    lines.append(f"{'total':<28} {sum(r.seconds for r in reports):8.1f}")
    return "\n".join(lines)

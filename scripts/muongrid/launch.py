"""Run a worker function on every rank of a DP x TP grid, from one entry point, two ways.

* ``python scripts/verify.py --dp 2 --tp 2``: spawns dp*tp local processes on gloo (a laptop,
  Colab, CI). The parent hosts the rendezvous store on a free port, so parallel runs never
  collide, and splits the CPU cores between the ranks.
* ``torchrun --standalone --nproc-per-node 4 scripts/verify.py --dp 2 --tp 2`` (or multi-node with
  ``--nnodes``/``--rdzv-endpoint``): each process is one rank; NCCL on ``cuda:{LOCAL_RANK % visible
  GPUs}`` when CUDA is there (``devices.rank_device``: also right where each process sees only its own
  GPU), gloo otherwise.

Failure handling, the part that makes distributed code debuggable:

* A rank that raises writes its traceback (atomically: the parent never reads half a file); the
  parent stops every other rank at once, prints the first failure's traceback (the root cause:
  later ones are usually peers losing their connection) and one line per other failed rank, and
  returns exit code 1. A rank killed by a signal the launcher did not send is the root cause
  (its peers' errors follow from its death), and so is one that exits non-zero without returning
  (``os._exit``, a native crash); ranks the launcher stopped are never blamed. A rank ended by the
  collective watchdog (``comm.py``) reports like a rank that raised. A worker that *returns* a
  non-zero code (a check that failed) is not a crash: the others finish, and the run exits with
  the largest code. Ranks die with the launcher too (``PR_SET_PDEATHSIG``, or a pidfd for ranks
  started by a fork server), so nothing is left behind even if the launcher is killed.
* Every collective has a timeout (``--timeout``, seconds), on the world group and on the dp and tp
  groups alike; ``comm.Comm`` turns a timeout into an error naming the collective.

A worker is ``worker(grid, comm, args) -> int | None`` (the exit code), defined at module level
so that spawned processes can import it.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import select
import signal
import site
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from .comm import Comm, report_fatal
from .devices import rank_device
from .grid import Grid, check_grid


def add_launch_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dp", type=int, default=1, help="data-parallel size (ZeRO-1 shards)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds any collective may take before the run fails (default 120)")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                        help="auto: nccl under torchrun with CUDA, gloo otherwise")


def arg_type(parse):
    """Wrap a parser function for argparse so its ValueError message reaches the user."""
    def convert(text):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = parse.__name__
    return convert


def check_launch_args(parser: argparse.ArgumentParser, args) -> None:
    """Reject an impossible grid as a usage error, before any process starts."""
    try:
        check_grid(args.dp, args.tp)
    except ValueError as e:
        parser.error(str(e))
    if args.timeout <= 0:
        parser.error("--timeout must be positive")


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")


def without_torchrun(env: dict | None = None) -> dict:
    """``env`` (default: this process's) without the variables torchrun sets for its ranks, for a child that
    must launch its own run: inheriting them, it would take itself for a torchrun rank of this job."""
    env = dict(os.environ if env is None else env)
    return {k: v for k, v in env.items() if k not in TORCHRUN_VARIABLES and not k.startswith("TORCHELASTIC_")}


def launch(worker, args) -> int:
    """Run ``worker`` on dp*tp ranks (spawned here, or this process under torchrun); return an exit code."""
    check_grid(args.dp, args.tp)
    if under_torchrun():
        check_grid(args.dp, args.tp, int(os.environ["WORLD_SIZE"]))
        from torch.distributed.elastic.multiprocessing.errors import record
        return record(_run_rank)(worker, args, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None)
    return _spawn(worker, args)


class PrintsLog:
    """A worker for ``launch`` made of ``train(grid, args) -> (model, log)``: every rank trains, rank 0 prints the
    log as one JSON line (the trainer recipes: ``scripts/loop_accelerate.py``, ``loop_fabric.py``, ...)."""

    def __init__(self, train):
        self.train = train

    def __call__(self, grid, comm, args) -> None:
        log = self.train(grid, args)[1]
        if grid.rank == 0:
            print(json.dumps(log), flush=True)


def _backend(args) -> str:
    if args.backend != "auto":
        return args.backend
    return "nccl" if under_torchrun() and torch.cuda.is_available() else "gloo"


def _run_rank(worker, args, rank: int, world: int, store) -> int:
    backend = _backend(args)
    device = rank_device(backend)  # cuda:{LOCAL_RANK % visible GPUs} for NCCL; Grid.build makes it current
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the process group, so NCCL binds this rank to its own GPU
    timeout = datetime.timedelta(seconds=args.timeout)
    if store is None:
        dist.init_process_group(backend, timeout=timeout)
    else:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        # as torchrun sets them, so that a library reading them (Accelerate, Lightning) joins this group
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    grid = Grid.build(args.dp, args.tp, device, timeout=timeout)
    comm = Comm(grid, timeout_s=args.timeout, time_device=True)   # the entry points report time per phase
    code = worker(grid, comm, args)  # on an exception, skip the teardown: peers may be mid-collective
    comm.close()
    dist.destroy_process_group()
    return int(code or 0)


# ---- local spawning -------------------------------------------------------------------------

def _die_with_launcher(launcher: int) -> None:
    """End this rank if the launcher dies, even by SIGKILL (its finally-block never runs then). A
    spawned rank is the launcher's child: the kernel's PR_SET_PDEATHSIG does it. A rank forked by the
    fork server is the server's child, and the server outlives the launcher while any rank runs, so a
    thread waits on a pidfd of the launcher instead."""
    if os.getppid() == launcher:
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:  # not Linux: the parent's finally-block still cleans up
            pass
        return
    try:
        pidfd = os.pidfd_open(launcher)
    except (AttributeError, OSError):  # no pidfd (old kernel): poll instead
        pidfd = None

    def watch():
        if pidfd is not None:
            select.select([pidfd], [], [])
        else:
            while os.getppid() and _alive(launcher):
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="muongrid-launcher-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _await_report(err_dir, found_on: int | None, rank: int, limit_s: float = 5.0) -> None:
    """An error every rank raises alike (a NaN gradient voted on by all: ``finite.raise_agreed``) names the rank
    that found it; the others wait briefly for that rank's report, so the launcher names it first."""
    if found_on is None or found_on == rank:
        return
    deadline = time.monotonic() + limit_s
    while not Path(err_dir, f"rank{found_on}.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def _child(rank, world, port_pipe, worker, args, threads, err_dir, launcher) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked rank inherits the launcher's handler
    _die_with_launcher(launcher)
    os.environ["LOCAL_RANK"] = str(rank)  # one machine: with --backend nccl, rank r uses cuda:r
    os.environ["MUONGRID_ERROR_FILE"] = str(Path(err_dir, f"rank{rank}.txt"))
    torch.set_num_threads(threads)
    try:
        if not port_pipe.poll(args.timeout):
            raise TimeoutError(f"the launcher did not open its rendezvous store within --timeout {args.timeout} s")
        store = dist.TCPStore("127.0.0.1", port_pipe.recv(), world, is_master=False,
                              timeout=datetime.timedelta(seconds=args.timeout))
        code = _run_rank(worker, args, rank, world, store)
        if code:  # a deliberate non-zero return (a failed check): say so, or it would count as a crash
            Path(err_dir, f"rank{rank}.returned").write_text(str(code))
    except BaseException as e:  # noqa: BLE001 - report everything, including SystemExit
        if isinstance(e, SystemExit) and not e.code:
            sys.exit(0)
        _await_report(err_dir, getattr(e, "found_on", None), rank)
        report_fatal(traceback.format_exc())
        # Leave at once: a normal interpreter exit would tear down process groups whose peers may
        # still be mid-collective, which can hang or abort instead of reporting this failure.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.exit(code)


def _spawn(worker, args) -> int:
    world = args.dp * args.tp
    threads = max(1, (os.cpu_count() or 1) // world)
    os.environ.update(OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see scripts/booktools/nbexec.py, quiet_openmp
    ctx = _context()
    # The ranks start before the store exists (so a forked rank copies no store thread) and wait for
    # its port, which each reads from its own pipe once the store listens.
    pipes = [ctx.Pipe(duplex=False) for _ in range(world)]
    with tempfile.TemporaryDirectory(prefix="muongrid-") as err_dir:
        procs = [ctx.Process(target=_child, args=(r, world, pipes[r][0], worker, args, threads, err_dir, os.getpid()),
                             name=f"rank{r}") for r in range(world)]
        previous = signal.signal(signal.SIGTERM, _raise_exit)
        try:
            sys.stdout.flush()  # a forked rank would print what the launcher's buffers still hold
            sys.stderr.flush()
            for p in procs:
                p.start()
            store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False,  # noqa: F841
                                  timeout=datetime.timedelta(seconds=args.timeout))
            for _, port_out in pipes:
                port_out.send(store.port)
            return _wait(procs, err_dir, args)
        finally:
            _stop(procs)
            signal.signal(signal.SIGTERM, previous)


# What a rank needs that it would otherwise import by itself: torch._dynamo above all, which
# torch.optim.Optimizer imports the first time one of its methods runs (they are wrapped by
# torch._disable_dynamo): about 1.5 s of CPU in every rank, paid once in the launcher instead.
_RANK_PRELOAD = ["torch", "torch.distributed", "torch._dynamo"]


def _threads() -> int | None:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None


_THREADS_AT_IMPORT = _threads()


def _fork_is_safe() -> bool:
    """Whether forking this process is safe: it runs only the main thread and the one that ``import
    torch`` starts (torch 2.13), now and when this module was imported. Any other thread, above all an
    OpenMP pool left by tensor work in this process, would make a forked rank hang in its first
    parallel region (it inherits the pool's state, not its threads); a store or a user thread could
    hold a lock the child then waits on forever."""
    return _THREADS_AT_IMPORT is not None and _threads() <= _THREADS_AT_IMPORT <= 2


@contextlib.contextmanager
def forkable():
    """Tensor work in the launcher that keeps it forkable: one thread, so torch starts no OpenMP pool
    (``_fork_is_safe``). For the small checks a script runs before it launches (building the problem
    once so bad input fails early): without this, the pool they leave sends every launch to the
    slower fork server."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _context():
    """How ranks start. On Linux, the ranks are forked from this process, which has already imported
    torch, muongrid and the script, so a rank starts in milliseconds: this is the normal case (a script
    that parses its arguments and launches). Forking is safe only before this process has started a
    thread (``_fork_is_safe``), so a process that has gets a fork server instead: a fresh process
    imports torch, muongrid and the script once, then forks each rank (seconds more per launch). Elsewhere, spawn: a fresh interpreter per rank. The environment variable
    ``MUONGRID_START_METHOD`` (``fork``, ``forkserver`` or ``spawn``) chooses."""
    method = os.environ.get("MUONGRID_START_METHOD") or ("fork" if sys.platform == "linux" else "spawn")
    if method not in ("fork", "forkserver", "spawn"):
        raise ValueError(f"MUONGRID_START_METHOD must be 'fork', 'forkserver' or 'spawn', got {method!r}")
    if method == "spawn":
        return mp.get_context("spawn")
    if method == "fork" and _fork_is_safe():
        import torch._dynamo  # noqa: F401  (see _RANK_PRELOAD: imported once here, inherited by every rank)
        return mp.get_context("fork")
    # The fork server does not take this process's sys.path (Python 3.11 ignores it), so a muongrid found
    # through the script's folder (python scripts/verify.py in a checkout) would be imported there from
    # wherever the server's own path finds one (an installed copy, another checkout), and the ranks would
    # run that copy's worker (muongrid.verify's, say): put this muongrid first. An installed one needs nothing.
    here = str(Path(__file__).resolve().parents[1])
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if here not in (*site.getsitepackages(), sysconfig.get_paths()["purelib"]) and paths[0] != here:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *filter(None, paths)])
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_RANK_PRELOAD + ["muongrid.distributed", "muongrid.launch", "__main__"])
    return ctx


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def _wait(procs, err_dir, args) -> int:
    """Wait for every rank. A rank that raised or died stops the run at once; a rank that returned a
    non-zero code (a check that failed, say) lets the others finish, and the largest code is returned."""
    alive, returned = list(procs), {}
    while alive:
        multiprocessing.connection.wait([p.sentinel for p in alive])
        # A rank killed by a signal first: its peers' errors ("connection closed by peer") follow from its
        # death, and a peer that failed at once can be found ended in the same wake-up, at a lower index.
        for p in sorted((p for p in alive if p.exitcode is not None), key=lambda p: p.exitcode >= 0):
            alive.remove(p)
            rank = procs.index(p)
            crashed = (p.exitcode < 0 or Path(err_dir, f"rank{rank}.txt").exists()
                       or (p.exitcode > 0 and not Path(err_dir, f"rank{rank}.returned").exists()))
            if crashed:
                stopped = {procs.index(q) for q in alive}
                _stop(alive)
                _report(procs, err_dir, args, rank, stopped)
                return 1
            if p.exitcode:
                returned[rank] = p.exitcode
    if returned:
        codes = ", ".join(f"rank {r}: {c}" for r, c in sorted(returned.items()))
        print(f"=== no rank raised; the worker returned non-zero exit codes ({codes}) ===", file=sys.stderr, flush=True)
    return max(returned.values(), default=0)


def _stop(procs, grace: float = 3.0) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _report(procs, err_dir, args, culprit: int, stopped: set[int]) -> None:
    """Print the root cause in full and one line for every other rank that failed.

    ``culprit`` is the rank whose end stopped the run; ``stopped`` the ranks the launcher then ended.
    A culprit, or any rank the launcher did not stop, killed by a signal is the root cause (peers that lost
    it fail after it); otherwise the earliest traceback is.
    """
    errors = []
    for r, p in enumerate(procs):
        f = Path(err_dir, f"rank{r}.txt")
        if f.exists():
            when, tb = f.read_text().split("\n", 1)
            errors.append((float(when), r, tb))
        elif r == culprit or (p.exitcode is not None and p.exitcode < 0 and r not in stopped):
            how = (f"was killed by signal {signal.Signals(-p.exitcode).name}" if p.exitcode < 0
                   else f"exited with code {p.exitcode}")
            errors.append((float("-inf"), r, f"{how}, with no Python traceback (killed from outside, or the "
                                              "interpreter died: out of memory, a crash in native code)\n"))
        elif p.exitcode not in (0, None) and r not in stopped:
            errors.append((float("inf"), r, f"exited with code {p.exitcode} and no Python traceback\n"))
    errors.sort()
    _, first, tb = errors[0]
    where = lambda r: f"rank {r} (dp {r // args.tp}, tp {r % args.tp})"  # noqa: E731
    print(f"\n=== {where(first)} failed first; its traceback: ===\n{tb}", file=sys.stderr, end="")
    for _, r, tb in errors[1:]:
        print(f"--- then {where(r)}: {tb.strip().splitlines()[-1]}", file=sys.stderr)
    print(f"=== the run was stopped: all {len(procs)} ranks ended, exit code 1 ===", file=sys.stderr, flush=True)

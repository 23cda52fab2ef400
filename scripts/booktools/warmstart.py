"""Start the book build's and the tests' scripts from a Python that has already imported torch.

Why it exists: every ``run("verify.py ...")`` in a chapter, and every script a test launches, is a new
process, and a new Python spends 2.5-4.5 s of CPU importing torch, ``torch._dynamo`` and muongrid before
the script's first line: most of a small chapter's time on a 2-core machine. The build (``shared``, one
server for every chapter's kernel) and the test session (``tests/conftest.py``) therefore ask a *warm
start server* to fork a process that runs the script instead: a Python that imported those modules once
and then does nothing but fork. Measured on the project's 2-core machine under load (CHANGELOG, issue 42):
``verify.py --dp 2 --shapes 64x64,64x96 --steps 1`` took 4.0-8.2 s from a new interpreter and 0.5-1.3 s
forked; ``tests/test_loops.py`` with ``tests/test_measure.py`` 49-99 s without it and 26-46 s with it; all
the chapters executed (``build_book.py --force``) 320 s without it and 198 s with it.
A chapter run anywhere else (Jupyter, Colab) starts new interpreters: this module is the book's tooling,
not part of the installed package. The forked process is the script's own process, as ``python
scripts/<script> <args>`` would be:

* ``sys.argv``, ``sys.path[0]`` (the script's folder), the working directory and the environment (the
  caller's, with ``run``'s additions) are set before the script runs as ``__main__`` (``runpy``);
* stdout and stderr are the caller's pipes (one, or one each), passed over a Unix socket;
* ``random``, numpy's global generator and multiprocessing's authkey are drawn again (the hash seed
  is the server's: it is fixed when an interpreter starts);
* it ends as an interpreter does: non-daemon threads joined, ``atexit`` handlers run, the exit code
  ``sys.exit``'s, 1 after an uncaught exception (its traceback from the script's own frame), minus
  the signal's number for a process killed by one (SIGINT for an uncaught KeyboardInterrupt).

A fork is safe here for the reason it is safe in ``muongrid.launch``: the server has done no tensor work
and runs no thread but the one ``import torch`` starts (which ``launch`` allows for too). The server checks
that before every fork (``fork_hazard``): more threads than after its imports, more than two then, or a
CUDA runtime initialised (neither threads nor a CUDA context survive a fork; a forked child would hang on
the locks they held, or fail on its first CUDA call) and it refuses, saying why; the client then starts a
new interpreter, as it does for any server that cannot serve. What a fork cannot reproduce, the client
avoids:

* a server serves only the environment it started with (a variable read at import, ``OMP_*`` or
  ``TORCH_*``, would otherwise be stale), except variables no import reads (``_PER_SCRIPT``); any other
  change starts a new server;
* a server serves only the source it imported: it checks its modules' modification times before each
  fork and exits if one changed, and the client starts a new one;
* a client that cannot get a server twice (an import that fails, say) starts new interpreters from
  then on.

Lifetimes: a client's own server is its child and dies with it (``PR_SET_PDEATHSIG``), and with the
server the script it runs. A book build starts one server for all its chapters (``shared``); each kernel
that connects gets a session of its own, a forked copy of it, which kills the script it runs if its
kernel goes.

Off Linux, or with ``MUONGRID_WARM_START=0``, ``run`` starts a new interpreter for every script.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import json
import multiprocessing
import os
import random
import runpy
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# What a script would import first, and what takes its seconds (torch._dynamo: see muongrid.launch).
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "muongrid", "muongrid.launch"]
FIRST_REPLY_S = 600.0   # longest wait for a starting server (its imports, on a loaded machine)
_HEADER = struct.Struct("!I")


def enabled() -> bool:
    return sys.platform == "linux" and os.environ.get("MUONGRID_WARM_START", "1") != "0"


# Variables no import reads, which may differ between a server and the scripts it forks: muongrid's own
# (read when a script runs), pytest's (PYTEST_CURRENT_TEST changes with every test) and those a Jupyter
# kernel adds to its parent's (so kernels can share the server ``shared`` starts).
_PER_SCRIPT = ("MUONGRID_", "PYTEST_", "JPY_", "PYDEVD_", "MPLBACKEND", "TERM", "CLICOLOR", "FORCE_COLOR",
               "PAGER", "GIT_PAGER")


def _served_environment(env: dict) -> dict:
    """The part of an environment that a started server cannot change for a child."""
    return {k: v for k, v in env.items() if not k.startswith(_PER_SCRIPT)}


# ---- the wire: one length-prefixed JSON message at a time, with the descriptors it hands over ----

def _send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    data = _HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)
    sock.sendall(data[sent:])


def _receive(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """The next message and the descriptors that came with it; (None, []) when the peer has gone. Reads
    exactly one message: two replies already waiting (a script that ended at once) stay two."""
    data, fds, _, _ = socket.recv_fds(sock, _HEADER.size, 2)
    data = _read_exactly(sock, data, _HEADER.size)
    if data is None:
        return None, fds
    body = _read_exactly(sock, b"", _HEADER.unpack(data)[0])
    return (None if body is None else json.loads(body)), fds


def _read_exactly(sock: socket.socket, data: bytes, n: int) -> bytes | None:
    while len(data) < n:
        more = sock.recv(n - len(data))
        if not more:
            return None
        data += more
    return data


# ---- the server ---------------------------------------------------------------------------------

def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _sources() -> dict[str, int]:
    """Modification times of every muongrid module this process has imported."""
    times = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.startswith("muongrid") and path:
            try:
                times[path] = os.stat(path).st_mtime_ns
            except OSError:
                times[path] = -1
    return times


def _preload() -> tuple[dict[str, int], int | None]:
    """Import ``PRELOAD``; (the muongrid sources imported, the threads running now: the safe baseline)."""
    for name in PRELOAD:
        __import__(name)
    return _sources(), _threads()


def _threads() -> int | None:
    """Threads of this process, native ones included (an OpenMP pool, torch's); None off Linux."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def fork_hazard(baseline: int | None) -> str | None:
    """Why forking this process now would be unsafe, or None. ``baseline``: its threads right after its
    imports. A fork copies only the calling thread, so any other thread's locks stay held in the child
    forever (an OpenMP pool's, left by tensor work, makes the child's first parallel region hang); and a
    CUDA context does not survive a fork at all."""
    now = _threads()
    if now is None or baseline is None:
        return "its threads cannot be counted here (no /proc/self/task)"
    if baseline > 2 or now > baseline:
        return (f"{now} threads run in it ({baseline} after its imports; at most 2 are safe to fork: the main "
                "thread and the one import torch starts)")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "it has initialised CUDA, which a forked child cannot use"
    return None


def serve(fd: int) -> None:
    """Import ``PRELOAD``, then fork one process per request on socket ``fd`` until the client goes."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupted cell kills its script, not the server
    _session(socket.socket(fileno=fd), *_preload())


def listen(fd: int) -> None:
    """Import ``PRELOAD``, then give every client that connects to the listening Unix socket ``fd`` a
    session of its own: a forked copy of this process that serves it as ``serve`` would (``shared``
    starts this)."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    server = socket.socket(fileno=fd)
    environment = _served_environment(dict(os.environ))  # as started: importing torch sets variables
    imported, baseline = _preload()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # sessions that end are reaped by the kernel
    while True:
        conn, _ = server.accept()
        hazard = fork_hazard(baseline)
        if hazard:   # the session would be a fork of this process: refused, and the client starts its own
            with contextlib.suppress(OSError):
                _send(conn, {"unsafe": hazard})
            conn.close()
            continue
        if os.fork() == 0:
            try:
                server.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a session waits for its scripts
                _die_with_parent()
                _send(conn, {"environment": environment})
                _session(conn, imported, baseline)
            finally:
                os._exit(0)
        conn.close()


def _session(sock: socket.socket, imported: dict[str, int], baseline: int | None) -> None:
    """Serve one client until it goes (a client that goes while a reply is on its way is no error)."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        _serve_requests(sock, imported, baseline)


def _serve_requests(sock: socket.socket, imported: dict[str, int], baseline: int | None) -> None:
    while True:
        request, fds = _receive(sock)
        if request is None:
            return
        refusal = {"stale": True} if _sources() != imported else None
        hazard = refusal is None and fork_hazard(baseline)
        if refusal or hazard:
            for f in fds:
                os.close(f)
            _send(sock, refusal or {"unsafe": hazard})
            return
        pid = os.fork()
        if pid == 0:
            sock.close()
            _run_script(request, fds)  # never returns
        for f in fds:
            os.close(f)
        _send(sock, {"pid": pid})
        gone = _client_gone_before(pid, sock)
        _, status = os.waitpid(pid, 0)
        if gone:
            return
        _send(sock, {"code": os.waitstatus_to_exitcode(status)})


def _client_gone_before(pid: int, sock: socket.socket) -> bool:
    """Wait until the script ``pid`` ends; if the client goes first (a kernel that died), kill the script
    and say so. (A client sends nothing while its script runs: the socket turns readable only at its end.)"""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (Linux before 5.3): look at both 5 times a second
        pidfd = None
    try:
        while True:
            ready, _, _ = select.select([sock] if pidfd is None else [pidfd, sock], [], [],
                                        0.2 if pidfd is None else None)
            if pidfd is not None and pidfd in ready:
                return False
            if sock in ready:
                os.kill(pid, signal.SIGKILL)
                return True
            if pidfd is None and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _run_script(request: dict, outputs: list[int]) -> None:
    """In the forked child: become ``python <argv>`` with stdout on ``outputs[0]`` and stderr on
    ``outputs[-1]``, then exit."""
    code = 1
    try:
        _die_with_parent()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(outputs[0], 1)
        os.dup2(outputs[-1], 2)
        os.close(null)
        for f in set(outputs):
            os.close(f)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        script = request["argv"][0]
        sys.argv = list(request["argv"])
        sys.path[0] = str(Path(script).parent)
        _fresh_state(request["cwd"])
        interrupted = False
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
            kind, value, tb = sys.exc_info()
            while tb is not None and tb.tb_frame.f_code.co_filename != script:  # runpy's frames and ours
                tb = tb.tb_next
            sys.excepthook(kind, value.with_traceback(tb), tb)
            code, interrupted = 1, kind is KeyboardInterrupt
            del value, tb
        gc.collect()        # the script's globals are gone: files it left open flush as they close
        threading._shutdown()   # non-daemon threads finish first, as at an interpreter's exit
        atexit._run_exitfuncs()
        if interrupted:     # as CPython: a KeyboardInterrupt nobody caught ends the process by SIGINT
            sys.stdout.flush()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe: the interpreter's code for it
                code = 120 if code == 0 else code
        os._exit(code)


def _fresh_state(cwd: str) -> None:
    """What a new interpreter would have that a fork of the server shares with every other fork."""
    import multiprocessing.process

    random.seed()
    if "numpy" in sys.modules:  # torch._dynamo imports numpy: its global generator too
        sys.modules["numpy"].random.seed()
    multiprocessing.process.ORIGINAL_DIR = cwd
    multiprocessing.current_process().authkey = os.urandom(32)


# ---- the client ---------------------------------------------------------------------------------

def _start_python(python: str, path0: str | None, entry: str, sock: socket.socket, env: dict) -> subprocess.Popen:
    """A server: ``python`` with ``path0`` first on its path (as the scripts have their folder), running
    ``entry`` (``serve`` or ``listen``) on the socket ``sock``, which it inherits."""
    code = (f"import sys; sys.path[0] = {path0!r}; "
            f"from booktools.warmstart import {entry}; {entry}({sock.fileno()})")
    return subprocess.Popen([python, "-c", code], stdin=subprocess.DEVNULL, pass_fds=[sock.fileno()], env=env)


@contextlib.contextmanager
def shared(python: str = sys.executable, path0: str | None = None):
    """A server that every process started inside the block can use (a book build's kernels, one after
    another): it listens on a Unix socket named in ``MUONGRID_WARM_SOCKET``, which ``run`` connects to
    instead of starting a server of its own, so the imports are paid once per build, not per chapter."""
    if not enabled():
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="muongrid-warm-") as folder:
        path = str(Path(folder, "socket"))
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen()  # here, so a client that comes while the server imports waits in the backlog
        # unbuffered, as run() starts every script (the streams a forked script gets are the server's)
        proc = _start_python(python, path0, "listen", server, dict(os.environ, PYTHONUNBUFFERED="1"))
        server.close()
        before = os.environ.get("MUONGRID_WARM_SOCKET")
        os.environ["MUONGRID_WARM_SOCKET"] = path
        try:
            yield path
        finally:
            if before is None:
                os.environ.pop("MUONGRID_WARM_SOCKET", None)
            else:
                os.environ["MUONGRID_WARM_SOCKET"] = before
            proc.kill()
            proc.wait()


class WarmStarter:
    """A session with a server: the ``shared`` one at ``shared`` if it serves this environment, else one of
    its own, started on first use. ``start`` returns a ``Popen``-like handle for one script."""

    def __init__(self, python: str = sys.executable, path0: str | None = None, shared: str | None = None):
        self.python, self.path0, self.shared = python, path0, shared
        self.proc = self.sock = self.environment = self.running = None
        self.failed = False   # no server could serve: a new interpreter per script from now on
        self.refusal = None   # why a server last refused to fork (``fork_hazard``), if one did

    def _join_shared(self, env: dict) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.shared)
            sock.settimeout(FIRST_REPLY_S)
            hello, _ = _receive(sock)  # sent once the server has imported torch
            sock.settimeout(None)
        except OSError:
            hello = None
        if hello and "unsafe" in hello:
            self.refusal = hello["unsafe"]
        if not hello or hello.get("environment") != _served_environment(env):
            sock.close()
            self.shared = None  # from now on, a server of our own
            return False
        self.sock, self.environment = sock, hello["environment"]
        return True

    def _start_server(self, env: dict) -> None:
        self.close()
        ours, theirs = socket.socketpair()
        self.proc = _start_python(self.python, path0=self.path0, entry="serve", sock=theirs, env=env)
        theirs.close()
        self.sock, self.environment = ours, _served_environment(env)

    def close(self) -> None:
        """Leave the session: stop our own server (and with it, by PR_SET_PDEATHSIG, a script it still
        runs), or close the connection to the shared one (whose session then ends)."""
        if self.sock is not None:
            self.sock.close()
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.proc = self.sock = None

    def start(self, argv: list[str], cwd: str, env: dict, stderr_apart: bool = False) -> "WarmProcess | None":
        """Fork ``argv`` (a script and its arguments) in the server; None if no server can run it.
        Its stdout and stderr come through one pipe (``.stdout``), or two (``.stderr``) if ``stderr_apart``."""
        if self.running is not None and self.running.returncode is None:
            self.close()   # the last script's exit code was never read (an interrupt): out of step, start over
        for _ in range(0 if self.failed else 2):
            if self.sock is None or self.environment != _served_environment(env):
                self.close()
                if not (self.shared and self._join_shared(env)):
                    self._start_server(env)
            pipes = [os.pipe() for _ in range(2 if stderr_apart else 1)]
            try:
                _send(self.sock, {"argv": argv, "cwd": str(cwd), "env": env}, [w for _, w in pipes])
                self.sock.settimeout(FIRST_REPLY_S)   # a server that starts imports torch first
                reply, _ = _receive(self.sock)
                self.sock.settimeout(None)
            except OSError:
                reply = None
            except BaseException:  # interrupted between request and reply: the two sides disagree now
                for r, _ in pipes:
                    os.close(r)
                self.close()
                raise
            finally:
                for _, w in pipes:
                    os.close(w)
            if reply and "pid" in reply:
                self.running = WarmProcess(self.sock, reply["pid"], *(os.fdopen(r, "r", buffering=1) for r, _ in pipes))
                return self.running
            for r, _ in pipes:
                os.close(r)
            if reply and "unsafe" in reply:
                self.refusal = reply["unsafe"]
            self.close()  # stale source, unsafe to fork, or a server that could not start: one more try, our own
            self.shared = None
        self.failed = True   # twice no server (an import that fails, say): new interpreters from now on
        if self.refusal:
            print(f"[warm start] the server would not fork ({self.refusal}): new interpreters from now on",
                  file=sys.stderr)
        return None


class WarmProcess:
    """The forked script, with the part of ``subprocess.Popen`` that ``run`` uses."""

    def __init__(self, sock: socket.socket, pid: int, stdout, stderr=None):
        self.sock, self.pid, self.stdout, self.stderr, self.returncode = sock, pid, stdout, stderr, None

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """Read stdout and stderr to their ends and wait, as ``Popen.communicate`` (killed on a timeout)."""
        streams = {f.fileno(): (f, []) for f in (self.stdout, self.stderr) if f is not None}
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for fd in streams:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self.kill()
                    self.wait()
                    raise subprocess.TimeoutExpired(self.pid, timeout)
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        streams[key.fd][1].append(chunk)
                    else:
                        sel.unregister(key.fd)
        text = [b"".join(chunks).decode(errors="replace") for _, chunks in streams.values()]
        self.wait()
        return text[0], (text[1] if len(text) > 1 else None)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            # wait for the reply to begin, then read it whole (it was sent in one piece): a timeout never
            # cuts a message in two
            if not select.select([self.sock], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.pid, timeout)
            reply, _ = _receive(self.sock)
            if reply is None:
                raise RuntimeError("the warm start server ended while a script ran")
            self.returncode = reply["code"]
            for f in (self.stdout, self.stderr):
                if f is not None:
                    f.close()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

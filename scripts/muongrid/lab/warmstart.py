"""Start a chapter's scripts from a Python that has already imported torch.

Every ``run("verify.py ...")`` in a chapter is a new process, and a new Python spends 2.5-4.5 s of
CPU importing torch, ``torch._dynamo`` and muongrid before the script's first line: most of a small
chapter's time on a 2-core machine. ``run`` therefore asks a *warm start server* to fork a process
that runs the script instead. The server is the kernel's child, a Python that imported those modules
once and then does nothing but fork. The forked process is the script's own process, as
``python scripts/<script> <args>`` would start it:

* ``sys.argv``, ``sys.path[0]`` (the script's folder), the working directory, and the environment
  (the kernel's, with ``run``'s additions) are set before the script runs as ``__main__``
  (``runpy.run_path``);
* stdout and stderr are the caller's pipes (one, or one each), passed over a Unix socket
  (``socket.send_fds``);
* ``random`` is seeded again, as a new interpreter would seed it;
* the exit code is the interpreter's: ``sys.exit``'s code, 1 for an uncaught exception (its
  traceback printed), minus the signal's number for a process killed by one.

A fork is safe here for the reason it is safe in ``muongrid.launch``: the server has started no thread
and done no tensor work. What a fork cannot reproduce, the client avoids. The server serves only the
environment it started with (variables read at import, ``OMP_*`` or ``TORCH_*``, would otherwise be
stale), but for ``MUONGRID_*`` and ``PYTEST_*`` variables; any other change starts a new server. The server
serves only the source it imported: it checks its modules' modification times before each fork, and
exits if one changed, so the client starts a new server. A book build starts one server for all its
chapters (``shared``); each kernel that connects gets a session of its own, a forked copy of it.

Off Linux, or with ``MUONGRID_WARM_START=0``, ``run`` starts a fresh interpreter as before.

    python -m muongrid.lab.warmstart FD    # the server, as ``WarmStarter`` starts it (not by hand)
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
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
import time
import traceback
from pathlib import Path

# What a script would import first, and what takes its seconds (torch._dynamo: see muongrid.launch).
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "muongrid", "muongrid.launch"]
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
    """The next message and the descriptors that came with it; (None, []) when the peer has gone."""
    data, fds, _, _ = socket.recv_fds(sock, 65536, 2)
    if not data:
        return None, fds
    while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack_from(data)[0]:
        more = sock.recv(65536)
        if not more:
            return None, fds
        data += more
    return json.loads(data[_HEADER.size:]), fds


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


def _preload() -> dict[str, int]:
    for name in PRELOAD:
        __import__(name)
    return _sources()


def serve(fd: int) -> None:
    """Import ``PRELOAD``, then fork one process per request on socket ``fd`` until the client goes."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupted cell kills its script, not the server
    _session(socket.socket(fileno=fd), _preload())


def listen(fd: int) -> None:
    """Import ``PRELOAD``, then give every client that connects to the listening Unix socket ``fd`` a
    session of its own: a forked copy of this process that serves it as ``serve`` would (``shared``
    starts this)."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # sessions that end are reaped by the kernel
    server = socket.socket(fileno=fd)
    environment = _served_environment(dict(os.environ))  # as started: importing torch sets variables
    imported = _preload()
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a session waits for its scripts
            _die_with_parent()
            _send(conn, {"environment": environment})
            _session(conn, imported)
            os._exit(0)
        conn.close()


def _session(sock: socket.socket, imported: dict[str, int]) -> None:
    while True:
        request, fds = _receive(sock)
        if request is None:
            return
        if _sources() != imported:
            for f in fds:
                os.close(f)
            _send(sock, {"stale": True})
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
    except (AttributeError, OSError):  # no pidfd (an old kernel): the script runs to its end
        return False
    try:
        ready, _, _ = select.select([pidfd, sock], [], [])
        if pidfd in ready:
            return False
        os.kill(pid, signal.SIGKILL)
        return True
    finally:
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
        random.seed()
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
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe: nothing left to say
                pass
        os._exit(code)


# ---- the client ---------------------------------------------------------------------------------

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
        code = (f"import sys; sys.path[0] = {path0!r}; "
                f"from muongrid.lab.warmstart import listen; listen({server.fileno()})")
        # unbuffered, as run() starts every script (the streams a forked script gets are the server's)
        proc = subprocess.Popen([python, "-c", code], stdin=subprocess.DEVNULL, pass_fds=[server.fileno()],
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
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
        self.proc = self.sock = self.environment = None

    def _join_shared(self, env: dict) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.shared)
            hello, _ = _receive(sock)  # sent once the server has imported torch
        except OSError:
            hello = None
        if not hello or hello.get("environment") != _served_environment(env):
            sock.close()
            self.shared = None  # from now on, a server of our own
            return False
        self.sock, self.environment = sock, hello["environment"]
        return True

    def _start_server(self, env: dict) -> None:
        self.close()
        ours, theirs = socket.socketpair()
        code = (f"import sys; sys.path[0] = {self.path0!r}; "
                f"from muongrid.lab.warmstart import serve; serve({theirs.fileno()})")
        self.proc = subprocess.Popen([self.python, "-c", code], pass_fds=[theirs.fileno()], env=env,
                                     stdin=subprocess.DEVNULL)
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
        for _ in range(2):
            if self.sock is None or self.environment != _served_environment(env):
                self.close()
                if not (self.shared and self._join_shared(env)):
                    self._start_server(env)
            pipes = [os.pipe() for _ in range(2 if stderr_apart else 1)]
            try:
                _send(self.sock, {"argv": argv, "cwd": str(cwd), "env": env}, [w for _, w in pipes])
                reply, _ = _receive(self.sock)
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
                return WarmProcess(self.sock, reply["pid"], *(os.fdopen(r, "r", buffering=1) for r, _ in pipes))
            for r, _ in pipes:
                os.close(r)
            self.close()  # stale source, or a server that could not start: one more try with our own
            self.shared = None
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
            self.sock.settimeout(timeout)
            try:
                reply, _ = _receive(self.sock)
            except socket.timeout:
                raise subprocess.TimeoutExpired(self.pid, timeout) from None
            finally:
                self.sock.settimeout(None)
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

"""A fork server: one trusted process with heavy modules imported forks fresh jails in milliseconds.

Starting a Python worker in a jail costs an interpreter start and, for the kernel
grader, importing torch (about 0.8-1.2 s per worker, twice per grading). A
`ForkServer` pays that once: it starts a process (the *zygote*) that imports the
``preload`` modules and then only forks. Each `ForkServer.spawn` forks a child
that reads its own request, enters fresh namespaces, forks pid 1 of the new pid
namespace, builds the same jail as `JailSpec.command` (`_jail.build_root`,
affinity, limits, `_jail.drop_privileges`) and calls the ``target`` function with
the file descriptors it was given, instead of executing a new program.

What a forked jail shares with the zygote, and why that adds no trust:

- The zygote runs only trusted code (the standard library, this module, `_jail`
  and the preloaded modules, none of which run anything at import but define
  functions); it never receives a request's content: it forwards one socket per
  spawn and forks, and the *child* reads its config, so no submission, problem
  or seed ever sits in the zygote's memory for a later child to find.
- A child's memory is a copy-on-write copy of the zygote's: the imported
  modules. Its writes never reach the zygote or a sibling.
- A child closes every file descriptor but the ones it was sent; the jail is
  otherwise the exec path's: the same root, namespaces, uid, limits, no
  capabilities and ``no_new_privs``; PR_SET_PDEATHSIG kills it with its parent.

The zygote imports nothing of agentinfra's package (``__init__`` modules that pull
in pydantic and friends): this module is run from its file, and `_jail` and the
``preload`` entries given as files are loaded from theirs under stub packages. It exits when
its control socket closes (its owner died or called `ForkServer.close`).

Protocol: the owner sends the zygote one byte and one socket per spawn (an
``AF_UNIX`` ``SOCK_SEQPACKET`` pair: message boundaries, descriptor passing). The
forked child (outside the new namespaces, like ``unshare --fork``) receives on it
``{"config", "mode"}`` plus the descriptors, answers ``{"pid"}``, waits for its
jailed child and answers ``{"exit": status}`` (negative: killed by that signal)
before it exits. Only the standard library is imported here.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["ForkServer", "ForkServerError", "ForkedProcess"]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_PR_SET_PDEATHSIG = 1
_MAX_MESSAGE = 1 << 20
_START_TIMEOUT_S = 120.0
_SPAWN_TIMEOUT_S = 30.0
_JAIL_ERROR_STATUS = 125


class ForkServerError(Exception):
    """The fork server could not be started, or did not answer a spawn."""


class ForkedProcess:
    """A jail forked by a `ForkServer`: the outer child's pid and its exit status.

    Quacks like the parts of `subprocess.Popen` a supervisor uses (``pid``,
    ``poll``, ``wait``, ``returncode``). ``returncode`` is the jailed program's:
    its exit status, or minus the signal that killed it; when the outer child was
    itself killed before it could say, minus SIGKILL.
    """

    def __init__(self, pid: int, conn: socket.socket) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._conn = conn

    def _read_status(self, timeout_s: float | None) -> bool:
        if self.returncode is not None:
            return True
        ready, _, _ = select.select([self._conn], [], [], timeout_s)
        if not ready:
            return False
        try:
            message = self._conn.recv(_MAX_MESSAGE)
        except OSError:
            message = b""
        status = json.loads(message).get("exit") if message else None
        self.returncode = int(status) if isinstance(status, int) else -signal.SIGKILL
        self._conn.close()
        return True

    def poll(self) -> int | None:
        self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._read_status(timeout):
            raise subprocess.TimeoutExpired(f"forked jail {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    """The owner's side of one zygote (thread-safe; `spawn` from any thread).

    Args:
        preload: what the zygote does before it forks anything, in order, as
            ``(name, file)`` pairs: ``file`` empty to import ``name`` normally,
            else the module is loaded from that file under that name (stub
            parent packages are made for it); ``"module:function"`` with no
            file calls a warm-up function of a module loaded before (it must
            start no threads).
        target: ``"module:function"`` a jailed child calls with the descriptors
            it was sent (after stderr), then exits 0.
        env: the zygote's environment, and so every child's.
    """

    def __init__(self, *, preload: tuple[tuple[str, str], ...], target: str, env: dict[str, str],
                 log_path: Path) -> None:  # fmt: skip
        self._preload = preload
        self._target = target
        self._env = env
        self._log_path = log_path
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def _boot(self) -> str:
        """The zygote's program: this module run from its file (no package ``__init__``), then `zygote`."""
        here = Path(__file__).resolve().parent
        preload = (("agentinfra.sandbox._jail", str(here / "_jail.py")), *self._preload)
        return (
            f"import runpy, sys; runpy.run_path({str(here / '_forkserver.py')!r})['zygote']"
            f"(int(sys.argv[1]), {preload!r}, {self._target!r})"
        )

    def start(self) -> None:
        """Starts the zygote and waits until it has imported ``preload`` (idempotent).

        Raises:
            ForkServerError: it exited or did not get ready in time.
        """
        with self._lock:
            if (
                self._sock is not None
                and self._process is not None
                and self._process.poll() is None
            ):
                return
            self._stop_locked()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            with open(self._log_path, "ab") as log:
                self._process = subprocess.Popen(
                    [sys.executable, "-I", "-c", self._boot(), str(theirs.fileno())],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(theirs.fileno(),),
                    cwd="/", env=self._env, start_new_session=True,
                )  # fmt: skip
            theirs.close()
            ready, _, _ = select.select([ours], [], [], _START_TIMEOUT_S)
            message = ours.recv(64) if ready else b""
            if message != b"ready":
                ours.close()
                self._stop_locked()
                tail = self._log_tail()
                raise ForkServerError(f"the fork server did not start ({tail or 'no output'})")
            self._sock = ours

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self._log_path.read_bytes()[-800:].decode(errors="replace").strip()
        return ""

    def spawn(
        self, *, config: dict[str, Any], mode: str, fds: tuple[int, ...], stderr_fd: int
    ) -> ForkedProcess:
        """Forks one jail described by ``config`` (`JailSpec.config`) running ``target(*fds)``.

        The caller keeps its copies of ``fds`` and ``stderr_fd`` (close them after).

        Raises:
            ForkServerError: the zygote is gone or the child did not answer.
        """
        self.start()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self._lock:
                if self._sock is None:
                    raise ForkServerError("the fork server is closed")
                try:
                    socket.send_fds(self._sock, [b"S"], [theirs.fileno()])
                except OSError as exc:
                    self._stop_locked()
                    raise ForkServerError(
                        f"the fork server is gone ({exc}): {self._log_tail()}"
                    ) from None
            theirs.close()
            request = json.dumps({"config": config, "mode": mode}).encode()
            socket.send_fds(ours, [request], [*fds, stderr_fd])
            ready, _, _ = select.select([ours], [], [], _SPAWN_TIMEOUT_S)
            answer = json.loads(ours.recv(_MAX_MESSAGE) or b"{}") if ready else {}
        except BaseException:
            ours.close()
            theirs.close()
            raise
        if not isinstance(answer.get("pid"), int):
            ours.close()
            raise ForkServerError(f"a forked jail did not start within {_SPAWN_TIMEOUT_S:.0f} s")
        return ForkedProcess(int(answer["pid"]), ours)

    def close(self) -> None:
        """Stops the zygote (jails it forked live on) and removes its log."""
        with self._lock:
            self._stop_locked()
        self._log_path.unlink(missing_ok=True)

    def _stop_locked(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=10)
            self._process = None


# -- the zygote's side (standard library, `_jail` and the preloaded modules only) --------------


def _load_file(name: str, path: str) -> Any:
    import importlib.util
    import types

    parts = name.split(".")
    for index in range(1, len(parts)):
        package = ".".join(parts[:index])
        if package not in sys.modules:
            stub = types.ModuleType(package)
            stub.__path__ = []
            sys.modules[package] = stub
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def zygote(control_fd: int, preload: tuple[tuple[str, str], ...], target: str) -> None:
    """The zygote's main loop: preload, say ready, fork one child per request until EOF."""
    import importlib

    for name, path in preload:
        if path:
            _load_file(name, path)
        elif ":" in name:  # a warm-up function of a module loaded before
            module_name, _, function_name = name.partition(":")
            getattr(sys.modules[module_name], function_name)()
        else:
            importlib.import_module(name)
    module_name, _, function_name = target.partition(":")
    function = getattr(sys.modules[module_name], function_name)
    control = socket.socket(fileno=control_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    control.send(b"ready")
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(control, 16, 4)
        except OSError:
            break
        if not fds:
            break
        if os.fork() == 0:
            control.close()
            for extra in fds[1:]:
                os.close(extra)
            _outer_child(fds[0], function)  # never returns
        for fd in fds:
            os.close(fd)
    os._exit(0)


def _keep_only(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _unshare(mode: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET
    outer_uid, outer_gid = os.getuid(), os.getgid()
    if mode == "userns":
        flags |= _CLONE_NEWUSER
    if libc.unshare(ctypes.c_int(flags)) != 0:
        raise OSError(ctypes.get_errno(), f"unshare: {os.strerror(ctypes.get_errno())}")
    if mode == "userns":  # what `unshare --map-root-user` writes
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {outer_uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {outer_gid} 1")
    if libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None) != 0:
        raise OSError(ctypes.get_errno(), f"make / private: {os.strerror(ctypes.get_errno())}")


def _outer_child(conn_fd: int, function: Any) -> None:
    """Like ``unshare --fork --kill-child``: new namespaces, pid 1 in them, its status reported."""
    status = _JAIL_ERROR_STATUS
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        conn = socket.socket(fileno=conn_fd)
        message, fds, _, _ = socket.recv_fds(conn, _MAX_MESSAGE, 16)
        request = json.loads(message)
        *worker_fds, stderr_fd = fds
        os.dup2(stderr_fd, 1)
        os.dup2(stderr_fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        _keep_only({0, 1, 2, conn_fd, *worker_fds})
        conn.send(json.dumps({"pid": os.getpid()}).encode())
        _unshare(str(request["mode"]))
        child = os.fork()
        if child == 0:
            conn.close()
            _jailed_child(request["config"], worker_fds, function)  # never returns
        for fd in worker_fds:
            os.close(fd)
        _, raw = os.waitpid(child, 0)
        status = os.waitstatus_to_exitcode(raw)
        conn.send(json.dumps({"exit": status}).encode())
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            print(f"agentinfra jail: {exc}", file=sys.stderr, flush=True)
    os._exit(0 if status == 0 else _JAIL_ERROR_STATUS)


def _jailed_child(config: dict[str, Any], fds: list[int], function: Any) -> None:
    """Pid 1 of the new namespaces: the jail `_jail.main` builds (`_jail.enter`), then ``function(*fds)``."""
    jail = sys.modules["agentinfra.sandbox._jail"]
    try:
        jail.enter(config)
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (jail.JailSetupError, OSError) as exc:
        print(f"agentinfra jail: {exc}", file=sys.stderr, flush=True)
        os._exit(_JAIL_ERROR_STATUS)
    code = 0
    try:
        function(*fds)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)

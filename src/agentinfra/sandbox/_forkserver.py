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

- The zygote runs only trusted code (the standard library, `_zygote`, `_jail`
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
in pydantic and friends): its side lives in `_zygote`, which is run from its file
and imports only the standard library, and `_jail` and the ``preload`` entries
given as files are loaded from theirs under stub packages. It exits when its
control socket closes (its owner died or called `ForkServer.close`). This module,
the owner's side, is imported normally (it raises `agentinfra.errors.ForkServerError`).

Protocol: the owner sends the zygote one byte and one socket per spawn (an
``AF_UNIX`` ``SOCK_SEQPACKET`` pair: message boundaries, descriptor passing). The
forked child (outside the new namespaces, like ``unshare --fork``) receives on it
``{"config", "mode"}`` plus the descriptors, answers ``{"pid"}``, waits for its
jailed child and answers ``{"exit": status}`` (negative: killed by that signal)
before it exits.
"""

from __future__ import annotations

import contextlib
import json
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from agentinfra.errors import ForkServerError
from agentinfra.sandbox._zygote import MAX_MESSAGE

__all__ = ["ForkServer", "ForkedProcess"]

_START_TIMEOUT_S = 120.0
_SPAWN_TIMEOUT_S = 30.0


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
            message = self._conn.recv(MAX_MESSAGE)
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
        """The zygote's program: `_zygote` run from its file (no package ``__init__``), then `zygote`."""
        here = Path(__file__).resolve().parent
        preload = (("agentinfra.sandbox._jail", str(here / "_jail.py")), *self._preload)
        return (
            f"import runpy, sys; runpy.run_path({str(here / '_zygote.py')!r})['zygote']"
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
            answer = json.loads(ours.recv(MAX_MESSAGE) or b"{}") if ready else {}
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

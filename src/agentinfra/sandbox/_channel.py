"""One channel to a jailed process: start it, talk to it with deadlines, watch it, end it.

`JailedProcess.start` opens two pipes (one each way) and the process's stderr
file, and hands the child's ends to a ``spawn`` function that starts the process
(a jail's command, a fork server's spawn, or a plain child in the weaker modes).
The owner then writes requests and reads replies with a deadline, in whatever
framing its protocol has (the kernel workers' binary frames, the desktop
controller's JSON lines): synchronously (`send`, `read`) or on the running
event loop (`send_async`, `read_async`, which wait for the pipe through the
loop's reader and writer callbacks, so no thread is involved). Whatever the
process says is untrusted bytes; the owner caps and checks them.

`kill` ends it the same way for every owner: every process of its tree is
killed, the ``unshare`` parent of a jail reaps the jail's pid 1 by itself
(killing it first would leave that zombie to the machine's init, which may reap
slowly, and the uid sweep below waits for it), the session is killed, the
process is reaped, and under ``namespaces+uid`` every process still running as
the jail's uid is swept. Only the standard library and `agentinfra.errors` are
imported here, and asyncio only when an async method runs (the jail builder
imports this package on a grading's critical path).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from agentinfra.errors import ChannelClosedError, ChannelTimeoutError
from agentinfra.sandbox._forkserver import ForkedProcess
from agentinfra.sandbox._spec import SandboxMode
from agentinfra.sandbox._uids import kill_uid, signal_uid

_T = TypeVar("_T")

__all__ = ["JailedProcess", "Spawn", "process_tree"]

Spawn = Callable[[tuple[int, int], int], "subprocess.Popen[bytes] | ForkedProcess"]
"""Starts the process given its ends of the pipes (reads requests, writes replies) and its stderr fd."""
_CHUNK_BYTES = 1 << 22
_SWEEP_S = 10.0
_REAP_S = 10.0


class _DeadlineReader:
    """File-like ``read(n)`` over the channel until a deadline (for frame parsers that pull bytes)."""

    def __init__(self, channel: JailedProcess, deadline: float) -> None:
        self._channel = channel
        self.deadline = deadline

    def read(self, count: int) -> bytes:
        return self._channel.read(count, deadline=self.deadline)

    def readinto(self, buffer: memoryview) -> int:
        return self._channel.readinto(buffer, deadline=self.deadline)


class JailedProcess:
    """One process started through `start`, its two pipes, its stderr file, and its end."""

    def __init__(
        self,
        process: subprocess.Popen[bytes] | ForkedProcess,
        to_child: int,
        from_child: int,
        *,
        mode: SandboxMode,
        uid: int | None,
        stderr_path: Path,
    ) -> None:
        self.process = process
        self.mode = mode
        self.uid = uid
        self.stderr_path = stderr_path
        self._to = to_child
        self._from = from_child

    @classmethod
    def start(
        cls, spawn: Spawn, *, mode: SandboxMode, uid: int | None, stderr_path: Path
    ) -> JailedProcess:
        """Opens the pipes and ``stderr_path``, calls ``spawn``, and keeps the owner's ends.

        ``uid`` is the jail's uid (swept by `kill` under ``namespaces+uid``); the
        caller reserved it and releases it after `kill`.
        """
        to_read, to_write = os.pipe()
        from_read, from_write = os.pipe()
        try:
            # Appending, so that an owner who empties the file to bound it keeps it small.
            stderr = os.open(
                stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644
            )
            try:
                process = spawn((to_read, from_write), stderr)
            finally:
                os.close(stderr)
        except BaseException:
            for fd in (to_write, from_read):
                os.close(fd)
            raise
        finally:
            os.close(to_read)
            os.close(from_write)
        return cls(process, to_write, from_read, mode=mode, uid=uid, stderr_path=stderr_path)

    @property
    def is_jailed(self) -> bool:
        """Whether the process runs in a namespace jail (``namespaces+uid`` or ``userns``)."""
        return self.mode in ("namespaces+uid", "userns")

    def poll(self) -> int | None:
        return self.process.poll()

    # -- requests, synchronously ----------------------------------------------------
    def send(self, data: bytes | memoryview, *, deadline: float = float("inf")) -> None:
        """Writes all of ``data`` to the process.

        Raises:
            ChannelClosedError: the process closed its end (or exited).
            ChannelTimeoutError: it had not taken all of ``data`` by ``deadline``.
        """
        view = memoryview(data)
        while view:
            rest = _write_some(self._to, view)
            if rest is None:
                _wait(self._to, writable=True, deadline=deadline)
            view = view if rest is None else rest

    def read(self, count: int, *, deadline: float = float("inf")) -> bytes:
        """At most ``count`` bytes from the process (``b""`` at its end).

        Raises:
            ChannelTimeoutError: nothing arrived before ``deadline``.
        """
        return self._when_readable(lambda: os.read(self._from, min(count, _CHUNK_BYTES)), deadline)

    def readinto(self, buffer: memoryview, *, deadline: float = float("inf")) -> int:
        """`read` into ``buffer`` (at most its length); the count read, 0 at the process's end.

        Raises:
            ChannelTimeoutError: nothing arrived before ``deadline``.
        """
        return self._when_readable(lambda: os.readv(self._from, [buffer[:_CHUNK_BYTES]]), deadline)

    def _when_readable(self, read: Callable[[], _T], deadline: float) -> _T:
        """``read()`` once the pipe from the process has something, retried if another reader won."""
        while True:
            _wait(self._from, writable=False, deadline=deadline)
            with contextlib.suppress(BlockingIOError):
                return read()

    def reader(self, deadline: float) -> _DeadlineReader:
        """A file-like ``read(n)`` that raises `ChannelTimeoutError` past ``deadline``."""
        return _DeadlineReader(self, deadline)

    # -- requests, on the event loop ------------------------------------------------
    async def send_async(self, data: bytes | memoryview, *, deadline: float) -> None:
        """`send` on the running loop: waits for the pipe through the loop, never blocks it."""
        os.set_blocking(self._to, False)
        view = memoryview(data)
        while view:
            rest = _write_some(self._to, view)
            if rest is None:
                await _wait_async(self._to, writable=True, deadline=deadline)
            view = view if rest is None else rest

    async def read_async(self, count: int, *, deadline: float) -> bytes:
        """`read` on the running loop."""
        os.set_blocking(self._from, False)
        while True:
            await _wait_async(self._from, writable=False, deadline=deadline)
            with contextlib.suppress(BlockingIOError):
                return os.read(self._from, min(count, _CHUNK_BYTES))

    # -- watching --------------------------------------------------------------------
    def stderr_tail(self, limit: int) -> str:
        """The last ``limit`` bytes the process wrote to its stderr, decoded (``""`` if none)."""
        try:
            with open(self.stderr_path, "rb") as handle:
                handle.seek(max(0, os.fstat(handle.fileno()).st_size - limit))
                data = handle.read(limit)
        except OSError:
            return ""
        return data.decode(errors="replace")

    def descendants(self) -> list[int]:
        """The process and every descendant still alive, parents before children."""
        return process_tree(self.process.pid)

    def signal(self, sig: signal.Signals) -> int:
        """Sends ``sig`` to every process of the jail's uid (``namespaces+uid``); returns how many."""
        if self.uid is None or self.mode != "namespaces+uid":
            return 0
        return signal_uid(self.uid, sig)

    # -- the end -----------------------------------------------------------------------
    def kill(self, *, grace_s: float) -> None:
        """Kills the process and everything it started, reaps it, sweeps the uid, closes the pipes.

        ``grace_s`` is how long a jail's ``unshare`` parent gets to reap the jail's
        pid 1 and exit by itself before its session is killed too (a plain child
        gets none: its session is killed at once).
        """
        with contextlib.suppress(OSError):
            os.close(self._to)
        jailed = self.is_jailed
        tree = self.descendants()
        for pid in reversed(tree[1:] if jailed else tree):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace_s if jailed else 0)
        if not jailed or self.process.poll() is None:  # the session: anything that left the tree
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=_REAP_S)
        if self.uid is not None and self.mode == "namespaces+uid":
            deadline = time.monotonic() + _SWEEP_S
            while kill_uid(self.uid) and time.monotonic() < deadline:
                time.sleep(0.01)
        with contextlib.suppress(OSError):
            os.close(self._from)

    async def kill_async(self, *, grace_s: float) -> None:
        """`kill` off the event loop (it waits for the reaping and the sweep)."""
        import asyncio

        await asyncio.to_thread(self.kill, grace_s=grace_s)


def process_tree(root: int) -> list[int]:
    """``root`` and every live descendant, breadth first (from ``/proc/PID/task/TID/children``)."""
    found = [root]
    index = 0
    while index < len(found):
        pid = found[index]
        index += 1
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    found.extend(
                        int(c)
                        for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                    )
        except OSError:
            continue
    return found


def _write_some(fd: int, view: memoryview) -> memoryview | None:
    """Writes what the pipe takes now and returns the rest; None when it took nothing (it is full).

    Raises:
        ChannelClosedError: the reading end is closed.
    """
    try:
        written = os.write(fd, view[:_CHUNK_BYTES])
    except BlockingIOError:
        return None
    except OSError as exc:
        raise ChannelClosedError(str(exc)) from None
    return view[written:]


def _wait(fd: int, *, writable: bool, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ChannelTimeoutError("deadline passed")
    timeout = None if left == float("inf") else left
    ready = (
        select.select([], [fd], [], timeout)[1]
        if writable
        else select.select([fd], [], [], timeout)[0]
    )
    if not ready:
        raise ChannelTimeoutError("deadline passed")


async def _wait_async(fd: int, *, writable: bool, deadline: float) -> None:
    import asyncio  # here: the jail builder imports this package, and asyncio costs it ~40 ms

    left = deadline - time.monotonic()
    if left <= 0:
        raise ChannelTimeoutError("deadline passed")
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    (loop.add_writer if writable else loop.add_reader)(fd, wake)
    try:
        await asyncio.wait_for(ready, None if left == float("inf") else left)
    except TimeoutError:
        raise ChannelTimeoutError("deadline passed") from None
    finally:
        (loop.remove_writer if writable else loop.remove_reader)(fd)

"""Journals: append-only JSON lines, one versioned event each, fsync'd before acknowledged.

Each line is ``{"v": 1, "seq": N, "wall_s": ..., "mono_s": ..., "type": ..., "data": {...}}``.
``seq`` counts from 0 without gaps. Replaying the journal rebuilds all run state.

Invariants: an event is acknowledged (``append`` returns) only after its line is
written and fsync'd, so an acknowledged event survives kill -9 and power loss. A
torn last line (a crash mid-write) is detected on open, dropped with a warning and
truncated away; a malformed line anywhere else, a gap in ``seq`` or an event from
a newer schema is an error that changes nothing. A full disk is reported as an
error, never swallowed. Errors are raised as the subclass's ``error_class``: the
run journal (`harness`) raises `HarnessError`, the agent transcript `AgentError`.

Two ways to append, one implementation (`Journal.append`): the synchronous call, for
callers outside an event loop, and `Journal.append_async`, which runs the same write and
fsync in a bounded thread pool so that an fsync (milliseconds on a busy disk) never
stalls the event loop that every agent of a process shares. Records of one journal land
in the order their appends were called, async and sync alike: async appends queue on a
per-journal lock, and the write itself holds a per-journal thread lock that also assigns
``seq``, so a sync append in between can neither interleave bytes nor reuse a ``seq``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

from agentinfra.errors import AgentInfraError

__all__ = ["FSYNC_WORKERS", "JOURNAL_SCHEMA_VERSION", "Event", "Journal"]

logger = logging.getLogger(__name__)

JOURNAL_SCHEMA_VERSION = 1

FSYNC_WORKERS = 4
"""Threads that write and fsync for `Journal.append_async`, shared by every journal of the
process. Appends to one journal are serial anyway; the bound caps the threads that many
journals (one per agent) can hold blocked in fsync at once, and an append beyond it waits
its turn in the pool's queue, off the event loop."""


class _SharedPool:
    """The process-wide pool, started on first use and forgotten in a forked child (whose
    copy would count its parent's threads as its own and never run anything)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=FSYNC_WORKERS, thread_name_prefix="journal-fsync"
                )
            return self._pool

    def forget(self) -> None:
        self._pool = None
        self._lock = threading.Lock()


_SHARED_POOL = _SharedPool()
os.register_at_fork(after_in_child=_SHARED_POOL.forget)


@dataclass(frozen=True, slots=True)
class Event:
    """One journal event."""

    seq: int
    wall_s: float
    mono_s: float
    type: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_line(self) -> bytes:
        body = {
            "v": JOURNAL_SCHEMA_VERSION,
            "seq": self.seq,
            "wall_s": self.wall_s,
            "mono_s": self.mono_s,
            "type": self.type,
            "data": self.data,
        }
        return (json.dumps(body, separators=(",", ":"), sort_keys=True) + "\n").encode()


def _parse(line: bytes, where: str, error: type[AgentInfraError]) -> Event:
    try:
        body = json.loads(line)
    except ValueError:
        raise error(f"{where}: journal line is not JSON") from None
    if not isinstance(body, dict) or not isinstance(body.get("v"), int):
        raise error(f"{where}: journal line has no schema version")
    if body["v"] > JOURNAL_SCHEMA_VERSION:
        raise error(
            f"{where}: journal schema version {body['v']} is newer than this agentinfra reads "
            f"({JOURNAL_SCHEMA_VERSION}); upgrade agentinfra"
        )
    try:
        return Event(
            int(body["seq"]),
            float(body["wall_s"]),
            float(body["mono_s"]),
            str(body["type"]),
            dict(body.get("data") or {}),
        )
    except (KeyError, TypeError, ValueError):
        raise error(f"{where}: journal line lacks seq, wall_s, mono_s or type") from None


class Journal:
    """An open journal file; one writer process at a time (the run's lock guarantees it).

    ``executor`` runs the writes of `append_async`; None: the process-wide pool of
    `FSYNC_WORKERS` threads.
    """

    error_class: ClassVar[type[AgentInfraError]] = AgentInfraError

    def __init__(
        self,
        path: Path,
        events: list[Event],
        fd: int,
        size: int,
        *,
        executor: Executor | None = None,
    ) -> None:
        self.path = path
        self.events = events
        self._fd = fd
        self._size = size
        self._executor = executor
        self._write_lock = threading.Lock()
        self._queue: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    @property
    def executor(self) -> Executor:
        """Where `append_async` writes (and a subclass does its own blocking writes)."""
        return self._executor if self._executor is not None else _SHARED_POOL.get()

    @classmethod
    def read(cls, path: Path) -> list[Event]:
        """The events of ``path``, read only: a torn last line is skipped, nothing is written.

        Raises:
            error_class: the file is missing, a corrupt line before the last, a gap in seq, or a newer schema.
        """
        if not path.exists():
            raise cls.error_class(f"{path} does not exist")
        return cls._replay(path, path.read_bytes())[0]

    @classmethod
    def _replay(cls, path: Path, raw: bytes) -> tuple[list[Event], int]:
        """Parses ``raw``; returns the events and the byte length of the good lines."""
        lines = raw.split(b"\n")
        events: list[Event] = []
        good_bytes = 0
        for number, line in enumerate(lines, start=1):
            is_last = number == len(lines) or (number == len(lines) - 1 and lines[-1] == b"")
            if not line:
                continue
            try:
                event = _parse(line, f"{path}:{number}", cls.error_class)
            except cls.error_class:
                if is_last and not raw.endswith(b"\n"):
                    logger.warning(
                        "%s:%d: dropping a torn last journal line (%d bytes)",
                        path,
                        number,
                        len(line),
                    )
                    break
                raise
            if event.seq != len(events):
                raise cls.error_class(
                    f"{path}:{number}: journal seq {event.seq}, expected {len(events)}"
                )
            events.append(event)
            good_bytes += len(line) + 1
        return events, good_bytes

    @classmethod
    def open(cls, path: Path, *, executor: Executor | None = None) -> Self:
        """Opens (creating if absent) and replays ``path``; a torn last line is truncated away.

        ``executor`` runs the writes of `append_async` (None: the shared pool).

        Raises:
            error_class: corrupt line before the last, a gap in seq, or a newer schema.
        """
        raw = path.read_bytes() if path.exists() else b""
        events, good_bytes = cls._replay(path, raw)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if good_bytes != len(raw):
            os.ftruncate(fd, good_bytes)
            os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_END)
        return cls(path, events, fd, good_bytes, executor=executor)

    def append(self, type_: str, data: dict[str, Any] | None = None) -> Event:
        """Writes one event and fsyncs it; returns it once durable. Blocks the calling thread.

        Raises:
            error_class: the write or fsync failed (a full disk included); nothing is acknowledged.
        """
        with self._write_lock:
            return self._write(type_, data)

    async def append_async(self, type_: str, data: dict[str, Any] | None = None) -> Event:
        """`append`, with the write and fsync in the journal's executor; returns once durable.

        Concurrent calls on one journal land in the order they were made. ``data`` is
        encoded in the pool's thread: the caller must not change it until this returns.
        A cancelled call may still land (its write is not interrupted); the next append
        waits for it, so the order holds.

        Raises:
            error_class: the write or fsync failed (a full disk included); nothing is acknowledged.
        """
        async with self._async_queue():
            write = asyncio.get_running_loop().run_in_executor(
                self.executor, self.append, type_, data
            )
            try:
                return await asyncio.shield(write)
            except asyncio.CancelledError:
                while (
                    not write.done()
                ):  # hold the queue until the write has ended, even if cancelled again
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait({write})
                raise

    def _async_queue(self) -> asyncio.Lock:
        """The FIFO lock of this journal's async appends, made anew for each event loop."""
        loop = asyncio.get_running_loop()
        if self._queue is None or self._queue[0] is not loop:
            self._queue = (loop, asyncio.Lock())
        return self._queue[1]

    def _write(self, type_: str, data: dict[str, Any] | None) -> Event:
        if self._fd < 0:  # closed while this write waited in the pool: never a reused descriptor
            raise self.error_class(f"journal {self.path} is closed; nothing was written")
        event = Event(len(self.events), time.time(), time.monotonic(), type_, data or {})
        line = event.to_line()
        try:
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, "short write")
            os.fsync(self._fd)
        except OSError as exc:
            # Roll back a partial line so the journal stays parseable.
            os.ftruncate(self._fd, self._size)
            os.lseek(self._fd, 0, os.SEEK_END)
            raise self.error_class(
                f"cannot write journal {self.path}: {exc.strerror or exc}; free disk space and resume the run"
            ) from None
        self._size += len(line)
        # Keep what was written, not the caller's objects: a caller that later mutates
        # its dicts or lists must not change the journal's events in memory.
        event = _parse(line, str(self.path), self.error_class)
        self.events.append(event)
        return event

    def close(self) -> None:
        with self._write_lock:  # not under a write still running in the pool
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

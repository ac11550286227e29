"""A warm pool of started desktops: an episode takes one ready instead of starting its own.

A cold desktop costs about 2 s before its first observation (the jail and the
controller's interpreter, then Xvfb, the session bus and openbox, then the first
screenshot's imports and the accessibility bus; `benchmarks/desktop/RESULTS.md`).
`DesktopPool` does that work ahead of time for ``size`` desktops, one at a time in
a background task, and `take` hands one out after a health check.

Invariants:

* A pooled desktop has run nothing of any episode: it is started (`DesktopSession.start`),
  warmed (one screenshot, one accessibility read, which starts the AT-SPI bus) and
  then only checked. Its home is the pristine template; the task's setup runs on it
  after `take`, as on a cold one.
* A desktop serves exactly one episode and is then destroyed: the episode closes
  it as it closes a cold one (the jail killed, the uid swept and released, the home
  removed). Nothing is reset for reuse, so nothing of episode N (files, processes,
  X selections and windows, bus and accessibility state) exists in episode N+1's desktop.
  Decision 0020 says why destroy rather than reset.
* `take` never hands out a desktop that fails `health_problem`: the process set
  recorded when it became ready must be the set alive now (none dead, stopped or
  a zombie, none added: a killed Xvfb, openbox or dbus-daemon, a stray process of
  its uid) and the controller must answer a request that needs the X server. A
  failing one is destroyed and counted (``replaced``); the pool starts another.
* `close` destroys every desktop the pool holds (ready or starting). Desktops
  already handed out belong to their episodes.

A process-wide pool is installed by `DesktopPool.start` (the rollout service
starts one with ``--desktop-pool N``); `take_pooled` is how episodes
(`run_episode`, the desktop agent) ask it for a desktop of their shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass

from agentinfra.environments.desktop._session import (
    ControllerError,
    DesktopConfig,
    DesktopSession,
    ProcessInfo,
    uid_processes,
)
from agentinfra.errors import ConfigError

__all__ = [
    "MAX_POOL_SIZE",
    "DesktopPool",
    "PoolStats",
    "active_pool",
    "health_problem",
    "take_pooled",
]

logger = logging.getLogger(__name__)

MAX_POOL_SIZE = 64
"""The most desktops a pool keeps ready (each holds a uid and about 150 MB of resident sets while idle)."""
_CHECK_TIMEOUT_S = 5.0
"""How long the health check's request to the controller may take."""
_RETRY_MAX_S = 30.0
"""The longest the pool waits before trying again after a desktop failed to start."""
_DEAD_STATES = frozenset("ZXxTt")
"""``/proc/PID/stat`` states of a process that cannot serve: zombie, dead, stopped, traced."""

_ACTIVE: DesktopPool | None = None


def active_pool() -> DesktopPool | None:
    """The pool installed by the last `DesktopPool.start` (None when none runs)."""
    return _ACTIVE


async def take_pooled(config: DesktopConfig | None = None) -> DesktopSession | None:
    """A started, healthy desktop of shape ``config`` from the running pool, or None
    (no pool, a pool of another shape or on another event loop, or none ready): then the
    caller starts one cold."""
    pool = _ACTIVE
    if pool is None or pool.config != (config or DesktopConfig()):
        return None
    if pool.loop is not asyncio.get_running_loop():
        return None  # an episode on another loop (`run_scripted` in a worker thread): its pipes are not ours
    return await pool.take()


@dataclass(frozen=True, slots=True)
class PoolStats:
    """What a pool has done since it started."""

    size: int
    ready: int
    handed_out: int
    replaced: int
    """Desktops that failed their health check at `DesktopPool.take` and were destroyed."""
    misses: int
    """`DesktopPool.take` calls that found no healthy desktop ready (the episode started one cold)."""
    start_failures: int


def health_problem(
    recorded: dict[tuple[int, int], str], alive: dict[tuple[int, int], tuple[str, str]]
) -> str | None:
    """Why a pooled desktop must not be handed out, or None when it may be.

    ``recorded`` is its processes when it became ready, ``(pid, start) -> comm``;
    ``alive`` its uid's processes now, ``(pid, start) -> (comm, state)`` with the
    state letter of ``/proc/PID/stat``. Every recorded process must be alive, neither
    a zombie nor stopped, and no other process may run under the uid.
    """
    for key, comm in sorted(recorded.items()):
        now = alive.get(key)
        if now is None:
            return f"{comm} (pid {key[0]}) is gone"
        if now[1] in _DEAD_STATES:
            return f"{comm} (pid {key[0]}) is in state {now[1]}"
    strays = sorted(key for key in alive if key not in recorded)
    if strays:
        return (
            f"stray process {alive[strays[0]][0]} (pid {strays[0][0]}) and {len(strays) - 1} more"
        )
    return None


def _process_states(uid: int) -> dict[tuple[int, int], tuple[str, str]]:
    """``uid``'s processes now with their state letters (read from host ``/proc``)."""
    found: dict[tuple[int, int], tuple[str, str]] = {}
    for process in uid_processes(uid):
        found[process.key] = (process.comm, _state(process))
    return found


def _state(process: ProcessInfo) -> str:
    try:
        with open(f"/proc/{process.pid}/stat", "rb") as handle:
            fields = handle.read(4096).rpartition(b")")[2].split()
    except OSError:
        return "X"
    if int(fields[19]) != process.start:
        return "X"  # the pid was recycled: the recorded process is gone
    return fields[0].decode(errors="replace")


class DesktopPool:
    """``size`` started desktops of shape ``config``, refilled one at a time in the background.

    ``async with DesktopPool(size=2) as pool`` starts and closes it; `take` returns
    a healthy desktop or None. Only one pool is active per process (`take_pooled` asks it).
    """

    def __init__(self, *, size: int, config: DesktopConfig | None = None) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_POOL_SIZE:
            raise ConfigError(
                f"desktop pool size {size!r} is outside 0..{MAX_POOL_SIZE}; set --desktop-pool "
                "(0: every episode starts its own desktop)"
            )
        self.size = size
        self.config = config or DesktopConfig()
        self._ready: deque[tuple[DesktopSession, dict[tuple[int, int], str]]] = deque()
        self._wanted = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None
        self._discards: set[asyncio.Task[None]] = set()
        self._closed = False
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop the pool runs on (its desktops' requests are awaited there only)."""
        self._handed_out = self._replaced = self._misses = self._start_failures = 0

    async def __aenter__(self) -> DesktopPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stats(self) -> PoolStats:
        return PoolStats(size=self.size, ready=len(self._ready), handed_out=self._handed_out,
                         replaced=self._replaced, misses=self._misses,
                         start_failures=self._start_failures)  # fmt: skip

    async def start(self) -> None:
        """Installs the pool as the process's active one and starts filling it (returns at once)."""
        global _ACTIVE
        if _ACTIVE is not None and _ACTIVE is not self:
            raise ConfigError("a desktop pool already runs in this process; close it first")
        _ACTIVE = self
        self.loop = asyncio.get_running_loop()
        if self.size > 0 and self._filler is None:
            self._filler = asyncio.create_task(self._fill(), name="desktop-pool-fill")

    async def wait_ready(self, count: int | None = None, *, timeout_s: float = 120.0) -> None:
        """Waits until ``count`` (default: all) desktops are ready; `TimeoutError` past ``timeout_s``."""
        want = self.size if count is None else min(count, self.size)
        async with asyncio.timeout(timeout_s):
            while len(self._ready) < want:
                await asyncio.sleep(0.05)

    def ready_sessions(self) -> list[DesktopSession]:
        """The desktops ready now, oldest first (for inspection; `take` is how one is used)."""
        return [session for session, _ in self._ready]

    async def take(self) -> DesktopSession | None:
        """The oldest ready desktop that passes its health check, or None when none does.

        A desktop that fails is destroyed in the background and replaced; the one
        returned is the caller's to close, as a desktop it started itself.
        """
        while self._ready:
            session, recorded = self._ready.popleft()
            self._wanted.set()
            try:
                problem = await self._check(session, recorded)
            except BaseException:  # cancelled mid-check: the desktop is nobody's, so destroyed
                self._discard(session)
                raise
            if problem is None:
                self._handed_out += 1
                return session
            self._replaced += 1
            logger.warning("pooled desktop (uid %s) failed its health check: %s; replaced",
                           session.uid, problem)  # fmt: skip
            self._discard(session)
        self._misses += 1
        return None

    async def _check(
        self, session: DesktopSession, recorded: dict[tuple[int, int], str]
    ) -> str | None:
        channel = session.channel
        if session.closed or channel is None or channel.poll() is not None:
            return "the controller's jail has ended"
        problem = health_problem(recorded, await asyncio.to_thread(_process_states, session.uid))
        if problem is not None:
            return problem
        try:  # the pointer's position is a round trip through the controller to the X server
            reply = await session.request("pointer", timeout_s=_CHECK_TIMEOUT_S)
        except ControllerError as exc:
            return str(exc)
        return None if reply.get("ok") else f"the X server did not answer: {reply.get('error')}"

    async def close(self) -> None:
        """Stops filling and destroys every desktop the pool holds; uninstalls it (idempotent)."""
        global _ACTIVE
        self._closed = True
        if _ACTIVE is self:
            _ACTIVE = None
        if self._filler is not None:
            self._filler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._filler
            self._filler = None
        while self._ready:
            self._discard(self._ready.popleft()[0])
        if self._discards:
            await asyncio.gather(*self._discards, return_exceptions=True)

    def _discard(self, session: DesktopSession) -> None:
        task = asyncio.create_task(_destroy(session), name=f"desktop-pool-discard-{session.uid}")
        self._discards.add(task)
        task.add_done_callback(self._discards.discard)

    async def _fill(self) -> None:
        failures = 0  # in a row
        while not self._closed:
            if len(self._ready) >= self.size:
                self._wanted.clear()
                await self._wanted.wait()
                continue
            try:
                self._ready.append(await self._start_one())
                failures = 0
            except Exception as exc:
                # The next try may work; meanwhile episodes start their desktops cold.
                self._start_failures += 1
                failures += 1
                delay_s = min(_RETRY_MAX_S, 0.5 * 2 ** min(failures, 8))
                logger.warning("desktop pool: a desktop failed to start (%s); retrying in %.1f s",
                               exc, delay_s)  # fmt: skip
                await asyncio.sleep(delay_s)

    async def _start_one(self) -> tuple[DesktopSession, dict[tuple[int, int], str]]:
        """Starts and warms one desktop; returns it with its processes (the health check's reference)."""
        session = DesktopSession(self.config)
        try:
            await session.start()
            await session.screenshot()  # the screenshot's imports, once
            reply = await session.request("accessibility", max_nodes=1)  # starts the AT-SPI bus
            if not reply.get("ok"):
                raise ControllerError(f"accessibility bus did not start: {reply.get('error')}")
            processes = await asyncio.to_thread(session.processes)
        except BaseException:
            await asyncio.shield(_destroy(session))
            raise
        return session, {p.key: p.comm for p in processes}


async def _destroy(session: DesktopSession) -> None:
    try:
        await session.close()
    finally:
        await asyncio.to_thread(session.remove)

"""The machine's memory ledger: what every grading on this host has reserved, in one place.

Jails limit each process's address space (``RLIMIT_AS``); nothing limits their sum
(no cgroups). So a process that runs jails for an adversary reserves the resident
memory it expects its jails and itself to hold, here, before it starts them, and
waits while the machine cannot give it: two grading processes on one host (a
harness, a rollout service, ``agentinfra grade``, a sweep) see each other.

Layout: a folder (``<tmp>/agentinfra-memory-<uid>``), one file per reservation
(``r-<token>``: JSON with its bytes, state and label), held with an exclusive
``flock`` by its owner for as long as it lives, and a ``ledger.lock`` file whose
``flock`` makes each decision (sum, compare, add) atomic. Crash-safe by the
kernel: a dead holder's ``flock`` is released with its last descriptor, so the
next decision finds the file unlocked and deletes it; nothing leaks, whatever
killed the holder. Files are replaced by rename, so a crash never leaves a
half-written record visible.

The machine's figure (`MachineMemory`): ``MemAvailable`` sampled while no
reservation is held (the idle sample, kept in ``idle.json``), and now, plus what
the live reservations hold (reserved memory not yet touched is still available
to them); the smaller of the two, less a headroom for everything else, is what
reservations may sum to. A request larger than the larger of the two (less the
headroom) cannot fit on this machine at all, even once every grading has ended:
it is refused at once, never queued.

First come, first served: a reservation is granted only when no earlier waiter is
still waiting, so a large one is not starved by a stream of small ones. Growing a
held reservation never waits (`Reservation.grow` answers False instead): a holder
waiting for more while others hold and wait too could wait forever.

Covers: concurrent gradings in any number of processes of one user on one host.
Does not cover: other users' processes (each uid has its own folder) and any
memory their use does not go through here; it only sees them through
``MemAvailable``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agentinfra.errors import SandboxError

__all__ = [
    "LedgerView",
    "MachineMemory",
    "MemoryLedger",
    "MemoryTooLargeError",
    "MemoryWaitTimeoutError",
    "Reservation",
    "machine_memory",
]

logger = logging.getLogger(__name__)

_FORMAT_VERSION = 1
HEADROOM_SHARE = 0.05
"""Of ``MemTotal``, never reserved: the kernel, the supervisors and whatever else runs."""
MIN_HEADROOM_BYTES = 512 << 20
POLL_S = 0.25


@dataclass(frozen=True, slots=True)
class MachineMemory:
    """``MemTotal`` and ``MemAvailable`` of ``/proc/meminfo`` at one instant, in bytes."""

    total_bytes: int
    available_bytes: int

    @property
    def headroom_bytes(self) -> int:
        return max(MIN_HEADROOM_BYTES, int(HEADROOM_SHARE * self.total_bytes))


def machine_memory() -> MachineMemory:
    """This machine's memory now (`MachineMemory`)."""
    found: dict[str, int] = {}
    with open("/proc/meminfo", encoding="ascii") as handle:
        for line in handle:
            name, _, rest = line.partition(":")
            if name in ("MemTotal", "MemAvailable"):
                found[name] = int(rest.split()[0]) * 1024
    return MachineMemory(found["MemTotal"], found.get("MemAvailable", found["MemTotal"]))


@dataclass(frozen=True, slots=True)
class Entry:
    """One live reservation as the ledger file holds it."""

    token: str
    size_bytes: int
    state: Literal["held", "waiting"]
    since: float
    label: str


@dataclass(frozen=True, slots=True)
class LedgerView:
    """The ledger at one decision: the live entries and the machine's figures."""

    entries: tuple[Entry, ...]
    machine: MachineMemory
    idle_available_bytes: int

    @property
    def held_bytes(self) -> int:
        return sum(e.size_bytes for e in self.entries if e.state == "held")

    @property
    def waiting(self) -> int:
        return sum(1 for e in self.entries if e.state == "waiting")

    @property
    def _free_without_gradings(self) -> int:
        """MemAvailable with every held reservation given back, as if each were in use (a grading
        that has not grown to its reservation yet is still in MemAvailable: never past MemTotal)."""
        return min(self.machine.available_bytes + self.held_bytes, self.machine.total_bytes)

    @property
    def capacity_bytes(self) -> int:
        """What held reservations may sum to now: the idle sample, or less when other load grew."""
        now = self._free_without_gradings
        return min(self.idle_available_bytes, now) - self.machine.headroom_bytes

    @property
    def most_bytes(self) -> int:
        """The most one reservation could ever get here: every grading ended, other load as now."""
        now = self._free_without_gradings
        return max(self.idle_available_bytes, now) - self.machine.headroom_bytes

    def describe(self) -> str:
        gib = 1 << 30
        return (
            f"{self.held_bytes / gib:.1f} GiB held by {len(self.entries) - self.waiting} gradings, "
            f"{self.waiting} waiting; this machine gives gradings {self.capacity_bytes / gib:.1f} GiB "
            f"(MemAvailable {self.machine.available_bytes / gib:.1f} GiB of MemTotal "
            f"{self.machine.total_bytes / gib:.1f} GiB, less {self.machine.headroom_bytes / gib:.1f} GiB headroom)"
        )


class MemoryTooLargeError(SandboxError):
    """A request no state of this machine can grant; ``view`` is the ledger when it was refused."""

    def __init__(self, size_bytes: int, view: LedgerView) -> None:
        super().__init__(f"{size_bytes} bytes can never fit: {view.describe()}")
        self.size_bytes = size_bytes
        self.view = view


class MemoryWaitTimeoutError(SandboxError):
    """The wait for a reservation ran past its bound; ``view`` is the ledger at that moment."""

    def __init__(self, size_bytes: int, waited_s: float, view: LedgerView) -> None:
        super().__init__(f"waited {waited_s:.0f} s for {size_bytes} bytes: {view.describe()}")
        self.size_bytes = size_bytes
        self.waited_s = waited_s
        self.view = view


class MemoryLedger:
    """The machine-wide ledger in ``folder`` (module docstring); one instance per use is fine.

    ``machine`` reads the machine's memory (`machine_memory`; tests pass a fake one).
    """

    def __init__(
        self,
        folder: Path | None = None,
        *,
        machine: Callable[[], MachineMemory] = machine_memory,
    ) -> None:
        self.folder = folder or Path(tempfile.gettempdir()) / f"agentinfra-memory-{os.getuid()}"
        self.machine = machine

    @contextlib.contextmanager
    def _decision(self) -> Iterator[LedgerView]:
        """The ledger locked for one decision, dead holders swept, the idle sample fresh if idle."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.folder / "ledger.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            entries = tuple(sorted(self._live_entries(), key=lambda e: e.since))
            machine = self.machine()
            idle = self._idle_sample(entries, machine)
            yield LedgerView(entries, machine, idle)
        finally:
            os.close(fd)

    def _live_entries(self) -> Iterator[Entry]:
        for path in self.folder.glob("r-*"):
            if path.name.endswith(".tmp"):
                continue
            try:
                probe = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # its holder is alive
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    data = json.loads(os.read(probe, 1 << 16))
                    yield Entry(path.name[2:], int(data["bytes"]), data["state"],
                                float(data["since"]), str(data["label"]))  # fmt: skip
                continue
            finally:
                os.close(probe)
            logger.info(
                "memory ledger: %s's holder is gone; its reservation is released", path.name
            )
            path.unlink(missing_ok=True)

    def _idle_sample(self, entries: tuple[Entry, ...], machine: MachineMemory) -> int:
        path = self.folder / "idle.json"
        if not any(e.state == "held" for e in entries):
            _write_atomic(
                path, {"version": _FORMAT_VERSION, "available_bytes": machine.available_bytes}
            )
            return machine.available_bytes
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            return int(json.loads(path.read_text())["available_bytes"])
        return machine.available_bytes

    def view(self) -> LedgerView:
        """The ledger now (the waiting count a service reports, what a log line says)."""
        with self._decision() as view:
            return view

    def reserve(self, size_bytes: int, *, label: str, max_wait_s: float,
                on_wait: Callable[[LedgerView], None] | None = None) -> Reservation:  # fmt: skip
        """Reserves ``size_bytes``, waiting in turn while the machine cannot give them now.

        ``on_wait`` is told once when the wait starts and about once a minute after.

        Raises:
            MemoryTooLargeError: no state of this machine can grant it (`LedgerView.most_bytes`).
            MemoryWaitTimeoutError: it was not granted within ``max_wait_s``.
        """
        reservation = Reservation(self, size_bytes, label)
        started = time.monotonic()
        told = 0.0
        try:
            while not self._try_grant(reservation):
                waited = time.monotonic() - started
                if waited > max_wait_s:
                    raise MemoryWaitTimeoutError(size_bytes, waited, self.view())
                if on_wait is not None and (not told or time.monotonic() - told >= 60):
                    told = time.monotonic()
                    on_wait(self.view())
                time.sleep(POLL_S)
        except BaseException:
            reservation.release()
            raise
        return reservation

    def _try_grant(self, reservation: Reservation) -> bool:
        with self._decision() as view:
            if reservation.size_bytes > view.most_bytes:
                raise MemoryTooLargeError(reservation.size_bytes, view)
            ahead = [e for e in view.entries if e.state == "waiting" and e.token != reservation.token
                     and e.since < reservation.since]  # fmt: skip
            fits = view.held_bytes + reservation.size_bytes <= view.capacity_bytes
            reservation.write("held" if fits and not ahead else "waiting")
            return fits and not ahead


class Reservation:
    """One reservation in a `MemoryLedger`, held until `release` (or the holder's death)."""

    def __init__(self, ledger: MemoryLedger, size_bytes: int, label: str) -> None:
        self.ledger = ledger
        self.size_bytes = size_bytes
        self.label = label
        self.token = secrets.token_hex(8)
        self.since = time.time()
        self.path = ledger.folder / f"r-{self.token}"
        self._fd: int | None = None

    def write(self, state: Literal["held", "waiting"]) -> None:
        """The reservation's file, replaced whole, and locked by this holder (under the ledger lock)."""
        record = {"version": _FORMAT_VERSION, "bytes": self.size_bytes, "state": state,
                  "since": self.since, "label": self.label, "pid": os.getpid()}  # fmt: skip
        fd = _write_atomic(self.path, record, keep_open=True)
        assert fd is not None
        fcntl.flock(fd, fcntl.LOCK_EX)  # before the ledger lock is released: never seen unlocked
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd

    def grow(self, size_bytes: int) -> bool:
        """Sets the reservation to ``size_bytes`` when it is smaller or fits now; False otherwise.

        Never waits (module docstring). Raises `MemoryTooLargeError` when it can never fit.
        """
        with self.ledger._decision() as view:
            if size_bytes > self.size_bytes:
                if size_bytes > view.most_bytes:
                    raise MemoryTooLargeError(size_bytes, view)
                if view.held_bytes - self.size_bytes + size_bytes > view.capacity_bytes:
                    return False
            self.size_bytes = size_bytes
            self.write("held")
            return True

    def release(self) -> None:
        """Gives the reservation back (idempotent)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _write_atomic(
    path: Path, record: Mapping[str, object], *, keep_open: bool = False
) -> int | None:
    """``record`` as JSON at ``path``, by rename; with ``keep_open``, an open descriptor of it."""
    temporary = path.with_name(path.name + f".{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(record).encode())
        os.replace(temporary, path)
    except BaseException:
        os.close(fd)
        temporary.unlink(missing_ok=True)
        raise
    if keep_open:
        return fd
    os.close(fd)
    return None

"""Unprivileged uids for jails: reserved machine-wide for a jail's life, and swept at its end."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import signal
import tempfile
from pathlib import Path

from agentinfra.errors import UidExhaustedError

__all__ = ["UID_RANGE", "kill_uid", "pids_by_uid", "reserve_uid", "signal_uid", "uid_is_orphaned"]

UID_RANGE = (200_000, 260_000)


def _lock_folder() -> Path:
    return Path(tempfile.gettempdir()) / f"agentinfra-uids-{os.getuid()}"


def pids_by_uid() -> dict[int, list[int]]:
    """Uid -> pids of the live processes (zombies included) any of whose uids is that uid.

    Read from the ``Uid:`` line of ``/proc/PID/status`` (real, effective, saved and
    filesystem uids). The owner of ``/proc/PID`` is the effective uid alone, and the
    files under it read as root's for a non-dumpable process, so neither is the test:
    a process holding a jail's uid in any of the four is that jail's, is killed with
    it, and keeps the uid from being handed to another jail. One walk, used by the
    jails, the desktop's freeze and the orphan sweep.
    """
    found: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as handle:
                status = handle.read(4096)
        except OSError:
            continue  # gone meanwhile
        line = next((row for row in status.split(b"\n") if row.startswith(b"Uid:")), b"")
        for uid in {int(field) for field in line.split()[1:]}:
            found.setdefault(uid, []).append(int(entry))
    return found


def reserve_uid() -> tuple[int, int]:
    """A uid no live process uses and no other jail on this machine holds, and its lock's fd.

    Drawn from the OS's secret randomness (never from a caller's seed, which an
    agent may know), and reserved with an exclusive ``flock`` on
    ``<tmp>/agentinfra-uids-<our uid>/<uid>`` held until the fd is closed, so
    concurrent jails in any process never share a uid, and a cleanup that kills
    a uid's processes (`kill_uid`) only reaches that jail's processes.
    """
    folder = _lock_folder()
    folder.mkdir(mode=0o700, exist_ok=True)
    used = set(pids_by_uid())
    for _ in range(1000):
        uid = UID_RANGE[0] + secrets.randbelow(UID_RANGE[1] - UID_RANGE[0])
        if uid in used:
            continue
        fd = os.open(folder / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return uid, fd
    raise UidExhaustedError(
        f"no free sandbox uid in {UID_RANGE} after 1000 draws; too many jails at once"
    )


def signal_uid(uid: int, sig: signal.Signals) -> int:
    """Sends ``sig`` to every process of ``uid``; returns how many there were (zombies included)."""
    pids = pids_by_uid().get(uid, [])
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return len(pids)


def kill_uid(uid: int) -> int:
    """SIGKILLs every process of ``uid``; returns how many were still there (zombies included)."""
    return signal_uid(uid, signal.SIGKILL)


def uid_is_orphaned(uid: int) -> bool:
    """Whether ``uid`` was reserved on this machine (`reserve_uid`) and no live jail holds it now.

    The reservation is an exclusive ``flock`` that dies with the process that took it,
    so a lock file we can lock belongs to a jail whose owner is gone (killed with
    ``kill -9``): its uid's processes are orphans. A uid never reserved here
    (another user's jail) is not ours, and reads False.
    """
    try:
        fd = os.open(_lock_folder() / str(uid), os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops the lock we may have taken
    return True

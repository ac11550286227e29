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

__all__ = ["UID_RANGE", "kill_uid", "reserve_uid", "signal_uid"]

UID_RANGE = (200_000, 260_000)


def reserve_uid() -> tuple[int, int]:
    """A uid no live process uses and no other jail on this machine holds, and its lock's fd.

    Drawn from the OS's secret randomness (never from a caller's seed, which an
    agent may know), and reserved with an exclusive ``flock`` on
    ``<tmp>/agentinfra-uids-<our uid>/<uid>`` held until the fd is closed, so
    concurrent jails in any process never share a uid, and a cleanup that kills
    a uid's processes (`kill_uid`) only reaches that jail's processes.
    """
    folder = Path(tempfile.gettempdir()) / f"agentinfra-uids-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    used: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                used.add(os.stat(f"/proc/{entry}").st_uid)
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
    found = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found += 1
                    os.kill(int(entry), sig)
    return found


def kill_uid(uid: int) -> int:
    """SIGKILLs every process of ``uid``; returns how many were still there (zombies included)."""
    return signal_uid(uid, signal.SIGKILL)

"""After a crash: the jails a dead process left behind are killed.

A jail holds its uid with an exclusive ``flock`` on ``<tmp>/agentinfra-uids-<our
uid>/<uid>`` for its whole life (`agentinfra.sandbox`), and the lock dies with the
process that took it. So a process running under a sandbox uid whose lock file
can be locked now belongs to no live jail: it is an orphan (a kernel worker or a
desktop whose service was killed with ``kill -9``), and it is killed. A uid whose
lock is held by a live process (another service, another run) is left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path

from agentinfra.sandbox import UID_RANGE, kill_uid

__all__ = ["sandbox_processes", "sweep_orphaned_jails"]


def sandbox_processes() -> dict[int, list[int]]:
    """Sandbox uid -> pids of the processes running under it."""
    found: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                uid = os.stat(f"/proc/{entry}").st_uid
                if UID_RANGE[0] <= uid < UID_RANGE[1]:
                    found.setdefault(uid, []).append(int(entry))
    return found


def _is_unowned(uid: int) -> bool:
    path = Path(tempfile.gettempdir()) / f"agentinfra-uids-{os.getuid()}" / str(uid)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False  # not a uid we reserved (another user's jail): not ours to kill
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops the lock we may have taken
    return True


def sweep_orphaned_jails() -> list[int]:
    """Kills every process under a sandbox uid that no live jail holds; returns those uids."""
    swept = []
    for uid in sorted(sandbox_processes()):
        if _is_unowned(uid):
            kill_uid(uid)
            swept.append(uid)
    return swept

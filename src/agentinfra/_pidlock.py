"""One live owner per directory: an exclusive ``flock`` on a lock file that holds the owner's pid.

The lock dies with its process (kill -9 included), so there are no stale locks to
clean up; the pid in the file only makes the refusal message useful.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["try_lock"]


def try_lock(path: Path) -> int | str:
    """Locks ``path`` (created if absent) for this process.

    Returns:
        The open file descriptor holding the lock, or, when another live process
        holds it, that process's pid as text (the caller raises its own error).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        return holder
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd

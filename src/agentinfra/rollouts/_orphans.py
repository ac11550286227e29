"""After a crash: the jails a dead process left behind are killed.

A jail holds its uid with an exclusive ``flock`` on ``<tmp>/agentinfra-uids-<our
uid>/<uid>`` for its whole life (`agentinfra.sandbox`), and the lock dies with the
process that took it. So a process running under a sandbox uid whose lock file
can be locked now belongs to no live jail: it is an orphan (a kernel worker or a
desktop whose service was killed with ``kill -9``), and it is killed. A uid whose
lock is held by a live process (another service, another run) is left alone.
"""

from __future__ import annotations

from agentinfra.sandbox import UID_RANGE, kill_uid, pids_by_uid, uid_is_orphaned

__all__ = ["sandbox_processes", "sweep_orphaned_jails"]


def sandbox_processes() -> dict[int, list[int]]:
    """Sandbox uid -> pids of the processes running under it (`agentinfra.sandbox.pids_by_uid`)."""
    return {uid: pids for uid, pids in pids_by_uid().items() if UID_RANGE[0] <= uid < UID_RANGE[1]}


def sweep_orphaned_jails() -> list[int]:
    """Kills every process under a sandbox uid that no live jail holds; returns those uids."""
    swept = []
    for uid in sorted(sandbox_processes()):
        if uid_is_orphaned(uid):
            kill_uid(uid)
            swept.append(uid)
    return swept

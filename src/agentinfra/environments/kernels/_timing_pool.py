"""The timing pool's files: memfds made here, sealed here, and the sockets that carry them.

One `TimingPool` per grading owns every descriptor the timing inputs travel in:
the pool file (a memfd the reference fills from secret seeds), on CUDA the
read-only descriptor the candidate maps, and this process's ends of the two Unix
sockets that carry descriptors to the reference (0) and the candidate (1). On a
CPU each side gets a sealed copy of a batch's bytes made just before that side
stages it (the same way for both, so both stage alike) and closed here once sent:
the worker's mapping keeps it until its next batch. So the copies alive at once
are the batch each side maps and the one being made, not two of the whole pool
(made up front, they and the pool were 15 GiB of the 24.2 GiB first reserved for
`level1/3_Batched_matrix_multiplication`).
Invariant: a file reaches the candidate only after it is sealed (no write, resize
or further seal, by anyone); a memfd can be reopened writable through
``/proc/self/fd``, so the seal, not the read-only descriptor, is what holds.
`close` closes all of it. It speaks to no worker itself: the orchestrator sends the
requests; this class makes, seals and sends the files.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Literal

from agentinfra.environments.kernels._verdict import Outcome, StopGradingError

__all__ = ["REFERENCE", "CANDIDATE", "Side", "Staging", "TimingPool"]

Side = Literal[0, 1]
REFERENCE: Side = 0
CANDIDATE: Side = 1


@dataclass(slots=True)
class Staging:
    """Staged timing inputs (CPU): each batch's byte range in the pool file."""

    per_batch: int
    size: int
    ranges: list[tuple[int, int]] = field(default_factory=list)
    """Per batch: (start, length) in the pool file."""


class TimingPool:
    """The descriptors of one grading's timing inputs (module docstring)."""

    def __init__(self) -> None:
        self._fds: list[int] = []
        """The pool file (and on CUDA the candidate's read-only descriptor), closed by `close`."""
        self._sockets: list[socket.socket] = []
        """Our ends of the Unix sockets that carry the pool file to the reference and the candidate."""
        self.pool: int | None = None
        self.staging: Staging | None = None

    def worker_sockets(self) -> list[socket.socket]:
        """The workers' ends of two fresh descriptor sockets (reference, candidate); the caller
        closes them once the workers hold them."""
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(2)]
        self._sockets = [ours for ours, _ in pairs]
        return [theirs for _, theirs in pairs]

    def create(self) -> None:
        """A fresh, empty pool file, sent to the reference to fill; the previous round's pool
        (and on CUDA its read-only descriptor) is closed first, so one pool is alive at a time."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self.pool = os.memfd_create("agentinfra-pool", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self._fds.append(self.pool)
        self.send_fd(REFERENCE, self.pool)

    def seal_pool(self, size: int) -> None:
        """Seals the pool file the reference filled with ``size`` bytes (`seal`)."""
        assert self.pool is not None
        self.seal(self.pool, size)

    def split(self, starts: list[int], total: int, per_batch: int, size: int) -> None:
        """The batches' byte ranges, batch ``i`` from ``starts[i]`` to the next start (within the pool)."""
        assert self.pool is not None
        if len(starts) != -(-size // per_batch):
            raise StopGradingError(
                Outcome.GRADER_ERROR, f"reference pool has {len(starts)} batch starts"
            )
        ends = [*starts[1:], total]
        if any(not 0 <= start <= end <= total for start, end in zip(starts, ends, strict=True)):
            raise StopGradingError(
                Outcome.GRADER_ERROR,
                f"reference pool's batch starts {starts} leave its {total} bytes",
            )
        self.staging = Staging(per_batch=per_batch, size=size)
        self.staging.ranges = [
            (start, end - start) for start, end in zip(starts, ends, strict=True)
        ]

    def send_readonly_to_candidate(self) -> None:
        """A read-only descriptor of the (sealed) pool file, sent to the candidate (CUDA)."""
        readonly = os.open(f"/proc/self/fd/{self.pool}", os.O_RDONLY | os.O_CLOEXEC)
        self._fds.append(readonly)
        self.send_fd(CANDIDATE, readonly)

    def stage(self, index: int, side: Side) -> dict[str, Any]:
        """Sends ``side`` its copy of batch ``index`` and returns the ``stage`` request to go with it."""
        staging = self.staging
        assert staging is not None
        assert self.pool is not None
        start, length = staging.ranges[index]
        first = index * staging.per_batch
        # made now, for this side alone, the same way for both sides; once sent the
        # in-flight message and then the worker's mapping hold it, not this process
        copy = self.batch_file(self.pool, start, length)
        try:
            self.send_fd(side, copy)
        finally:
            os.close(copy)
        return {"op": "stage", "first": first, "count": min(staging.per_batch, staging.size - first),
                "length": length, "base": start}  # fmt: skip

    def seal(self, fd: int, size: int) -> None:
        """No write, resize or further seal from here on, by anyone holding it; the size is the
        reference's account. Only then does the candidate receive it: a memfd can be reopened
        writable through ``/proc/self/fd``, so a read-only descriptor alone would not hold."""
        seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        if os.fstat(fd).st_size != size:
            raise StopGradingError(
                Outcome.GRADER_ERROR, f"pool file holds {os.fstat(fd).st_size} bytes, not {size}"
            )

    def batch_file(self, pool: int, start: int, length: int) -> int:
        """A sealed copy of ``length`` bytes of the pool file at ``start``: one batch's inputs.
        The caller closes it."""
        fd = os.memfd_create("agentinfra-batch", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            self._copy(pool, fd, start, length)
            self.seal(fd, length)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _copy(self, pool: int, fd: int, start: int, length: int) -> None:
        offset = 0
        while offset < length:
            try:
                copied = os.copy_file_range(pool, fd, length - offset, start + offset, offset)
            except OSError:  # a kernel without copy_file_range between these files: through here
                chunk = os.pread(pool, min(length - offset, 1 << 24), start + offset)
                copied = os.pwrite(fd, chunk, offset) if chunk else 0
            if copied <= 0:
                raise StopGradingError(
                    Outcome.GRADER_ERROR, "pool file ended while copying a batch"
                )
            offset += copied

    def send_fd(self, side: Side, fd: int) -> None:
        """``fd`` to the reference (0) or the candidate (1); a worker gone is noticed by its next frame."""
        with contextlib.suppress(OSError):
            socket.send_fds(self._sockets[side], [b"pool"], [fd])

    def close(self) -> None:
        """Closes every descriptor and socket end this pool made."""
        while self._fds:
            os.close(self._fds.pop())
        for sock in self._sockets:
            sock.close()
        self._sockets = []
        self.pool = None

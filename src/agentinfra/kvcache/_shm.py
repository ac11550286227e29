"""The same-host path: GETs answered through a shared-memory segment instead of the socket.

An engine on the cache server's machine connects to the server's Unix socket
(``kv serve --shm-socket PATH``) and, before anything else, hands the server a
segment of its own memory: a sealed memfd, passed as a file descriptor
(``SCM_RIGHTS``) with an 8-byte preamble. From then on the connection speaks the
protocol as over TCP (HELLO first, tokens and tenants alike), plus ``GET_SHM``:
the server writes the verified leading run into the segment at the offset the
client names, in the layout a GET answer has, and answers with the count only.

Why a segment per connection, owned by the client, and not the store's memory
mapped into engines: the server writes only what that connection's tenant may
read, so tenants stay isolated by key derivation exactly as over TCP, and no
engine ever maps another tenant's blocks. The seals (no shrink, no grow) mean the
client cannot truncate the segment under the server's writes (no SIGBUS in the
server). The client verifies every block where it lands, as over TCP.

Pure helpers, no asyncio: the server's accept loop and the reader use them.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from agentinfra.errors import ConfigError, ProtocolError
from agentinfra.kvcache._protocol import Status

__all__ = [
    "PREAMBLE",
    "Segment",
    "adopt_segment",
    "create_segment",
    "send_segment",
    "write_blocks",
]

PREAMBLE = b"AIKPSHM1"
"""The 8 bytes a client sends first on the Unix socket, with the segment's descriptor."""
REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_PAGE = mmap.PAGESIZE


@dataclass
class Segment:
    """A mapped memfd: the client's (it created it) or the server's view of a client's."""

    fd: int
    size: int
    memory: mmap.mmap

    @property
    def view(self) -> memoryview:
        return memoryview(self.memory)

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a view is still held: it goes with the last
            self.memory.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def create_segment(size: int) -> Segment:
    """A sealed, pre-faulted memfd of ``size`` bytes, mapped (the client side).

    Raises:
        ConfigError: ``size`` is not positive, or the kernel refuses the memfd.
    """
    if size < _PAGE:
        raise ConfigError(f"a shared segment of {size} bytes is below one page ({_PAGE})")
    try:
        fd = os.memfd_create("agentinfra-kv", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as exc:
        raise ConfigError(
            f"cannot create a shared segment (memfd_create): {exc.strerror}"
        ) from None
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS | fcntl.F_SEAL_SEAL)
        memory = mmap.mmap(fd, size)
    except OSError as exc:
        os.close(fd)
        raise ConfigError(f"cannot size a shared segment of {size} bytes: {exc.strerror}") from None
    memory.madvise(mmap.MADV_WILLNEED)
    view = memoryview(memory)
    view[::_PAGE] = b"\0" * len(range(0, size, _PAGE))  # fault every page now, not in a load
    view.release()
    return Segment(fd, size, memory)


def send_segment(sock: socket.socket, segment: Segment) -> None:
    """Hands ``segment`` to the server over its Unix socket, before HELLO."""
    socket.send_fds(sock, [PREAMBLE], [segment.fd])


def adopt_segment(fds: list[int], preamble: bytes, max_bytes: int) -> Segment:
    """The server's mapping of the one descriptor a client sent with ``preamble``.

    Takes ownership of ``fds`` (closes the rest, and all of them on refusal).

    Raises:
        ProtocolError: ``BAD_REQUEST`` in one line: another preamble, not exactly one
            descriptor, not a sealed memfd, or a size over ``max_bytes`` (``--shm-max``).
    """
    try:
        if preamble != PREAMBLE:
            raise ProtocolError(
                Status.BAD_REQUEST,
                f"the shared-memory socket expects the {PREAMBLE!r} preamble with a segment first, "
                f"got {preamble[:8]!r} (TCP clients use --port)",
            )
        if len(fds) != 1:
            raise ProtocolError(
                Status.BAD_REQUEST, f"the preamble carried {len(fds)} descriptors, not 1"
            )
        fd = fds[0]
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            raise ProtocolError(
                Status.BAD_REQUEST, "the segment is not a memfd (memfd_create with sealing)"
            ) from None
        if seals & REQUIRED_SEALS != REQUIRED_SEALS:
            raise ProtocolError(
                Status.BAD_REQUEST,
                "the segment must be sealed against shrinking and growing "
                "(F_SEAL_SHRINK | F_SEAL_GROW)",
            )
        size = os.fstat(fd).st_size
        if not 0 < size <= max_bytes:
            raise ProtocolError(
                Status.BAD_REQUEST,
                f"a segment of {size} bytes is over this server's {max_bytes} (kv serve --shm-max)",
            )
        try:
            memory = mmap.mmap(fd, size)
        except OSError as exc:
            raise ProtocolError(
                Status.BAD_REQUEST, f"cannot map the segment: {exc.strerror}"
            ) from None
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return Segment(fd, size, memory)


def write_blocks(
    segment: memoryview,
    offset: int,
    capacity: int,
    entries: Iterable[tuple[bytes | bytearray, memoryview]],
) -> tuple[int, int]:
    """Writes a GET answer's ``blocks`` layout (``u32`` count, then ``u64`` size, the 80-byte
    header, the payload per block) into ``segment[offset : offset + capacity]``.

    ``entries`` are (header, payload) in chain order; writing stops before the first that
    does not fit. Returns (blocks written, bytes written).

    Raises:
        ProtocolError: ``BAD_REQUEST`` when the range lies outside the segment.
    """
    if offset < 0 or capacity < 4 or offset + capacity > len(segment):
        raise ProtocolError(
            Status.BAD_REQUEST,
            f"GET_SHM range [{offset}, {offset + capacity}) is outside the {len(segment)}-byte "
            "segment (or under 4 bytes)",
        )
    position, end, count = offset + 4, offset + capacity, 0
    for head, payload in entries:
        size = len(head) + len(payload)
        if position + 8 + size > end:
            break
        segment[position : position + 8] = _U64.pack(size)
        position += 8
        segment[position : position + len(head)] = head
        position += len(head)
        segment[position : position + len(payload)] = payload
        position += len(payload)
        count += 1
    segment[offset : offset + 4] = _U32.pack(count)
    return count, position - offset

"""Frame transport shared by the cache server and client: an asyncio BufferedProtocol.

Why not streams: ``StreamReader.readexactly`` copies a large payload three times
(into its buffer, a slice, then ``bytes``). Here small frames are parsed out of
one read-ahead buffer, and a large payload is received straight into its own
``bytearray`` with ``recv_into`` (no copy), reading on past the event loop's one
read per wakeup while the socket has more of it. A frame is written with
``sendmsg``, header and memoryviews of the stored blocks in one gather (Python
3.11's ``writelines`` joins its arguments, and the transport copies what the
socket does not take at once); the transport's chunked, flow-controlled writes
are the fallback. One frame is written at a time: a pipelined client's
concurrent requests never interleave. See docs/decisions/0005-kv-cache-server.md
and 0028-kv-load-path.md.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Sequence

from agentinfra.errors import TierUnavailableError
from agentinfra.kvcache._protocol import HEADER, FrameHeader, ProtocolError, parse_header

__all__ = ["FrameConnection"]

_READ_AHEAD = 256 * 1024
_WRITE_CHUNK = 1024 * 1024
_GATHER_FROM = 64 * 1024  # smaller frames go through the transport, which sends them at once
_GATHER = 512  # buffers per sendmsg (IOV_MAX is 1024 on Linux)
Buffer = bytes | bytearray | memoryview


class FrameConnection(asyncio.BufferedProtocol):
    """Splits the byte stream into frames and hands each to ``on_frame``.

    ``on_error`` gets a `ProtocolError` for a malformed header (the owner answers
    and closes); ``on_lost`` gets the connection's end. Writers await `drain`.
    """

    def __init__(
        self,
        max_frame_bytes: int,
        on_frame: Callable[[FrameHeader, bytearray | memoryview], None],
        on_error: Callable[[ProtocolError], None],
        on_lost: Callable[[Exception | None], None],
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._on_frame = on_frame
        self._on_error = on_error
        self._on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self._scratch = bytearray(_READ_AHEAD)
        self._scratch_len = 0
        self._header: FrameHeader | None = None
        self._payload: bytearray | memoryview | None = None
        self.sinks: dict[int, memoryview] = {}
        """request id -> caller's buffer: a large answer to that request is received into it."""
        self._filled = 0
        self._failed = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._sending = asyncio.Lock()
        self._socket: socket.socket | None = None
        self._room: asyncio.Future[None] | None = None
        self.closed = False
        self.bytes_received = 0
        self.bytes_sent = 0

    # -- asyncio.BufferedProtocol ------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        raw = transport.get_extra_info("socket")
        if raw is not None and hasattr(socket.socket, "sendmsg"):
            # A duplicate of the transport's descriptor, for gathered writes (same open file:
            # non-blocking, closed with the connection).
            self._socket = socket.socket(
                raw.family, raw.type, raw.proto, fileno=os.dup(raw.fileno())
            )

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._failed:  # the rest of the stream is discarded
            self._scratch_len = 0
            return memoryview(self._scratch)
        if self._payload is not None:
            return memoryview(self._payload)[self._filled :]
        return memoryview(self._scratch)[self._scratch_len :]

    def buffer_updated(self, nbytes: int) -> None:
        self.bytes_received += nbytes
        if self._failed:
            return
        if self._payload is not None:
            self._filled += nbytes
            self._receive_payload()
            return
        self._scratch_len += nbytes
        self._drain_scratch()
        if self._payload is not None:  # a large frame began: take what else has arrived
            self._receive_payload()

    def _receive_payload(self) -> None:
        """Reads what the socket has of the large payload, and hands it on once it is whole."""
        header, payload = self._header, self._payload
        assert header is not None
        assert payload is not None
        self._drain_payload(payload)
        if self._filled == len(payload):
            self._header, self._payload = None, None
            self._on_frame(header, payload)

    def _drain_payload(self, payload: bytearray | memoryview) -> None:
        """Receives more of ``payload`` at once, until the socket has no more for now.

        The event loop reads once per wakeup, and a 2 MiB answer on loopback arrives in
        about ten pieces: each read here skips a loop iteration and its poll (decision 0028).
        """
        if self._socket is None:
            return
        view = memoryview(payload)
        while self._filled < len(payload) and not self.closed:
            try:
                got = self._socket.recv_into(view[self._filled :])
            except OSError:  # nothing more for now (EAGAIN), or a failure the transport reports
                return
            if not got:
                return
            self.bytes_received += got
            self._filled += got

    def _drain_scratch(self) -> None:
        scratch = self._scratch
        position = 0
        while self._scratch_len - position >= HEADER.size:
            try:
                header = parse_header(
                    memoryview(scratch)[position : position + HEADER.size], self.max_frame_bytes
                )
            except ProtocolError as exc:
                self._failed = True
                self._on_error(exc)
                return
            position += HEADER.size
            available = self._scratch_len - position
            if header.payload_len <= available:
                small = scratch[position : position + header.payload_len]
                position += header.payload_len
                self._on_frame(header, small)
                if self._failed or self.closed:
                    return
                continue
            sink = self.sinks.pop(header.request_id, None)
            if sink is not None and len(sink) >= header.payload_len:
                payload: bytearray | memoryview = sink[: header.payload_len]
            else:
                payload = bytearray(header.payload_len)
            payload[:available] = memoryview(scratch)[position : self._scratch_len]
            position = self._scratch_len
            self._header, self._payload, self._filled = header, payload, available
            break
        remaining = self._scratch_len - position
        if position and remaining:
            scratch[:remaining] = scratch[position : self._scratch_len]
        self._scratch_len = remaining

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._writable.set()
        if self._socket is not None:
            if self._room is not None:  # a gathered write waits on this descriptor
                asyncio.get_running_loop().remove_writer(self._socket.fileno())
                if not self._room.done():
                    self._room.set_result(None)
            self._socket.close()
        self._on_lost(exc)

    def eof_received(self) -> bool:
        return False

    # -- writing -----------------------------------------------------------------

    def write(self, pieces: Sequence[Buffer]) -> None:
        """Queues the pieces of one frame, in order, without joining them."""
        if self.closed or self.transport is None or self.transport.is_closing():
            raise TierUnavailableError("the connection to the kv server is closed")
        for piece in pieces:
            if len(piece):
                self.transport.write(piece)
                self.bytes_sent += len(piece)

    async def send(self, pieces: Sequence[Buffer]) -> None:
        """Writes one frame's pieces, whole, before any other frame; waits while the socket is full."""
        async with self._sending:
            views = [memoryview(p).cast("B") for p in pieces if len(p)]
            if sum(len(v) for v in views) < _GATHER_FROM:  # one small write: one send
                views = [memoryview(b"".join(views))]
            elif (
                self._socket is not None
                and self.transport is not None
                and not self.transport.is_closing()
                and not self.transport.get_write_buffer_size()
            ):
                views = await self._gather(views)
            await self._chunked(views)

    async def _gather(self, views: list[memoryview]) -> list[memoryview]:
        """Sends with ``sendmsg`` straight from the pieces, waiting for room on the socket;
        returns what is left for the transport if the socket fails (the transport then reports it)."""
        assert self._socket is not None
        loop = asyncio.get_running_loop()
        fd = self._socket.fileno()
        while views:
            try:
                sent = self._socket.sendmsg(views[:_GATHER])
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                return views
            self.bytes_sent += sent
            while sent and views:
                if sent >= len(views[0]):
                    sent -= len(views.pop(0))
                else:
                    views[0], sent = views[0][sent:], 0
            if views:
                self._room = room = loop.create_future()
                loop.add_writer(fd, _wake, room)
                try:
                    await room
                finally:
                    self._room = None
                    if not self.closed:
                        loop.remove_writer(fd)
                if self.closed:
                    raise TierUnavailableError("the connection to the kv server is closed")
        return views

    async def _chunked(self, views: list[memoryview]) -> None:
        """Through the transport, in chunks: handing it a 32 MiB view at once would copy most
        of it into a fresh (page-faulting) allocation."""
        for view in views:
            for start in range(0, len(view), _WRITE_CHUNK):
                self.write([view[start : start + _WRITE_CHUNK]])
                if not self._writable.is_set():
                    await self.drain()
        await self.drain()

    async def drain(self) -> None:
        await self._writable.wait()
        if self.closed:
            raise TierUnavailableError("the connection to the kv server is closed")

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _wake(room: asyncio.Future[None]) -> None:
    if not room.done():
        room.set_result(None)

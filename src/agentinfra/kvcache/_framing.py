"""Frame transport shared by the cache server and client: an asyncio BufferedProtocol.

Why not streams: ``StreamReader.readexactly`` copies a large payload three times
(into its buffer, a slice, then ``bytes``). Here small frames are parsed out of
one read-ahead buffer, and a large payload is received straight into its own
``bytearray`` with ``recv_into`` (no copy). Writes go piece by piece (header,
then memoryviews of the stored blocks) because Python 3.11's ``writelines``
joins its arguments. See docs/decisions/0005-kv-cache-server.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from agentinfra.errors import TierUnavailableError
from agentinfra.kvcache._protocol import HEADER, FrameHeader, ProtocolError, parse_header

__all__ = ["FrameConnection"]

_READ_AHEAD = 256 * 1024
_WRITE_CHUNK = 1024 * 1024
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
        self.closed = False
        self.bytes_received = 0
        self.bytes_sent = 0

    # -- asyncio.BufferedProtocol ------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._payload is not None:
            return memoryview(self._payload)[self._filled :]
        return memoryview(self._scratch)[self._scratch_len :]

    def buffer_updated(self, nbytes: int) -> None:
        self.bytes_received += nbytes
        if self._failed:
            return
        if self._payload is not None:
            self._filled += nbytes
            if self._filled == len(self._payload):
                header, payload = self._header, self._payload
                self._header, self._payload = None, None
                assert header is not None
                self._on_frame(header, payload)
            return
        self._scratch_len += nbytes
        self._drain_scratch()

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
        """Writes one frame's pieces in chunks, waiting whenever the transport is full.

        Chunking keeps the transport's own buffer small: handing it a 32 MiB view
        at once would copy most of it into a fresh (page-faulting) allocation.
        """
        for piece in pieces:
            view = memoryview(piece).cast("B") if not isinstance(piece, bytes) else piece
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

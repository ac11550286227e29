"""`BlockReader`: bulk GETs received straight into the caller's memory (an engine's paged KV cache).

One blocking connection, for one thread (an engine worker's). Each block's payload
is received with ``recvmsg_into`` into the caller's views of where that block
lives (for vLLM's CPU caches: two slices per layer, K and V), so a load makes no
intermediate copy at all; the kernel's copy out of the socket is the only one.
Then the block is verified where it landed: its size, its key, and its xxh3
checksum streamed over the same views. A block that fails ends the run; the
bytes after it are read into a scratch buffer and dropped, so the stream stays
in step and the connection stays usable. The caller recomputes what was not
verified: memory written by a failed block holds garbage until then.

Requests are pipelined: ``depth`` GETs of ``chunk_blocks`` each are in flight, so
the server sends the next chunk while this thread verifies the last.

On the server's machine, ``shm_socket`` (``kv serve --shm-socket``) takes the
same-host path instead (`agentinfra.kvcache._shm`): the reader hands the server a
sealed segment of ``segment_bytes``, split into ``depth`` slots; each GET_SHM has
the server write a chunk into a slot, and this thread copies each block from
there into its views and verifies it where it landed, as over TCP.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from agentinfra.errors import BlockFormatError, ConfigError, TierUnavailableError
from agentinfra.kvcache._block import HEADER_BYTES, BlockHeader, decode_header
from agentinfra.kvcache._keys import BlockKey
from agentinfra.kvcache._protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    HEADER,
    FrameHeader,
    Op,
    ProtocolError,
    Status,
    decode_error,
    decode_json,
    encode_header,
    encode_hello,
    encode_keys,
    encode_shm_get,
    parse_header,
)
from agentinfra.kvcache._shm import Segment, create_segment, send_segment

__all__ = ["BlockReader", "ReadReport"]

_SCRATCH = 1 << 20
_GATHER = 512
_RECEIVE_BUFFER = 8 << 20
DEFAULT_SEGMENT_BYTES = 3 * (32 << 20) + (64 << 10)
"""Three 32 MiB slots: the vLLM connector's default load (``load_chunk_mib`` 32, ``load_depth`` 3)."""


@dataclass
class ReadReport:
    verified: int = 0
    """Leading blocks received and verified in place."""
    bytes: int = 0
    receive_s: float = 0.0
    """Time in the socket (waiting for and receiving the payloads)."""
    verify_s: float = 0.0
    copy_s: float = 0.0
    """Time copying out of the shared segment (the same-host path only), with the checksum
    streamed over each piece as it lands (``verify_s`` is then 0: the check is in here)."""
    requests: int = 0
    failure: str = ""
    """Why the run stopped short: missing, corrupt or not loadable; empty when it did not."""


class BlockReader:
    """A blocking connection to the cache server for `read_into`. Not thread-safe.

    Raises (from the constructor):
        TierUnavailableError: the server cannot be reached or does not answer.
        ProtocolError: the server refused the token.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 7480,
        *,
        tenant: str = "",
        token: str = "",
        timeout_s: float = 30.0,
        shm_socket: str | None = None,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    ) -> None:
        self.host, self.port = host, port
        self.segment: Segment | None = None
        self.where = shm_socket or f"{host}:{port}"
        if shm_socket:
            self._sock = self._connect_shm(shm_socket, segment_bytes, timeout_s)
        else:
            try:
                self._sock = socket.create_connection((host, port), timeout=timeout_s)
            except OSError as exc:
                raise TierUnavailableError(
                    f"cannot reach the kv server at {host}:{port}: {exc} (is `agentinfra kv serve` running?)"
                ) from None
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with contextlib.suppress(OSError):  # capped by net.core.rmem_max: smaller only slows it
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RECEIVE_BUFFER)
        self._ids = itertools.count(1)
        self._head = bytearray(HEADER.size)
        self._small = bytearray(8 + HEADER_BYTES)
        self._scratch = bytearray(_SCRATCH)
        self.max_frame_bytes = DEFAULT_MAX_FRAME_BYTES
        try:
            request = self._send(Op.HELLO, encode_hello(tenant, token))
            info = decode_json(self._answer(request, Op.HELLO))
        except BaseException:
            self.close()
            raise
        self.server_info: dict[str, Any] = info
        self.max_frame_bytes = min(
            self.max_frame_bytes, int(info.get("max_frame_bytes", 0)) or self.max_frame_bytes
        )

    def _connect_shm(self, path: str, segment_bytes: int, timeout_s: float) -> socket.socket:
        self.segment = create_segment(segment_bytes)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
            send_segment(sock, self.segment)
        except OSError as exc:
            sock.close()
            self.segment.close()
            raise TierUnavailableError(
                f"cannot reach the kv server's shared-memory socket {path}: {exc} "
                "(is `agentinfra kv serve --shm-socket` running on this machine?)"
            ) from None
        return sock

    # -- plumbing ----------------------------------------------------------------

    def _send(self, op: Op, payload: bytes) -> int:
        request_id = next(self._ids)
        self._io(self._sock.sendall, encode_header(op, request_id, len(payload)) + payload)
        return request_id

    def _io(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except TimeoutError:
            self.close()
            raise TierUnavailableError(
                f"the kv server at {self.where} did not answer within "
                f"{self._sock.gettimeout()} s (timeout_s)"
            ) from None
        except OSError as exc:
            self.close()
            raise TierUnavailableError(
                f"connection to the kv server at {self.where}: {exc}"
            ) from None

    def _exactly(self, views: Sequence[memoryview]) -> None:
        """Fills ``views`` in order from the socket (scatter reads, ``_GATHER`` buffers at a time)."""
        pending = [v for v in views if len(v)]
        while pending:
            got = self._io(self._sock.recvmsg_into, pending[:_GATHER])[0]
            if got == 0:
                self.close()
                raise TierUnavailableError(f"the kv server at {self.where} closed the connection")
            while got:
                if got >= len(pending[0]):
                    got -= len(pending.pop(0))
                else:
                    pending[0], got = pending[0][got:], 0

    def _skip(self, count: int) -> None:
        scratch = memoryview(self._scratch)
        while count:
            step = min(count, len(scratch))
            self._exactly([scratch[:step]])
            count -= step

    def _frame(self, request_id: int, op: Op) -> FrameHeader:
        self._exactly([memoryview(self._head)])
        try:
            header = parse_header(self._head, self.max_frame_bytes)
        except ProtocolError:
            self.close()
            raise
        if header.op == Op.ERROR:
            payload = bytearray(header.payload_len)
            self._exactly([memoryview(payload)])
            self.close()  # the server closes after an error frame
            raise decode_error(payload)
        if header.request_id != request_id or header.op != op:
            self.close()
            raise ProtocolError(Status.BAD_FRAME, f"expected the answer to {op.name} #{request_id}, got "
                                f"opcode {header.op} #{header.request_id}")  # fmt: skip
        return header

    def _answer(self, request_id: int, op: Op) -> bytearray:
        header = self._frame(request_id, op)
        payload = bytearray(header.payload_len)
        self._exactly([memoryview(payload)])
        return payload

    # -- the one operation --------------------------------------------------------

    def read_into(
        self,
        keys: Sequence[BlockKey],
        regions: Callable[[int], Sequence[memoryview]],
        *,
        payload_bytes: int,
        chunk_blocks: int = 16,
        depth: int = 2,
        accept: Callable[[BlockHeader], bool] = lambda header: True,
    ) -> ReadReport:
        """Receives the leading run of ``keys`` the server holds, block ``i``'s payload into the views
        ``regions(i)`` (their sizes summing to ``payload_bytes``), verifying each where it lands.

        ``accept`` judges each block's header (an engine checks dtype and layout). Raises
        `TierUnavailableError` when the connection fails; blocks verified before then count.
        """
        if chunk_blocks < 1 or depth < 1:
            raise ConfigError(f"chunk_blocks={chunk_blocks} and depth={depth} must be positive")
        frame_room = (self.max_frame_bytes - 4) // (8 + HEADER_BYTES + payload_bytes)
        if frame_room < 1:
            raise ConfigError(f"a block of {payload_bytes} bytes is over the server's maximum frame "
                              f"{self.max_frame_bytes} (kv serve --max-frame)")  # fmt: skip
        chunk_blocks = min(chunk_blocks, frame_room)
        slot = 0
        if self.segment is not None:
            slot = self.segment.size // depth
            room = (slot - 4) // (8 + HEADER_BYTES + payload_bytes)
            if room < 1:
                raise ConfigError(f"a block of {payload_bytes} bytes does not fit a slot of the "
                                  f"{self.segment.size}-byte shared segment split {depth} ways "
                                  "(segment_bytes, or a smaller depth)")  # fmt: skip
            chunk_blocks = min(chunk_blocks, room)
        report = ReadReport()
        chunks = [(s, min(s + chunk_blocks, len(keys))) for s in range(0, len(keys), chunk_blocks)]
        in_flight: list[int] = []

        def ask(index: int) -> None:
            begin, end = chunks[index]
            wanted = list(keys[begin:end])
            if self.segment is None:
                in_flight.append(self._send(Op.GET, encode_keys(wanted)))
            else:
                where = (index % depth) * slot
                in_flight.append(self._send(Op.GET_SHM, encode_shm_get(where, slot, wanted)))
            report.requests += 1

        for index in range(min(depth, len(chunks))):
            ask(index)
        for index, (begin, end) in enumerate(chunks):
            request_id = in_flight.pop(0)
            op = Op.GET if self.segment is None else Op.GET_SHM
            if report.failure:  # drop the answers already asked for
                self._skip(self._frame(request_id, op).payload_len)
                continue
            if self.segment is None:
                self._chunk(request_id, keys, begin, end, regions, payload_bytes, accept, report)
            else:
                where = (index % depth) * slot
                self._chunk_shm(request_id, keys, begin, end, where, regions, payload_bytes,
                                accept, report)  # fmt: skip
            if not report.failure and index + depth < len(chunks):
                ask(index + depth)
        return report

    def _chunk(
        self,
        request_id: int,
        keys: Sequence[BlockKey],
        begin: int,
        end: int,
        regions: Callable[[int], Sequence[memoryview]],
        payload_bytes: int,
        accept: Callable[[BlockHeader], bool],
        report: ReadReport,
    ) -> None:
        started = time.perf_counter()
        header = self._frame(request_id, Op.GET)
        remaining = header.payload_len
        count_view = memoryview(self._small)[:4]
        self._exactly([count_view])
        count = int.from_bytes(count_view, "little")
        remaining -= 4
        small = memoryview(self._small)
        for position in range(begin, begin + count):
            if report.failure or position >= end:
                report.receive_s += time.perf_counter() - started
                self._skip(remaining)
                return
            self._exactly([small])
            remaining -= len(small)
            size = int.from_bytes(small[:8], "little")
            try:
                block = decode_header(small[8:], length=size)
            except BlockFormatError as exc:
                report.failure = f"not a block: {exc}"
                continue
            if (
                size != HEADER_BYTES + payload_bytes
                or block.key != keys[position]
                or not accept(block)
            ):
                report.failure = "not loadable: another key, size, dtype or layout"
                continue
            views = regions(position)
            self._exactly(views)
            remaining -= payload_bytes
            received = time.perf_counter()
            report.receive_s += received - started
            digest = xxhash.xxh3_64()
            for view in views:
                digest.update(view)
            started = time.perf_counter()
            report.verify_s += started - received
            if digest.intdigest() != block.checksum:
                report.failure = "corrupt: a block failed its checksum where it landed"
                continue
            report.verified += 1
            report.bytes += payload_bytes
        report.receive_s += time.perf_counter() - started
        if remaining:
            self._skip(remaining)
        if count < end - begin and not report.failure:
            report.failure = (
                f"missing: the server holds {count} of the chunk's {end - begin} blocks"
            )

    def _chunk_shm(
        self,
        request_id: int,
        keys: Sequence[BlockKey],
        begin: int,
        end: int,
        where: int,
        regions: Callable[[int], Sequence[memoryview]],
        payload_bytes: int,
        accept: Callable[[BlockHeader], bool],
        report: ReadReport,
    ) -> None:
        """One GET_SHM answer: its blocks are in the slot at ``where``; copy each into its views."""
        assert self.segment is not None
        started = time.perf_counter()
        answer = self._answer(request_id, Op.GET_SHM)
        report.receive_s += time.perf_counter() - started
        if len(answer) != 12:
            self.close()
            raise ProtocolError(Status.BAD_FRAME, f"a GET_SHM answer of {len(answer)} bytes")
        count, written = int.from_bytes(answer[:4], "little"), int.from_bytes(answer[4:], "little")
        segment = self.segment.view
        if count > end - begin or written > self.segment.size - where:
            self.close()
            raise ProtocolError(Status.BAD_FRAME, f"GET_SHM answered {count} blocks in {written} "
                                f"bytes for {end - begin} keys")  # fmt: skip
        position = where + 4
        for index in range(count):
            size = int.from_bytes(segment[position : position + 8], "little")
            try:
                block = decode_header(
                    segment[position + 8 : position + 8 + HEADER_BYTES], length=size
                )
            except BlockFormatError as exc:
                report.failure = f"not a block: {exc}"
                return
            if (
                size != HEADER_BYTES + payload_bytes
                or block.key != keys[begin + index]
                or not accept(block)
            ):
                report.failure = "not loadable: another key, size, dtype or layout"
                return
            copied = time.perf_counter()
            source = position + 8 + HEADER_BYTES
            digest = xxhash.xxh3_64()
            for view in regions(begin + index):  # each piece hashed while it is still in cache
                view[:] = segment[source : source + len(view)]
                digest.update(view)
                source += len(view)
            position = source
            report.copy_s += time.perf_counter() - copied
            if digest.intdigest() != block.checksum:
                report.failure = "corrupt: a block failed its checksum where it landed"
                return
            report.verified += 1
            report.bytes += payload_bytes
        if count < end - begin:
            report.failure = (
                f"missing: the server holds {count} of the chunk's {end - begin} blocks"
            )

    def close(self) -> None:
        self._sock.close()
        if self.segment is not None:
            self.segment.close()

    def __enter__(self) -> BlockReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

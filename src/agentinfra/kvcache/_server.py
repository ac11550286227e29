"""The cache server: a `TieredStore` shared over the protocol in docs/protocol.md.

- asyncio, one `FrameConnection` and one handler task per connection; requests on a
  connection are handled in order (pipelining). The event loop never does disk or
  network I/O and never waits for the store's lock: GET and LEADING_HITS of
  memory-resident blocks run inline only when the lock is free at that instant
  (`TieredStore.try_get_resident`, without re-hashing blocks memory holds
  verified: the client verifies every block it receives); everything else runs
  in a bounded executor.
- Loopback by default. With a token file every connection must say HELLO with a
  known token, and the token decides the tenant. Tenants are isolated by key
  derivation: the store only ever sees ``sha256("AIKT" | tenant | key)``, and the
  block headers are rewritten on the way in and out, so one tenant cannot name
  another's blocks.
- Any malformed, truncated or oversized frame gets an error frame and its
  connection is closed; other connections are unaffected.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from agentinfra import __version__
from agentinfra.errors import BlockFormatError, ConfigError, KVCacheError
from agentinfra.kvcache._block import HEADER_BYTES, decode_header, parse_block
from agentinfra.kvcache._events import EventsConfig, StoreEvents
from agentinfra.kvcache._framing import FrameConnection
from agentinfra.kvcache._keys import BlockKey
from agentinfra.kvcache._metrics import ServerMetrics, serve_metrics
from agentinfra.kvcache._protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    FrameHeader,
    Op,
    ProtocolError,
    Status,
    block_prefix,
    decode_blocks,
    decode_hello,
    decode_keys,
    decode_lineage,
    decode_session,
    decode_shm_get,
    encode_error,
    encode_header,
    encode_json,
    encode_u32,
)
from agentinfra.kvcache._shm import PREAMBLE, Segment, adopt_segment, write_blocks
from agentinfra.kvcache._store import TieredStore
from agentinfra.kvcache._tier_lookup import TierLookup, tenant_prefix

__all__ = ["CacheServer", "ServerConfig", "ServerThread", "load_token_file", "tenant_key"]

logger = logging.getLogger(__name__)
_KEY_OFFSET = 48
_U16 = struct.Struct("<H")
_T = TypeVar("_T")
_MAX_QUEUED_FRAMES = 64
_LARGE_RESPONSE = 1024 * 1024
_SHM_ANSWER = struct.Struct("<IQ")
_PREAMBLE_TIMEOUT_S = 5.0


def tenant_key(tenant: str, key: bytes) -> BlockKey:
    """The store key of a client's block ``key`` for ``tenant`` (docs/protocol.md section 5)."""
    return BlockKey(hashlib.sha256(tenant_prefix(tenant) + key).digest())


def load_token_file(path: Path) -> dict[str, str]:
    """Reads ``TENANT TOKEN`` lines (a lone token means tenant ``default``); returns token -> tenant.

    Raises:
        ConfigError: the file is unreadable, empty, or names a token twice.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read token file {path}: {exc.strerror} (--token-file)") from None
    tokens: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) > 2:
            raise ConfigError(f"{path}:{number}: expected 'TENANT TOKEN' or 'TOKEN' (--token-file)")
        tenant, token = fields if len(fields) == 2 else ("default", fields[0])
        if token in tokens:
            raise ConfigError(f"{path}:{number}: token given twice (--token-file)")
        tokens[token] = tenant
    if not tokens:
        raise ConfigError(f"token file {path} holds no token (--token-file)")
    return tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """How the cache server listens and what it allows."""

    host: str = "127.0.0.1"
    port: int = 7480
    """0 picks a free port (see `CacheServer.port`)."""
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    tokens: Mapping[str, str] | None = None
    """token -> tenant; None accepts any HELLO (its tenant as given, or ``default``)."""
    request_timeout_s: float = 30.0
    max_connections: int = 1024
    workers: int = 4
    """Threads that run store calls (disk reads, checksums)."""
    concurrent_sends: int = 4
    """Large (>= 1 MiB) answers written at once; more interleave and thrash the caches."""
    metrics_port: int | None = None
    """Port of the Prometheus ``/metrics`` endpoint on ``host``; None for none, 0 for any."""
    events: EventsConfig | None = None
    """Publish the memory and disk tiers' blocks as vLLM KV events (ZMQ); None for none."""
    shm_socket: Path | None = None
    """A Unix socket for engines on this machine, whose GETs come through a shared segment
    (docs/protocol.md, section 9); None for none. Created with mode 0600."""
    shm_max_bytes: int = 1 << 30
    """The largest segment a client may hand over."""

    def __post_init__(self) -> None:
        if self.shm_max_bytes < 4096:
            raise ConfigError(f"shm_max_bytes={self.shm_max_bytes} must be >= 4096 (--shm-max)")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port={self.port} must be in 0..65535 (--port)")
        if self.max_frame_bytes < 1024:
            raise ConfigError(
                f"max_frame_bytes={self.max_frame_bytes} must be >= 1024 (--max-frame)"
            )
        if (
            self.request_timeout_s <= 0
            or self.workers < 1
            or self.max_connections < 1
            or self.concurrent_sends < 1
        ):
            raise ConfigError(
                "request_timeout_s, workers, max_connections and concurrent_sends must be positive"
            )


class _Connection:
    def __init__(self, server: CacheServer, segment: Segment | None = None) -> None:
        self.server = server
        self.segment = segment
        """The client's shared segment (a connection on the shm socket); GET_SHM writes there."""
        self.frames: asyncio.Queue[
            tuple[FrameHeader, bytearray | memoryview] | ProtocolError | None
        ] = asyncio.Queue()
        self.tenant: str | None = None
        self.paused = False
        self._counted = (0, 0)
        self.protocol = FrameConnection(
            server.config.max_frame_bytes, self._on_frame, self._on_error, self._on_lost
        )

    def _on_frame(self, header: FrameHeader, payload: bytearray | memoryview) -> None:
        self.frames.put_nowait((header, payload))
        if self.frames.qsize() >= _MAX_QUEUED_FRAMES and not self.paused:
            self.paused = True
            self.protocol.pause_reading()

    def _on_error(self, error: ProtocolError) -> None:
        self.frames.put_nowait(error)

    def _on_lost(self, exc: Exception | None) -> None:
        self.frames.put_nowait(None)

    async def run(self) -> None:
        metrics = self.server.metrics
        metrics.connections.inc()
        try:
            while True:
                item = await self.frames.get()
                if self.paused and self.frames.qsize() < _MAX_QUEUED_FRAMES // 2:
                    self.paused = False
                    self.protocol.resume_reading()
                if item is None:
                    return
                if isinstance(item, ProtocolError):
                    await self._fail(0, item)
                    return
                header, payload = item
                started = time.perf_counter()
                try:
                    pieces = await self._handle(header, payload)
                except ProtocolError as exc:
                    metrics.requests.labels(_op_name(header.op), exc.status.name).inc()
                    await self._fail(header.request_id, exc)
                    return
                except KVCacheError as exc:
                    metrics.requests.labels(_op_name(header.op), "UNAVAILABLE").inc()
                    await self._fail(header.request_id, ProtocolError(Status.UNAVAILABLE, str(exc)))
                    return
                except Exception as exc:  # a bug: answer, log, close this connection only
                    logger.exception("kv server: internal error handling %s", _op_name(header.op))
                    await self._fail(header.request_id, ProtocolError(Status.INTERNAL, repr(exc)))
                    return
                size = sum(len(p) for p in pieces)
                head = encode_header(Op(header.op), header.request_id, size, response=True)
                if size >= _LARGE_RESPONSE:  # bounded: a few large sends at a time, not 64
                    async with self.server.sending:
                        await self.protocol.send([head, *pieces])
                else:
                    await self.protocol.send([head, *pieces])
                ok, latency = self.server.op_metrics(header.op)
                ok.inc()
                self._count_bytes()
                latency.observe(time.perf_counter() - started)
        except KVCacheError:
            return  # the peer went away while we were writing
        finally:
            metrics.connections.dec()
            self._count_bytes()
            self.protocol.close()
            if self.segment is not None:
                self.segment.close()
                metrics.shm_segments.dec()

    def _count_bytes(self) -> None:
        received, sent = self.protocol.bytes_received, self.protocol.bytes_sent
        self.server.metrics.bytes_received.inc(received - self._counted[0])
        self.server.metrics.bytes_sent.inc(sent - self._counted[1])
        self._counted = (received, sent)

    async def _fail(self, request_id: int, error: ProtocolError) -> None:
        payload = encode_error(Status(error.status), str(error).split(": ", 1)[-1])
        with contextlib.suppress(KVCacheError):
            self.protocol.write(
                [encode_header(Op.ERROR, request_id, len(payload), response=True), payload]
            )
            await asyncio.wait_for(self.protocol.drain(), 5.0)
        logger.info("kv server: closing a connection: %s", error)
        self.protocol.close()

    async def _handle(self, header: FrameHeader, payload: bytearray | memoryview) -> list[Any]:
        op = Op(header.op)
        if header.flags & 1:
            raise ProtocolError(Status.BAD_FRAME, "a request must not carry the response flag")
        if op is Op.HELLO:
            return [self._hello(payload)]
        if self.tenant is None:
            raise ProtocolError(Status.UNAUTHORIZED, f"{op.name} before HELLO; send HELLO first")
        tenant = self.tenant
        store, call = self.server.store, self.server.call
        client_keys: list[BlockKey] = []
        keys: list[BlockKey] = []
        if op in (Op.LEADING_HITS, Op.GET, Op.REMOVE, Op.EXPLAIN):
            client_keys = decode_keys(payload)
            keys = [tenant_key(tenant, k) for k in client_keys]
        if op is Op.LEADING_HITS:
            self.server.metrics.queries.inc(len(keys))
            hits = self.server.inline(store.try_leading_hits_resident, keys)
            return [encode_u32(hits if hits is not None else await call(store.leading_hits, keys))]
        if op is Op.GET_SHM:
            if self.segment is None:
                raise ProtocolError(
                    Status.BAD_REQUEST,
                    "GET_SHM needs a connection on the shared-memory socket (kv serve --shm-socket)",
                )
            offset, capacity, client_keys = decode_shm_get(payload)
            keys = [tenant_key(tenant, k) for k in client_keys]
            blocks = await self._get(keys)
            count, written = write_blocks(
                self.segment.view, offset, capacity, self._answered(blocks, client_keys)
            )
            self.server.metrics.shm_bytes.inc(written)
            return [_SHM_ANSWER.pack(count, written)]
        if op is Op.GET:
            blocks = await self._get(keys)
            room = self.server.config.max_frame_bytes - 4
            fit = 0
            for block in blocks:  # a longer run than one frame holds: the client asks again
                room -= 8 + HEADER_BYTES + len(block.payload)
                if room < 0:
                    break
                fit += 1
            pieces: list[Any] = [encode_u32(fit)]
            for head, data in self._answered(blocks[:fit], client_keys):
                pieces += [block_prefix(HEADER_BYTES + len(data)), head, data]
            return pieces
        if op is Op.TIER_HITS:
            return [
                self._tier_hits(tenant, payload)
                or await call(self._tier_hits, tenant, payload, True)
            ]
        if op is Op.LINEAGE:
            return [encode_u32(self._lineage(tenant, payload))]
        if op is Op.PUT:
            return [encode_u32(await call(self._put, tenant, payload))]
        if op is Op.REMOVE:
            return [encode_u32(await call(store.remove, keys))]
        if op is Op.STATS:
            if payload:
                raise ProtocolError(Status.BAD_REQUEST, "STATS takes no payload")
            stats = dataclasses.asdict(await call(store.stats))
            stats["server"] = self.server.describe()
            return [encode_json(stats)]
        if op is Op.SESSION:
            body, session_keys = decode_session(payload)
            scoped = [tenant_key(tenant, k) for k in session_keys]
            return [encode_json(await call(self._session, tenant, body, scoped))]
        if op is Op.EXPLAIN:
            explanation = await call(store.explain_keys, keys)
            result = dataclasses.asdict(explanation)
            if explanation.first_missing is not None:  # name the client's key, not the store's
                result["key"] = client_keys[explanation.first_missing].hex()
            return [encode_json(result)]
        raise ProtocolError(Status.UNKNOWN_OPCODE, f"opcode {op.name} is not a request")

    async def _get(self, keys: list[BlockKey]) -> list[Any]:
        """The leading run of ``keys`` (store keys) for a GET: inline from memory when it can."""
        store = self.server.store
        # Memory holds only blocks verified on their way in, and the client verifies
        # every block it receives: checking them here too would cost as much as the socket.
        found = self.server.inline(functools.partial(store.try_get_resident, verify=False), keys)
        blocks = found if found is not None else await self.server.call(store.get, keys)
        self.server.metrics.queries.inc(len(keys))
        self.server.metrics.hits.inc(len(blocks))
        return blocks

    @staticmethod
    def _answered(
        blocks: Sequence[Any], client_keys: Sequence[BlockKey]
    ) -> Iterator[tuple[bytearray, memoryview]]:
        """Each block as the client gets it: its header naming the client's key, and its payload."""
        for block, key in zip(blocks, client_keys, strict=False):
            head = bytearray(memoryview(block.payload.obj)[:HEADER_BYTES])
            head[_KEY_OFFSET:HEADER_BYTES] = key
            yield head, block.payload

    def _tier_hits(
        self, tenant: str, payload: bytes | bytearray | memoryview, wait: bool = False
    ) -> bytes | None:
        """TIER_HITS: the leading runs (any local tier, memory, disk) as three ``u32``, from the
        server's index of client keys (`TierLookup`), a chunk at a time up to the first miss: a
        lookup costs what it hits, not the prompt's length."""
        data = bytes(payload)
        if len(data) < 4 or len(data) != 4 + 32 * int.from_bytes(data[:4], "little"):
            decode_keys(payload)  # raises the one-line error
        runs = self.server.lookup.runs(tenant, data, wait=wait)
        if runs is None:
            return None
        self.server.metrics.queries.inc((len(data) - 4) // 32)
        return struct.pack("<3I", *runs)

    def _lineage(self, tenant: str, payload: bytes | bytearray | memoryview) -> int:
        """LINEAGE: a saved chain's tokens, for the KV events; 1 when the server publishes them."""
        keys, tokens, block_size, parent = decode_lineage(payload)
        events = self.server.events
        if events is None:
            return 0
        events.announce(
            [tenant_key(tenant, k) for k in keys],
            tokens,
            block_size=block_size,
            parent=None if parent is None else tenant_key(tenant, parent),
            salt=None if tenant == "default" else tenant,
        )
        return 1

    def _session(self, tenant: str, body: dict[str, Any], keys: list[BlockKey]) -> dict[str, Any]:
        """An agent's hint, on the store's sessions (ids scoped by tenant, like keys).

        ``begin``: a turn over ``keys`` (prefetched and pinned; answers the verified hit
        run); ``add``: blocks the turn produced; ``end``: the agent waits on a tool,
        its blocks live ``ttl_s`` more in memory; ``close``: done, and its private
        blocks leave memory (``release``, default true). Unknown sessions are opened
        by ``begin`` and ``add`` and ignored by ``end`` and ``close``.
        """
        store = self.server.store
        name = f"{tenant}/{body['session']}"
        session = store.session(name)
        action = body["action"]
        if session is None and action in ("begin", "add"):
            parent = body.get("parent")
            parent_session = (
                store.session(f"{tenant}/{parent}") if isinstance(parent, str) else None
            )
            session = store.open_session(name, parent=parent_session)
        if session is None:
            return {"session": body["session"], "open": False}
        if action == "begin":
            return {"session": body["session"], "open": True, "hits": session.begin_turn(keys)}
        if action == "add":
            session.add(keys)
        elif action == "end":
            session.end_turn(ttl_s=float(body.get("ttl_s", 0.0)))
        else:
            session.close(release_private=bool(body.get("release", True)))
            return {"session": body["session"], "open": False}
        return {"session": body["session"], "open": True}

    def _hello(self, payload: bytearray | memoryview) -> bytes:
        tenant, token = decode_hello(payload)
        tokens = self.server.config.tokens
        if tokens is not None:
            granted = tokens.get(token)
            if granted is None or (tenant and tenant != granted):
                raise ProtocolError(
                    Status.UNAUTHORIZED, "unknown token, or a tenant the token does not grant"
                )
            tenant = granted
        self.tenant = tenant or "default"
        return encode_json({**self.server.describe(), "tenant": self.tenant})

    def _put(self, tenant: str, payload: bytearray | memoryview) -> int:
        items: list[tuple[BlockKey, bytes]] = []
        clients: list[bytes] = []
        for view in decode_blocks(payload):
            try:
                header = decode_header(view)
            except BlockFormatError as exc:
                raise ProtocolError(Status.BAD_BLOCK, str(exc)) from None
            if parse_block(view) is None:
                raise ProtocolError(
                    Status.BAD_BLOCK, f"block {header.key.hex()[:16]} fails its checksum"
                )
            key = tenant_key(tenant, header.key)
            clients.append(header.key)
            view[_KEY_OFFSET:HEADER_BYTES] = key
            items.append((key, bytes(view)))
        lookup = self.server.lookup
        lookup.expect(tenant, zip(clients, (key for key, _ in items), strict=True))
        try:
            return self.server.store.put_encoded(items)
        finally:
            lookup.settle([key for key, _ in items])


def _listen_unix(path: Path) -> socket.socket:
    """A listening Unix socket at ``path`` (mode 0600); a stale socket file there is replaced.

    Raises:
        ConfigError: something other than a socket is there, another server listens there,
            or the directory refuses it (``--shm-socket``).
    """
    if path.is_socket():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # nobody listens: a crashed server's
        else:
            raise ConfigError(f"another server listens on {path} (--shm-socket)")
        finally:
            probe.close()
    elif path.exists():
        raise ConfigError(f"{path} exists and is not a socket; choose another --shm-socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)
        try:
            listener.bind(str(path))
        finally:
            os.umask(old)
        listener.listen(128)
        listener.setblocking(False)
    except OSError as exc:
        listener.close()
        raise ConfigError(f"cannot listen on {path}: {exc.strerror} (--shm-socket)") from None
    return listener


async def _receive_fds(
    loop: asyncio.AbstractEventLoop, conn: socket.socket, size: int
) -> tuple[bytes, list[int]]:
    """``size`` bytes and the descriptors that came with them, from a non-blocking Unix socket.
    On any failure (a cancellation included) the descriptors received so far are closed."""
    data, fds = b"", []
    try:
        while len(data) < size:
            ready = loop.create_future()
            loop.add_reader(conn.fileno(), _wake_once, ready)
            try:
                await ready
            finally:
                loop.remove_reader(conn.fileno())
            try:
                got, more, flags, _ = socket.recv_fds(conn, size - len(data), 4)
            except BlockingIOError:
                continue
            fds += more
            if flags & socket.MSG_CTRUNC:
                raise ProtocolError(Status.BAD_REQUEST, "the preamble carried over 4 descriptors")
            if not got:
                raise ProtocolError(Status.BAD_REQUEST, "the connection closed before its preamble")
            data += got
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return data, fds


def _wake_once(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


def _log_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.error("writing deferred blocks failed: %s", future.exception())


def _op_name(op: int) -> str:
    return Op(op).name if op in Op._value2member_map_ else str(op)


class CacheServer:
    """Serves one `TieredStore`; ``async with CacheServer(...)`` starts and stops it."""

    def __init__(self, store: TieredStore, config: ServerConfig | None = None) -> None:
        self.store = store
        self.config = config or ServerConfig()
        self.metrics = ServerMetrics(store)
        self._op_metrics: dict[int, tuple[Any, Any]] = {}
        self.port = self.config.port
        self.metrics_port: int | None = None
        self._executor = ThreadPoolExecutor(self.config.workers, thread_name_prefix="kv-store")
        self._server: asyncio.Server | None = None
        self._shm_listener: socket.socket | None = None
        self._metrics_server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections: set[_Connection] = set()
        self.sending = asyncio.Semaphore(self.config.concurrent_sends)
        self.events: StoreEvents | None = None
        """The KV-event publisher while the server runs with ``config.events``."""
        self.lookup = TierLookup(store)
        """TIER_HITS by client keys; the store's watch listener while the server runs."""

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "server": f"agentinfra {__version__}",
            "protocol": PROTOCOL_VERSION,
            "max_frame_bytes": self.config.max_frame_bytes,
            "connections": len(self._connections),
        }
        if self.events is not None:
            described["events"] = {"endpoint": self.events.endpoint,
                                   "replay": self.events.replay_endpoint, **self.events.counts}  # fmt: skip
        return described

    def op_metrics(self, op: int) -> tuple[Any, Any]:
        """The OK-request counter and the latency histogram of ``op``, looked up once (labels() is slow)."""
        found = self._op_metrics.get(op)
        if found is None:
            name = _op_name(op)
            found = self._op_metrics[op] = (
                self.metrics.requests.labels(name, "OK"),
                self.metrics.latency.labels(name),
            )
        return found

    def inline(
        self, attempt: Callable[[Sequence[BlockKey]], _T | None], keys: Sequence[BlockKey]
    ) -> _T | None:
        """Runs a store call that never waits or does I/O (`TieredStore.try_get_resident`) on the
        loop; None sends the request to the executor. Deferred disk writes go to the executor."""
        result = attempt(keys)
        if self.store.has_deferred_writes:
            future = asyncio.get_running_loop().run_in_executor(
                self._executor, self.store.flush_deferred
            )
            future.add_done_callback(_log_failure)
        return result

    async def call(self, function: Callable[..., _T], *args: Any) -> _T:
        """Runs a store call in the bounded executor (it may wait for the lock, disk or the network)."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, function, *args)
        try:
            return await asyncio.wait_for(future, self.config.request_timeout_s)
        except TimeoutError:
            raise ProtocolError(
                Status.UNAVAILABLE, f"store call took over {self.config.request_timeout_s}s"
            ) from None

    def _accept(self, segment: Segment | None = None) -> asyncio.BufferedProtocol:
        connection = _Connection(self, segment)
        if len(self._connections) >= self.config.max_connections:
            error = ProtocolError(
                Status.UNAVAILABLE, f"over {self.config.max_connections} connections"
            )
            connection.frames.put_nowait(error)
        self._connections.add(connection)
        task = asyncio.get_running_loop().create_task(connection.run())
        self._tasks.add(task)

        def finished(done: asyncio.Task[None]) -> None:
            self._tasks.discard(done)
            self._connections.discard(connection)

        task.add_done_callback(finished)
        return connection.protocol

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                self._accept,
                self.config.host,
                self.config.port,
                reuse_address=True,
                family=socket.AF_INET,
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {self.config.host}:{self.config.port}: {exc.strerror} (--host/--port)"
            ) from None
        self.port = self._server.sockets[0].getsockname()[1]
        if self.config.metrics_port is not None:
            try:
                self._metrics_server = await serve_metrics(
                    self.metrics, self.config.host, self.config.metrics_port
                )
            except OSError as exc:
                self._server.close()
                await self._server.wait_closed()
                raise ConfigError(
                    f"cannot serve metrics on {self.config.host}:{self.config.metrics_port}: "
                    f"{exc.strerror} (--metrics-port)"
                ) from None
            self.metrics_port = self._metrics_server.sockets[0].getsockname()[1]
        if self.config.shm_socket is not None:
            try:
                self._shm_listener = _listen_unix(self.config.shm_socket)
            except ConfigError:
                await self._stop_listening()
                raise
            loop.add_reader(self._shm_listener.fileno(), self._accept_shm, self._shm_listener)
        self.store.watch(self.lookup.changed)
        if self.config.events is not None:
            self.events = StoreEvents(self.config.events)
            self.lookup.forward = self.events.changed
            logger.info("kv server: KV events on %s", self.events.endpoint)
        logger.info("kv server listening on %s:%d", self.config.host, self.port)

    def _accept_shm(self, listener: socket.socket) -> None:
        """Accepts engines waiting on the shared-memory socket (a reader callback, so that a
        connection accepted as the server closes is never dropped unclosed); each hands its
        segment over first, in `_adopt`."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: keep serving, try at the next readiness
                logger.warning("kv server: shm socket accept failed: %s", exc)
                return
            task = loop.create_task(self._adopt(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _adopt(self, conn: socket.socket) -> None:
        """Maps the segment a new shm connection sends with its preamble, then serves it as TCP's."""
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        try:
            preamble, fds = await asyncio.wait_for(
                _receive_fds(loop, conn, len(PREAMBLE)), _PREAMBLE_TIMEOUT_S
            )
            segment = adopt_segment(fds, preamble, self.config.shm_max_bytes)
        except (ProtocolError, TimeoutError, OSError) as exc:
            error = (
                exc
                if isinstance(exc, ProtocolError)
                else ProtocolError(
                    Status.BAD_REQUEST,
                    f"no segment within {_PREAMBLE_TIMEOUT_S} s: {exc or 'timed out'}",
                )
            )
            logger.info("kv server: refusing an shm connection: %s", error)
            payload = encode_error(Status(error.status), str(error).split(": ", 1)[-1])
            with contextlib.suppress(OSError):
                conn.setblocking(True)
                conn.settimeout(1.0)
                conn.sendall(encode_header(Op.ERROR, 0, len(payload), response=True) + payload)
            conn.close()
            return
        if self._shm_listener is None:  # the server closed while this one handed over
            segment.close()
            conn.close()
            return
        self.metrics.shm_segments.inc()
        try:
            await loop.connect_accepted_socket(lambda: self._accept(segment), conn)
        except OSError:
            segment.close()
            self.metrics.shm_segments.dec()
            conn.close()

    async def _stop_listening(self) -> None:
        if self._shm_listener is not None:
            asyncio.get_running_loop().remove_reader(self._shm_listener.fileno())
            self._shm_listener.close()
            self._shm_listener = None
            assert self.config.shm_socket is not None
            with contextlib.suppress(OSError):
                self.config.shm_socket.unlink()
        for server in (self._server, self._metrics_server):
            if server is not None:
                server.close()

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        """Stops accepting, closes every connection, waits for handlers, stops the executor."""
        await self._stop_listening()
        for connection in list(self._connections):
            connection.protocol.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        for server in (self._server, self._metrics_server):
            if server is not None:
                await server.wait_closed()
        self._executor.shutdown(wait=True)
        self.store.watch(None)
        if self.events is not None:
            self.events.close()
            self.events = None

    async def __aenter__(self) -> CacheServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ServerThread:
    """A `CacheServer` on an event loop of its own thread, for sync programs (demos, tests).

    Servers proper run with ``asyncio.run`` (`agentinfra kv serve`); this is for a
    process whose main thread is a sync client of the same server.
    """

    def __init__(self, store: TieredStore, config: ServerConfig | None = None) -> None:
        self._store = store
        self._config = config or ServerConfig(port=0)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self.server: CacheServer | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),))
        self._thread.start()
        self._ready.wait(30)
        if self.server is None:
            self._thread.join(10)
            self._loop.close()
            raise self._failure or ConfigError("the kv server thread did not start within 30 s")

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            async with CacheServer(self._store, self._config) as server:
                self.server = server
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:
            self._failure = exc
            self._ready.set()

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    def close(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self._loop.close()

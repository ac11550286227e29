"""Clients of the cache server: `AsyncCacheClient` and its thin sync wrapper `CacheClient`.

Requests are pipelined: any number may be in flight on one connection, each
answered by request id. Every block a GET returns is verified (checksum and key)
before it is handed out; a block that fails ends the returned run, as a miss.
A connection that drops fails its in-flight requests with `TierUnavailableError`:
the caller gets an error or a miss, never wrong data.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Coroutine, Sequence
from typing import Any, NamedTuple, TypeVar

from agentinfra.errors import ConfigError, TierUnavailableError
from agentinfra.kvcache._block import Block, encode_block, parse_block
from agentinfra.kvcache._framing import FrameConnection
from agentinfra.kvcache._keys import BlockKey
from agentinfra.kvcache._protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    FrameHeader,
    Op,
    ProtocolError,
    Status,
    block_prefix,
    decode_blocks,
    decode_error,
    decode_json,
    decode_u32,
    decode_u32s,
    encode_header,
    encode_hello,
    encode_keys,
    encode_lineage,
    encode_session,
    encode_u32,
)

__all__ = ["AsyncCacheClient", "CacheClient", "TierHits"]

_T = TypeVar("_T")


class TierHits(NamedTuple):
    """Leading runs of a chain of keys, in blocks, as the server's local tiers hold them."""

    any: int
    """Held in memory or on disk (block by block, either)."""
    memory: int
    disk: int


class AsyncCacheClient:
    """One pipelined connection to a cache server. Create it with `connect`."""

    def __init__(self, host: str, port: int, timeout_s: float, max_frame_bytes: int) -> None:
        self.host, self.port = host, port
        self.timeout_s = timeout_s
        self.server_info: dict[str, Any] = {}
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[FrameHeader, bytearray | memoryview]]] = {}
        self._failure: Exception | None = None
        self.max_frame_bytes = max_frame_bytes
        self._protocol = FrameConnection(
            max_frame_bytes, self._on_frame, self._on_error, self._on_lost
        )

    @classmethod
    async def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = 7480,
        *,
        tenant: str = "",
        token: str = "",
        timeout_s: float = 30.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> AsyncCacheClient:
        """Connects and says HELLO.

        Raises:
            TierUnavailableError: the server cannot be reached.
            ProtocolError: the server refused the token (status UNAUTHORIZED).
        """
        client = cls(host, port, timeout_s, max_frame_bytes)
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_connection(lambda: client._protocol, host, port), timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise TierUnavailableError(
                f"cannot reach the kv server at {host}:{port}: {exc or 'timed out'} "
                "(is `agentinfra kv serve` running? --host/--port)"
            ) from None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            info = decode_json(await client._request(Op.HELLO, [encode_hello(tenant, token)]))
            client.server_info = info
            client.max_frame_bytes = min(
                max_frame_bytes, int(info.get("max_frame_bytes", max_frame_bytes))
            )
        except BaseException:
            await client.close()
            raise
        return client

    # -- frame plumbing ----------------------------------------------------------

    def _on_frame(self, header: FrameHeader, payload: bytearray | memoryview) -> None:
        future = self._pending.pop(header.request_id, None)
        if header.op == Op.ERROR and future is None:  # a connection-level error (id 0)
            self._fail_all(decode_error(payload))
            return
        if future is not None and not future.done():
            future.set_result((header, payload))

    def _on_error(self, error: ProtocolError) -> None:
        self._fail_all(TierUnavailableError(f"the kv server sent a malformed frame: {error}"))
        self._protocol.close()

    def _on_lost(self, exc: Exception | None) -> None:
        self._fail_all(
            TierUnavailableError(f"connection to the kv server at {self.host}:{self.port} was lost")
        )

    def _fail_all(self, error: Exception) -> None:
        if self._failure is None:
            self._failure = error
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()

    async def _request(
        self,
        op: Op,
        pieces: Sequence[bytes | bytearray | memoryview],
        into: bytearray | memoryview | None = None,
    ) -> bytearray | memoryview:
        if self._failure is not None:
            raise self._failure
        size = sum(len(p) for p in pieces)
        if size > self.max_frame_bytes:
            raise ConfigError(
                f"{op.name} of {size} bytes is over the server's maximum frame "
                f"{self.max_frame_bytes}; send fewer blocks at once (kv serve --max-frame)"
            )
        request_id = next(self._ids)
        future: asyncio.Future[tuple[FrameHeader, bytearray | memoryview]] = (
            asyncio.get_running_loop().create_future()
        )
        self._pending[request_id] = future
        if into is not None:
            self._protocol.sinks[request_id] = memoryview(into).cast("B")
        # A timer, not asyncio.wait_for: wait_for wraps every request in a task of its own.
        timer = asyncio.get_running_loop().call_later(self.timeout_s, _expire, future)
        try:
            await self._protocol.send([encode_header(op, request_id, size), *pieces])
            header, payload = await future
        except BaseException as exc:
            self._pending.pop(request_id, None)
            self._protocol.sinks.pop(request_id, None)
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()  # retrieved: the caller gets `exc` instead
            if isinstance(exc, TimeoutError):
                raise TierUnavailableError(
                    f"the kv server did not answer {op.name} within {self.timeout_s}s (timeout_s)"
                ) from None
            raise
        finally:
            timer.cancel()
        if header.op == Op.ERROR:
            raise decode_error(payload)
        if header.op != op:
            raise ProtocolError(
                Status.BAD_FRAME, f"answer to {op.name} came back as opcode {header.op}"
            )
        return payload

    # -- operations --------------------------------------------------------------

    async def leading_hits(self, keys: Sequence[BlockKey]) -> int:
        """Leading run of ``keys`` the server holds (unverified; `get` verifies)."""
        return decode_u32(await self._request(Op.LEADING_HITS, [encode_keys(keys)]))

    async def tier_hits(self, keys: Sequence[BlockKey]) -> TierHits:
        """The leading run of ``keys`` each local tier holds (unverified; the remote tier is not
        asked: `leading_hits` is). Costs the server what it hits, not the chain's length."""
        return TierHits(*decode_u32s(await self._request(Op.TIER_HITS, [encode_keys(keys)]), 3))

    async def announce(
        self,
        keys: Sequence[BlockKey],
        tokens: Sequence[int],
        *,
        block_size: int,
        parent: BlockKey | None = None,
    ) -> bool:
        """Tells the server the tokens of the chain ``keys`` (``block_size`` each, after
        ``parent``), so its KV events can name them; False when it publishes none."""
        payload = encode_lineage(keys, tokens, block_size=block_size, parent=parent)
        return decode_u32(await self._request(Op.LINEAGE, [payload])) == 1

    async def get(
        self,
        keys: Sequence[BlockKey],
        *,
        into: bytearray | memoryview | None = None,
        verify: bool = True,
    ) -> list[Block]:
        """The verified leading run of ``keys``.

        ``into``: a buffer the answer is received into without another allocation
        (an engine's staging buffer); the blocks are views of it, valid until the
        buffer is reused. Too small a buffer is ignored. A run larger than the
        server's maximum frame comes back in several answers. ``verify=False``
        checks keys but leaves the checksums to the caller, who must check every
        block before using it (`PagedKVLoader` does, in its own thread).
        """
        blocks: list[Block] = []
        while len(blocks) < len(keys):
            wanted = keys[len(blocks) :]
            views = decode_blocks(await self._request(Op.GET, [encode_keys(wanted)], into))
            into = None  # the first answer's blocks live there
            for key, view in zip(wanted, views, strict=False):
                block = parse_block(view, expected_key=key, verify=verify)
                if block is None:
                    return blocks
                blocks.append(block)
            if not views or len(views) == len(wanted):
                break
        return blocks

    async def put_encoded(
        self, items: Sequence[tuple[BlockKey, bytes | bytearray | memoryview]]
    ) -> int:
        """Stores encoded blocks (a chain, in order); returns how many the server's memory holds.

        Split into frames under the server's maximum frame size.
        """
        stored = 0
        batch: list[bytes | bytearray | memoryview] = []
        size = 4
        for _, data in items:
            if batch and size + 8 + len(data) > self.max_frame_bytes:
                stored += await self._put_batch(batch)
                batch, size = [], 4
            batch += [block_prefix(len(data)), data]
            size += 8 + len(data)
        if batch:
            stored += await self._put_batch(batch)
        return stored

    async def _put_batch(self, pieces: list[bytes | bytearray | memoryview]) -> int:
        return decode_u32(await self._request(Op.PUT, [encode_u32(len(pieces) // 2), *pieces]))

    async def put(self, keys: Sequence[BlockKey], kvs: Sequence[Any]) -> int:
        """Encodes one KV tensor per key and stores the chain."""
        if len(keys) != len(kvs):
            raise ConfigError(f"put got {len(keys)} keys and {len(kvs)} KV tensors")
        return await self.put_encoded(
            [(k, encode_block(k, kv)) for k, kv in zip(keys, kvs, strict=True)]
        )

    async def remove(self, keys: Sequence[BlockKey]) -> int:
        return decode_u32(await self._request(Op.REMOVE, [encode_keys(keys)]))

    async def stats(self) -> dict[str, Any]:
        """The store's counters, each tier's, and the server's."""
        result: dict[str, Any] = decode_json(await self._request(Op.STATS, []))
        return result

    async def explain_keys(self, keys: Sequence[BlockKey]) -> dict[str, Any]:
        """Why the chain ``keys`` does not fully hit on the server."""
        result: dict[str, Any] = decode_json(await self._request(Op.EXPLAIN, [encode_keys(keys)]))
        return result

    async def session(
        self,
        session_id: str,
        action: str,
        keys: Sequence[BlockKey] = (),
        *,
        ttl_s: float = 0.0,
        parent: str | None = None,
        release: bool = True,
    ) -> dict[str, Any]:
        """An agent session hint (docs/protocol.md, SESSION): ``begin`` a turn over ``keys``
        (answers ``hits``), ``add`` its new blocks, ``end`` it (wait ``ttl_s`` on a tool), ``close``."""
        body: dict[str, Any] = {
            "session": session_id,
            "action": action,
            "ttl_s": ttl_s,
            "release": release,
        }
        if parent is not None:
            body["parent"] = parent
        result: dict[str, Any] = decode_json(
            await self._request(Op.SESSION, [encode_session(body, keys)])
        )
        return result

    async def close(self) -> None:
        self._protocol.close()
        self._fail_all(TierUnavailableError("the kv client is closed"))
        await asyncio.sleep(0)

    async def __aenter__(self) -> AsyncCacheClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class CacheClient:
    """The sync face of `AsyncCacheClient`: each call runs on the client's own loop, in the caller's thread."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 7480,
        *,
        tenant: str = "",
        token: str = "",
        timeout_s: float = 30.0,
    ) -> None:
        self._runner = asyncio.Runner()
        try:
            self._client = self._runner.run(
                AsyncCacheClient.connect(
                    host, port, tenant=tenant, token=token, timeout_s=timeout_s
                )
            )
        except BaseException:
            self._runner.close()
            raise

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return self._runner.run(coro)

    @property
    def server_info(self) -> dict[str, Any]:
        return self._client.server_info

    def leading_hits(self, keys: Sequence[BlockKey]) -> int:
        return self._run(self._client.leading_hits(keys))

    def tier_hits(self, keys: Sequence[BlockKey]) -> TierHits:
        return self._run(self._client.tier_hits(keys))

    def announce(
        self,
        keys: Sequence[BlockKey],
        tokens: Sequence[int],
        *,
        block_size: int,
        parent: BlockKey | None = None,
    ) -> bool:
        return self._run(self._client.announce(keys, tokens, block_size=block_size, parent=parent))

    def get(
        self,
        keys: Sequence[BlockKey],
        *,
        into: bytearray | memoryview | None = None,
        verify: bool = True,
    ) -> list[Block]:
        return self._run(self._client.get(keys, into=into, verify=verify))

    def put_encoded(self, items: Sequence[tuple[BlockKey, bytes | bytearray | memoryview]]) -> int:
        return self._run(self._client.put_encoded(items))

    def put(self, keys: Sequence[BlockKey], kvs: Sequence[Any]) -> int:
        return self._run(self._client.put(keys, kvs))

    def remove(self, keys: Sequence[BlockKey]) -> int:
        return self._run(self._client.remove(keys))

    def stats(self) -> dict[str, Any]:
        return self._run(self._client.stats())

    def explain_keys(self, keys: Sequence[BlockKey]) -> dict[str, Any]:
        return self._run(self._client.explain_keys(keys))

    def session(
        self, session_id: str, action: str, keys: Sequence[BlockKey] = (), **options: Any
    ) -> dict[str, Any]:
        return self._run(self._client.session(session_id, action, keys, **options))

    def close(self) -> None:
        try:
            self._run(self._client.close())
        finally:
            self._runner.close()

    def __enter__(self) -> CacheClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())

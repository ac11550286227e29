"""`RedisTier`: blocks in Redis or Valkey (single node or cluster), for many nodes.

Layout (docs/protocol.md section 7): a block of ``n`` bytes is stored as
``ceil(n / chunk_bytes)`` chunk keys ``{prefix}{<key hex>}:<i>`` and, written
last, a meta key ``{prefix}{<key hex>}:m`` holding the chunk count and size. The
``{...}`` hash tag keeps one block's keys on one cluster slot. A reader that
finds the meta key but a missing chunk (evicted by Redis, or a node lost)
reports a miss; the store verifies every block's checksum anyway.

Every key carries a TTL (``ttl_s``); `touch` extends it for a waiting agent
session. Redis being down is not an error here: reads become misses and writes
are rejected (counted in ``errors``), and the tier retries after ``retry_after_s``.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Sequence
from typing import Any

from agentinfra.errors import ConfigError
from agentinfra.kvcache._keys import BlockKey
from agentinfra.kvcache._tier import PutResult, TierCounters, TierStats, copy_into

__all__ = ["RedisTier"]

logger = logging.getLogger(__name__)
_META = struct.Struct("<IQ")


class RedisTier:
    """A `Tier` over redis-py; ``url`` like ``redis://127.0.0.1:6379/0``."""

    name = "redis"
    policy_name = "redis-maxmemory"

    def __init__(
        self,
        url: str,
        *,
        cluster: bool = False,
        chunk_bytes: int = 4 * 1024 * 1024,
        ttl_s: float | None = 3600.0,
        prefix: str = "aikv:",
        retry_after_s: float = 5.0,
        socket_timeout_s: float = 5.0,
    ) -> None:
        try:
            import redis
            import redis.cluster
        except ImportError as exc:  # pragma: no cover - redis is a dependency
            raise ConfigError(
                "the Redis tier needs redis-py: pip install 'agentinfra[redis]'"
            ) from exc
        if chunk_bytes < 4096:
            raise ConfigError(f"chunk_bytes={chunk_bytes} must be >= 4096 (--redis-chunk)")
        if ttl_s is not None and ttl_s <= 0:
            raise ConfigError(f"ttl_s={ttl_s} must be positive or None (--redis-ttl)")
        self.url = url
        self.chunk_bytes = chunk_bytes
        self.ttl_ms = None if ttl_s is None else int(ttl_s * 1000)
        self.prefix = prefix
        self.retry_after_s = retry_after_s
        self.errors = 0
        self._cluster = cluster
        self._down_until = 0.0
        self._counts = TierCounters()
        self._redis_errors: tuple[type[BaseException], ...] = (redis.exceptions.RedisError, OSError)
        options: dict[str, Any] = {
            "socket_timeout": socket_timeout_s,
            "socket_connect_timeout": socket_timeout_s,
        }
        self._nodes_down: dict[str, float] = {}
        try:
            if cluster:
                # No retries inside redis-py: its backoff sleeps about 1 s per command for a dead
                # node (measured: 40 s for one 30-block GET). This tier skips that node instead.
                from redis.backoff import NoBackoff
                from redis.retry import Retry

                options["retry"] = Retry(NoBackoff(), 0)
                self._client: Any = redis.cluster.RedisCluster.from_url(url, **options)
            else:
                self._client = redis.Redis.from_url(url, **options)
        except ValueError as exc:
            raise ConfigError(f"bad Redis URL {url!r}: {exc} (--redis)") from None
        except self._redis_errors as exc:
            self._failed(exc)

    # -- helpers -----------------------------------------------------------------

    def _name(self, key: bytes, suffix: str) -> str:
        return f"{self.prefix}{{{key.hex()}}}:{suffix}"

    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        if self._available():
            logger.warning(
                "Redis tier %s unavailable (%s); treating it as empty for %.0fs",
                self.url,
                exc,
                self.retry_after_s,
            )
        self._down_until = time.monotonic() + self.retry_after_s

    def _pipeline(
        self, commands: Sequence[tuple[str, tuple[Any, ...], dict[str, Any]]]
    ) -> list[Any] | None:
        if not commands:
            return []
        if not self._available():
            return None
        try:
            pipe = self._client.pipeline(transaction=False)
            for method, args, kwargs in commands:
                getattr(pipe, method)(*args, **kwargs)
            results: list[Any] = pipe.execute(raise_on_error=False)
        except self._redis_errors as exc:
            if not self._cluster:
                self._failed(exc)
                return None
            results = self._one_by_one(commands)
        return results

    def _one_by_one(
        self, commands: Sequence[tuple[str, tuple[Any, ...], dict[str, Any]]]
    ) -> list[Any]:
        """A cluster pipeline fails whole when one node is down; retry command by
        command so that only the dead node's blocks are lost. A node that fails is
        skipped for ``retry_after_s``, so a dead host costs one timeout, not one per key."""
        self.errors += 1
        now = time.monotonic()
        results: list[Any] = []
        for method, args, kwargs in commands:
            node = self._node_of(str(args[0]))
            if node is not None and self._nodes_down.get(node, 0.0) > now:
                results.append(None)
                continue
            try:
                results.append(getattr(self._client, method)(*args, **kwargs))
            except self._redis_errors as exc:
                results.append(exc)
                if node is not None:
                    if self._nodes_down.get(node, 0.0) <= now:
                        logger.warning("Redis tier: cluster node %s failed (%s); its blocks are misses "
                                       "for %.0fs", node, exc, self.retry_after_s)  # fmt: skip
                    self._nodes_down[node] = time.monotonic() + self.retry_after_s
        return results

    def _node_of(self, name: str) -> str | None:
        try:
            node = self._client.get_node_from_key(name)
        except self._redis_errors:
            return None
        return None if node is None else str(node.name)

    def _metas(self, keys: Sequence[BlockKey]) -> list[tuple[int, int] | None]:
        results = self._pipeline([("get", (self._name(k, "m"),), {}) for k in keys])
        if results is None:
            return [None] * len(keys)
        metas: list[tuple[int, int] | None] = []
        for result in results:
            ok = isinstance(result, bytes) and len(result) == _META.size
            metas.append(_META.unpack(result) if ok else None)
        return metas

    # -- Tier ----------------------------------------------------------------------

    def leading_hits(self, keys: Sequence[BlockKey]) -> int:
        results = self._pipeline([("exists", (self._name(k, "m"),), {}) for k in keys])
        count = 0
        for result in results or ():
            if result != 1:
                break
            count += 1
        return count

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self.leading_hits([BlockKey(key)]) == 1

    def get(self, keys: Sequence[BlockKey]) -> list[bytes | None]:
        metas = self._metas(keys)
        commands: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
            ("get", (self._name(key, str(i)),), {})
            for key, meta in zip(keys, metas, strict=True)
            if meta is not None
            for i in range(meta[0])
        ]
        chunks = self._pipeline(commands) or [None] * len(commands)
        found: list[bytes | None] = []
        position = 0
        for meta in metas:
            if meta is None:
                found.append(None)
                continue
            count, size = meta
            parts = chunks[position : position + count]
            position += count
            if any(not isinstance(p, bytes) for p in parts):
                found.append(None)
                continue
            data = parts[0] if count == 1 else b"".join(parts)
            found.append(data if len(data) == size else None)
        self._counts.count_reads(found)
        return found

    def get_into(
        self, keys: Sequence[BlockKey], buffers: Sequence[bytearray | memoryview]
    ) -> list[int | None]:
        return copy_into(self.get(keys), buffers)

    def put(
        self,
        items: Sequence[tuple[BlockKey, bytes]],
        parents: Sequence[BlockKey | None] | None = None,
    ) -> PutResult:
        commands: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        expiry = {} if self.ttl_ms is None else {"px": self.ttl_ms}
        for key, data in items:
            view = memoryview(data)
            count = max(1, -(-len(view) // self.chunk_bytes))
            for i in range(count):
                chunk = view[i * self.chunk_bytes : (i + 1) * self.chunk_bytes]
                commands.append(("set", (self._name(key, str(i)), chunk), expiry))
            commands.append(("set", (self._name(key, "m"), _META.pack(count, len(view))), expiry))
        results = self._pipeline(commands)
        if results is None or any(isinstance(r, BaseException) for r in results):
            outcome = PutResult((), tuple(k for k, _ in items), ())
        else:
            outcome = PutResult(tuple(k for k, _ in items), (), ())
            self._counts.bytes_written += sum(len(d) for _, d in items)
        self._counts.count_put(outcome)
        return outcome

    def _stored_names(self, keys: Sequence[BlockKey]) -> tuple[list[str], int]:
        """Every Redis key (meta and chunks) of the blocks of ``keys`` that are held, and how many are."""
        metas = self._metas(keys)
        names = [
            self._name(key, suffix)
            for key, meta in zip(keys, metas, strict=True)
            if meta is not None
            for suffix in ["m", *map(str, range(meta[0]))]
        ]
        return names, sum(meta is not None for meta in metas)

    def remove(self, keys: Sequence[BlockKey]) -> int:
        names, held = self._stored_names(keys)
        self._pipeline([("delete", (name,), {}) for name in names])
        return held

    def touch(self, keys: Sequence[BlockKey], ttl_s: float) -> None:
        """Extends the TTL of ``keys`` (a waiting agent session's blocks) to at least ``ttl_s``."""
        names, _ = self._stored_names(keys)
        ttl_ms = max(int(ttl_s * 1000), self.ttl_ms or 0)
        self._pipeline([("pexpire", (name, ttl_ms), {}) for name in names])

    def stats(self) -> TierStats:
        """Counters of this client; ``blocks`` and ``used_bytes`` are Redis's key count and memory."""
        keys = used = 0
        if self._available():
            try:
                target = {"target_nodes": "primaries"} if self._cluster else {}
                sizes = self._client.dbsize(**target)
                keys = sum(sizes.values()) if isinstance(sizes, dict) else int(sizes or 0)
                info = self._client.info("memory", **target)
                if isinstance(info, dict) and "used_memory" in info:
                    used = int(info["used_memory"])
                else:  # cluster: one dict per node
                    used = sum(int(node.get("used_memory", 0)) for node in info.values())
            except self._redis_errors as exc:
                self._failed(exc)
        return self._counts.snapshot(self.name, blocks=keys, used_bytes=used, capacity_bytes=0)

    def close(self) -> None:
        try:
            self._client.close()
        except self._redis_errors:
            logger.debug("Redis tier %s: error while closing", self.url)

"""`MemoryTier`: encoded blocks in process memory, bounded in bytes.

Blocks are immutable ``bytes`` objects, so a reader's zero-copy view stays valid
even after eviction; pinning (`pin`/`unpin`) keeps a block resident for readers
and active sessions. Single owner, no locks (the `TieredStore` serialises).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

from agentinfra.kvcache._index import BlockIndex
from agentinfra.kvcache._keys import BlockKey
from agentinfra.kvcache._policies import EvictionPolicy, make_policy
from agentinfra.kvcache._tier import PutResult, TierCounters, TierStats, copy_into

__all__ = ["MemoryTier"]


class MemoryTier:
    """Blocks held in a dict, evicted by a policy when ``capacity_bytes`` is reached."""

    name = "memory"

    def __init__(self, capacity_bytes: int, policy: EvictionPolicy | str = "prefix-lru") -> None:
        self._index = BlockIndex(
            capacity_bytes, make_policy(policy) if isinstance(policy, str) else policy
        )
        self._data: dict[BlockKey, bytes] = {}
        self._counts = TierCounters()

    @property
    def policy_name(self) -> str:
        """Name of the eviction policy."""
        return self._index.policy.name

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def leading_hits(self, keys: Sequence[BlockKey]) -> int:
        return self._index.leading_hits(keys)

    def peek(self, key: BlockKey) -> bytes | None:
        """The block's bytes without counting a hit or touching the policy."""
        return self._data.get(key)

    def get(self, keys: Sequence[BlockKey]) -> list[bytes | None]:
        found = [self._data.get(key) for key in keys]
        held = [key for key, data in zip(keys, found, strict=True) if data is not None]
        self._index.touch(held)
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
        stored: list[BlockKey] = []
        rejected: list[BlockKey] = []
        evicted: list[tuple[BlockKey, bytes | None]] = []
        for position, (key, data) in enumerate(items):
            parent = parents[position] if parents is not None else None
            result = self._index.insert(key, parent=parent, size=len(data))
            for victim in result.evicted:
                key_out = cast(BlockKey, victim)
                evicted.append((key_out, self._data.pop(key_out)))
            if result.is_admitted:
                if key not in self._data:
                    self._data[key] = bytes(data)
                    self._counts.bytes_written += len(data)
                stored.append(key)
            else:
                rejected.append(key)
        outcome = PutResult(tuple(stored), tuple(rejected), tuple(evicted))
        self._counts.count_put(outcome)
        return outcome

    def remove(self, keys: Sequence[BlockKey]) -> int:
        removed = 0
        for key in keys:
            if self._index.remove(key):
                del self._data[key]
                removed += 1
        return removed

    def pin(self, key: BlockKey) -> bool:
        """Keeps ``key`` resident until `unpin`; False when not held."""
        return self._index.pin(key)

    def is_pinned(self, key: BlockKey) -> bool:
        """True while ``key`` is pinned by a reader or a session."""
        return self._index.is_pinned(key)

    def unpin(self, key: BlockKey) -> None:
        """Releases one pin of ``key``."""
        self._index.unpin(key)

    def watch(self, listener: Callable[[str, BlockKey, bool], None] | None) -> None:
        """Tells ``listener(tier name, key, held)`` of every block this tier starts or stops holding."""
        self._index.watcher = (
            None
            if listener is None
            else lambda key, held: listener(self.name, cast(BlockKey, key), held)
        )

    def stats(self) -> TierStats:
        return self._counts.snapshot(
            self.name,
            blocks=len(self._data),
            used_bytes=self._index.used,
            capacity_bytes=self._index.capacity,
        )

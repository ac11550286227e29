"""The `Tier` protocol and its result types.

A tier holds encoded blocks (header + payload bytes, see `_block`) by key, within
a byte capacity, under an eviction policy. Operations are batched. Tiers are
single-owner and not thread-safe; `TieredStore` owns its tiers and serialises
access to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from agentinfra.kvcache._keys import BlockKey

__all__ = ["PutResult", "Tier", "TierCounters", "TierStats", "copy_into"]


@dataclass(frozen=True, slots=True)
class TierStats:
    """A snapshot of one tier's counters."""

    name: str
    blocks: int
    used_bytes: int
    capacity_bytes: int
    hits: int
    misses: int
    puts: int
    rejected: int
    evictions: int
    bytes_read: int
    bytes_written: int


@dataclass(frozen=True, slots=True)
class PutResult:
    """What a `Tier.put` did."""

    stored: tuple[BlockKey, ...]
    rejected: tuple[BlockKey, ...]
    evicted: tuple[tuple[BlockKey, bytes | None], ...]
    """Evicted blocks, with their bytes where the tier had them in memory (for demotion)."""


@dataclass(slots=True)
class TierCounters:
    """The running counters behind `TierStats`; owned by one tier."""

    hits: int = 0
    misses: int = 0
    puts: int = 0
    rejected: int = 0
    evictions: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    def count_reads(self, found: Sequence[bytes | int | None]) -> None:
        """Counts one batch read: a bytes object or a byte count per hit, None per miss."""
        for item in found:
            if item is None:
                self.misses += 1
            else:
                self.hits += 1
                self.bytes_read += item if isinstance(item, int) else len(item)

    def count_put(self, result: PutResult) -> None:
        self.puts += len(result.stored)
        self.rejected += len(result.rejected)
        self.evictions += len(result.evicted)

    def snapshot(
        self, name: str, *, blocks: int, used_bytes: int, capacity_bytes: int
    ) -> TierStats:
        return TierStats(
            name=name,
            blocks=blocks,
            used_bytes=used_bytes,
            capacity_bytes=capacity_bytes,
            **asdict(self),
        )


def copy_into(
    found: Sequence[bytes | None], buffers: Sequence[bytearray | memoryview]
) -> list[int | None]:
    """`Tier.get_into` for tiers that read whole blocks: copies each into its buffer."""
    written: list[int | None] = []
    for data, buffer in zip(found, buffers, strict=True):
        if data is None or len(buffer) < len(data):
            written.append(None)
            continue
        memoryview(buffer)[: len(data)] = data
        written.append(len(data))
    return written


class Tier(Protocol):
    """One level of the store (memory, disk, remote)."""

    name: str

    def leading_hits(self, keys: Sequence[BlockKey]) -> int:
        """Length of the leading run of ``keys`` this tier holds."""

    def get(self, keys: Sequence[BlockKey]) -> list[bytes | None]:
        """Encoded blocks for ``keys``; None for each one not held."""

    def get_into(
        self, keys: Sequence[BlockKey], buffers: Sequence[bytearray | memoryview]
    ) -> list[int | None]:
        """Copies each held block into its buffer; bytes written, or None when not held or too small."""

    def put(
        self,
        items: Sequence[tuple[BlockKey, bytes]],
        parents: Sequence[BlockKey | None] | None = None,
    ) -> PutResult:
        """Stores encoded blocks, evicting as the policy chooses."""

    def remove(self, keys: Sequence[BlockKey]) -> int:
        """Drops ``keys``; returns how many were held."""

    def __contains__(self, key: object) -> bool:
        """True when the tier holds ``key``."""

    def stats(self) -> TierStats:
        """A snapshot of the tier's counters."""

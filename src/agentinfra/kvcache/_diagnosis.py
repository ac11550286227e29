"""What `TieredStore.explain` answers: why a prefix missed, and how a block left a tier.

Plain frozen records; the store fills them from its eviction history and
quarantine. ``MissReason`` is the closed set of reasons a block can miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentinfra.kvcache._keys import BlockKey

__all__ = ["EvictionRecord", "Explanation", "MissReason"]

MissReason = Literal["never_stored", "evicted", "checksum", "namespace", "format"]


@dataclass(frozen=True, slots=True)
class EvictionRecord:
    """When and how a block left a tier."""

    at_s: float
    tier: str
    policy: str
    demoted_to: str | None


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a prefix hit only ``hit_blocks`` of ``requested_blocks``."""

    requested_blocks: int
    hit_blocks: int
    first_missing: int | None
    key: BlockKey | None
    reason: MissReason | None
    detail: str
    eviction: EvictionRecord | None = None

"""Eviction policies and admission filters: pure, synchronous, single-owner.

A policy orders the *evictable* blocks of one tier. The owner (a `BlockIndex`)
tells it when a block enters (`admit`), is used (`touch`) or leaves (`discard`,
also used while a block is pinned or leased), and asks it for a `victim`. Policies
never do I/O and hold no locks; tests assert their exact eviction orders.

Owners touch a request's blocks from its tail to its head, so a parent is always
more recent than its children: LRU then evicts leaves first and shared prefixes
(system prompts, tool definitions) last, as vLLM's free queue does.

Shipped policies (compare them with ``agentinfra kv replay --policy``):

- ``lru``: least recently used.
- ``prefix-lru``: LRU restricted to leaves of the cached prefix tree: a block whose
  child is cached is never evicted before that child (a child is useless without
  its parent).
- ``lfu-aging``: GreedyDual-style frequency with aging: priority = clock + uses;
  the clock rises to each victim's priority, so old popularity fades.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Protocol

from agentinfra.errors import ConfigError

__all__ = [
    "POLICIES",
    "EvictionPolicy",
    "LFUAgingPolicy",
    "LRUPolicy",
    "PrefixLRUPolicy",
    "make_policy",
]

Key = Hashable


class EvictionPolicy(Protocol):
    """Orders a tier's evictable blocks."""

    name: str

    def admit(self, key: Key, parent: Key | None) -> None:
        """``key`` becomes evictable; ``parent`` is its prefix parent if cached."""

    def touch(self, key: Key) -> None:
        """``key`` (evictable) was used."""

    def discard(self, key: Key) -> None:
        """``key`` is no longer evictable (removed, pinned or leased); no-op if unknown."""

    def victim(self) -> Key | None:
        """Chooses the next block to evict and forgets it; None when nothing is evictable."""

    def __len__(self) -> int:
        """Number of evictable blocks."""


class LRUPolicy:
    """Least recently used; O(1) per operation."""

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[Key, None] = OrderedDict()

    def admit(self, key: Key, parent: Key | None) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def touch(self, key: Key) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def discard(self, key: Key) -> None:
        self._order.pop(key, None)

    def victim(self) -> Key | None:
        if not self._order:
            return None
        key, _ = self._order.popitem(last=False)
        return key

    def __len__(self) -> int:
        return len(self._order)


class PrefixLRUPolicy:
    """LRU over the leaves of the cached prefix tree.

    A block with an evictable cached child is skipped; it becomes a candidate when
    its last child leaves. With tail-to-head touches the least recent block is
    nearly always a leaf, so the scan is short.
    """

    name = "prefix-lru"

    def __init__(self) -> None:
        self._order: OrderedDict[Key, None] = OrderedDict()
        self._parent: dict[Key, Key] = {}
        self._kids: dict[Key, set[Key]] = {}

    def admit(self, key: Key, parent: Key | None) -> None:
        self._order[key] = None
        self._order.move_to_end(key)
        if parent is not None and parent in self._order:
            self._parent[key] = parent
            self._kids.setdefault(parent, set()).add(key)

    def touch(self, key: Key) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def discard(self, key: Key) -> None:
        if key in self._order:
            del self._order[key]
            self._unlink(key)

    def _unlink(self, key: Key) -> None:
        parent = self._parent.pop(key, None)
        if parent is not None:
            siblings = self._kids[parent]
            siblings.discard(key)
            if not siblings:
                del self._kids[parent]
        # Children of a block that leaves stay evictable and lose their parent link.
        for child in self._kids.pop(key, ()):
            del self._parent[child]

    def victim(self) -> Key | None:
        for key in self._order:
            if key not in self._kids:
                del self._order[key]
                self._unlink(key)
                return key
        return None

    def __len__(self) -> int:
        return len(self._order)


class LFUAgingPolicy:
    """GreedyDual-style LFU with aging (GDSF with unit sizes).

    Each use adds one to a block's count; its priority is ``clock + count`` at its
    last use; the victim is the lowest priority (oldest on ties) and the clock rises
    to it. Counts survive eviction in a bounded table (halved when it grows past
    ``history_factor`` times the live blocks), so a returning block keeps its history.
    """

    name = "lfu-aging"

    def __init__(self, *, history_factor: int = 8) -> None:
        self._clock = 0.0
        self._tick = 0
        self._live: dict[Key, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, Key]] = []
        self._counts: dict[Key, int] = {}
        self._history_factor = history_factor

    def _bump(self, key: Key) -> None:
        count = self._counts.get(key, 0) + 1
        self._counts[key] = count
        self._tick += 1
        entry = (self._clock + count, self._tick)
        self._live[key] = entry
        heapq.heappush(self._heap, (entry[0], entry[1], key))
        if len(self._heap) > 4 * len(self._live) + 64:
            self._heap = [(p, t, k) for k, (p, t) in self._live.items()]
            heapq.heapify(self._heap)

    def _age_history(self) -> None:
        limit = self._history_factor * max(len(self._live), 1024)
        if len(self._counts) > limit:
            self._counts = {k: c // 2 for k, c in self._counts.items() if c // 2 or k in self._live}

    def admit(self, key: Key, parent: Key | None) -> None:
        self._bump(key)
        self._age_history()

    def touch(self, key: Key) -> None:
        if key in self._live:
            self._bump(key)

    def discard(self, key: Key) -> None:
        self._live.pop(key, None)

    def victim(self) -> Key | None:
        while self._heap:
            priority, tick, key = heapq.heappop(self._heap)
            if self._live.get(key) == (priority, tick):
                del self._live[key]
                self._clock = priority
                return key
        return None

    def __len__(self) -> int:
        return len(self._live)


POLICIES: dict[str, Callable[[], EvictionPolicy]] = {
    "lfu-aging": LFUAgingPolicy,
    "lru": LRUPolicy,
    "prefix-lru": PrefixLRUPolicy,
}


def make_policy(name: str) -> EvictionPolicy:
    """A fresh policy by name.

    Raises:
        ConfigError: unknown name; the message lists the shipped ones.
    """
    try:
        return POLICIES[name]()
    except KeyError:
        raise ConfigError(
            f"unknown policy {name!r}; choose one of {', '.join(sorted(POLICIES))}"
        ) from None

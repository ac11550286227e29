"""`BlockIndex`: which blocks one tier holds, within a capacity, under a policy.

Pure and synchronous: no I/O, no locks, one owner. Capacity is in units the owner
chooses (blocks for trace replay, bytes for a real tier). Pinned blocks (leased
by a reader or held by an active session) are never evicted: they are withdrawn
from the policy while pinned and handed back when the last pin is released.
Out of space is a result (`InsertResult.is_admitted` false), not an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from agentinfra.errors import ConfigError
from agentinfra.kvcache._policies import EvictionPolicy

__all__ = ["BlockIndex", "InsertResult"]

Key = Hashable


@dataclass(frozen=True, slots=True)
class InsertResult:
    """What an insert did: whether the block is now held, and what was evicted for it."""

    is_admitted: bool
    evicted: tuple[Key, ...] = ()


class BlockIndex:
    """The set of blocks one tier holds, bounded by ``capacity`` units."""

    def __init__(self, capacity: int, policy: EvictionPolicy) -> None:
        if capacity < 0:
            raise ConfigError(f"BlockIndex capacity={capacity} must be >= 0")
        self.capacity = capacity
        self.policy = policy
        self._sizes: dict[Key, int] = {}
        self._pins: dict[Key, int] = {}
        self._parents: dict[Key, Key | None] = {}
        self.used = 0
        self.watcher: Callable[[Key, bool], None] | None = None
        """Told of every key the index starts holding (True) or stops holding (False)."""

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def keys(self) -> list[Key]:
        """Every held key, in no particular order."""
        return list(self._sizes)

    def size_of(self, key: Key) -> int | None:
        """Units held by ``key``, or None when it is not held."""
        return self._sizes.get(key)

    def leading_hits(self, keys: Sequence[Key]) -> int:
        """Length of the leading run of ``keys`` that is held."""
        count = 0
        for key in keys:
            if key not in self._sizes:
                break
            count += 1
        return count

    def touch(self, keys: Sequence[Key]) -> None:
        """Marks held ``keys`` as used, tail first, so parents end up most recent."""
        for key in reversed(keys):
            if key in self._sizes and key not in self._pins:
                self.policy.touch(key)

    def insert(self, key: Key, *, parent: Key | None = None, size: int = 1) -> InsertResult:
        """Holds ``key`` (``size`` units), evicting unpinned blocks as the policy chooses."""
        if key in self._sizes:
            self.touch([key])
            return InsertResult(True)
        if size < 0 or size > self.capacity:
            return InsertResult(False)
        evicted: list[Key] = []
        while self.used + size > self.capacity:
            victim = self.policy.victim()
            if victim is None:
                return InsertResult(False, tuple(evicted))
            self._forget(victim)
            evicted.append(victim)
        self._sizes[key] = size
        self._parents[key] = parent
        self.used += size
        self.policy.admit(key, parent if parent in self._sizes else None)
        if self.watcher is not None:
            self.watcher(key, True)
        return InsertResult(True, tuple(evicted))

    def remove(self, key: Key) -> bool:
        """Drops ``key`` even if pinned; True when it was held."""
        if key not in self._sizes:
            return False
        self.policy.discard(key)
        self._pins.pop(key, None)
        self._forget(key)
        return True

    def _forget(self, key: Key) -> None:
        self.used -= self._sizes.pop(key)
        self._parents.pop(key, None)
        if self.watcher is not None:
            self.watcher(key, False)

    def pin(self, key: Key) -> bool:
        """Protects a held ``key`` from eviction until a matching `unpin`; False if not held."""
        if key not in self._sizes:
            return False
        count = self._pins.get(key, 0)
        if count == 0:
            self.policy.discard(key)
        self._pins[key] = count + 1
        return True

    def unpin(self, key: Key) -> None:
        """Releases one pin; the block becomes evictable again after the last one."""
        count = self._pins.get(key, 0)
        if count <= 1:
            if self._pins.pop(key, None) is not None and key in self._sizes:
                parent = self._parents.get(key)
                self.policy.admit(key, parent if parent in self._sizes else None)
        else:
            self._pins[key] = count - 1

    def is_pinned(self, key: Key) -> bool:
        """True while ``key`` holds at least one pin."""
        return key in self._pins

    def evict(self, count: int = 1) -> list[Key]:
        """Evicts up to ``count`` blocks as the policy chooses (used for demotion)."""
        evicted: list[Key] = []
        for _ in range(count):
            victim = self.policy.victim()
            if victim is None:
                break
            self._forget(victim)
            evicted.append(victim)
        return evicted

"""`TieredStore`: memory and disk tiers walked in order, with sessions and diagnosis.

- Lookups walk the tiers in order and return the *verified* leading run of
  blocks: every block's checksum is checked on every read; a mismatch is a miss
  (counted, the block quarantined), never wrong KV.
- A disk hit is promoted into memory; a block evicted from memory is demoted to
  disk instead of dropped when it has shown reuse (read at least once, or
  ``disk_admission="all"``) or belongs to a session that is waiting on a tool.
  ``disk_admission="write-through"`` also writes every `put` to disk at once, so
  a store (or cache server) killed and restarted finds every block it acknowledged.
- Agent sessions pin their blocks while a turn is active; between turns the
  blocks get a time-to-live after which they are demoted to disk (never simply
  dropped), and `Session.begin_turn` prefetches them back.
- An optional remote tier (the Redis/Valkey tier, shared by many nodes) is
  walked after disk; every `put` is written through to it so other nodes see
  the block, and a remote hit is promoted into memory. A remote tier that is
  down turns its blocks into misses; it never fails a lookup.
- `explain` says why a prefix missed: the first missing block and whether it was
  never stored, evicted (when, from which tier, by which policy), failed its
  checksum, or lives under another namespace.

The store owns its tiers, an ordered list (``tiers``: memory first, then disk,
then remote); ``memory``, ``disk`` and ``remote`` name them by role. One
re-entrant lock serialises the store's bookkeeping and the memory tier, so many
threads may share one store; it is never held while blocks are *written* to disk
or to the remote tier: demotions and write-through copies are written after the
lock is released (under a separate I/O lock), and a `put` returns only after its
own write-through copies are on disk. `try_get_resident` and
`try_leading_hits_resident` never wait for the lock and never touch disk, for
callers on an event loop. Other processes share blocks through a read-only
`DiskTier` on the same directory or through the cache server.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from agentinfra.errors import BlockFormatError, ConfigError
from agentinfra.kvcache._block import Block, decode_header, encode_block, parse_block
from agentinfra.kvcache._diagnosis import EvictionRecord, Explanation, MissReason
from agentinfra.kvcache._disk_tier import DiskTier
from agentinfra.kvcache._keys import BlockKey, Namespace, block_keys
from agentinfra.kvcache._memory_tier import MemoryTier
from agentinfra.kvcache._session import Session, SessionState
from agentinfra.kvcache._tier import Tier, TierStats

__all__ = [
    "EvictionRecord",
    "Explanation",
    "MissReason",
    "Session",
    "SessionState",
    "StoreStats",
    "TieredStore",
]

logger = logging.getLogger(__name__)
TokenIds = Sequence[int] | npt.NDArray[np.integer]


@dataclass(frozen=True, slots=True)
class StoreStats:
    """A snapshot of the store's counters and each tier's."""

    lookups: int
    hit_blocks: int
    misses_by_reason: dict[str, int]
    promotions: int
    demotions: int
    dropped: int
    quarantined: int
    sessions_active: int
    tiers: tuple[TierStats, ...] = field(default_factory=tuple)
    released: int = 0
    """Blocks a finished session held alone, moved out of memory when it closed."""


class TieredStore:
    """The KV-cache store over a memory tier and an optional disk tier."""

    def __init__(
        self,
        memory: MemoryTier,
        disk: DiskTier | None = None,
        *,
        remote: Tier | None = None,
        disk_admission: Literal["all", "second-access", "write-through"] = "second-access",
        clock: Callable[[], float] = time.monotonic,
        history_limit: int = 100_000,
    ) -> None:
        if disk_admission not in ("all", "second-access", "write-through"):
            raise ConfigError(
                f"disk_admission={disk_admission!r} must be 'all', 'second-access' or 'write-through'"
            )
        self.tiers: tuple[Tier, ...] = tuple(t for t in (memory, disk, remote) if t is not None)
        """Fastest first: memory, then disk (when configured), then remote (when configured)."""
        self._memory = memory
        self._disk = disk
        self._remote = remote
        self._disk_admission = disk_admission
        self._clock = clock
        self._lock = threading.RLock()
        self._io_lock = threading.RLock()
        """Serialises disk-tier calls; taken after ``_lock`` or alone, never the other way round."""
        self._depth = 0
        self._deferred: list[
            tuple[Tier, list[tuple[BlockKey, bytes]], list[BlockKey | None] | None]
        ] = []
        self._uses: dict[BlockKey, int] = {}
        self._history: OrderedDict[BlockKey, EvictionRecord] = OrderedDict()
        self._history_limit = history_limit
        self._quarantined: set[BlockKey] = set()
        self._namespaces: dict[BlockKey, Namespace] = {}
        self._sessions: dict[str, Session] = {}
        self._protected: dict[BlockKey, int] = {}
        self._holders: dict[BlockKey, int] = {}
        """How many sessions ever held each block (1: private to one agent)."""
        self._counts = dict.fromkeys(
            ("lookups", "hit_blocks", "promotions", "demotions", "dropped", "released"), 0
        )
        self._misses: dict[str, int] = dict.fromkeys(
            ("never_stored", "evicted", "checksum", "namespace", "format"), 0
        )

    # -- tiers and locking -----------------------------------------------------

    @property
    def memory(self) -> MemoryTier:
        return self._memory

    @property
    def disk(self) -> DiskTier | None:
        return self._disk

    @property
    def remote(self) -> Tier | None:
        return self._remote

    @property
    def _lower(self) -> tuple[Tier, ...]:
        """The tiers after memory, in lookup order."""
        return self.tiers[1:]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The store lock; the outermost holder writes the deferred blocks after releasing it."""
        with self._lock:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                outermost = self._depth == 0
        if outermost:
            self.flush_deferred()

    def _defer(self, tier: Tier, items: list[tuple[BlockKey, bytes]],
               parents: list[BlockKey | None] | None = None) -> None:  # fmt: skip
        self._deferred.append((tier, items, parents))

    @property
    def has_deferred_writes(self) -> bool:
        return bool(self._deferred)

    def flush_deferred(self) -> None:
        """Writes demoted blocks to their tier, outside the store lock (evictions recorded after)."""
        if not self._deferred:  # the common case: no lock taken
            return
        with self._lock:
            work, self._deferred = self._deferred, []
        if work:
            self._write_out(work)

    def _write_out(
        self,
        work: Sequence[tuple[Tier, list[tuple[BlockKey, bytes]], list[BlockKey | None] | None]],
    ) -> None:
        evicted: list[tuple[BlockKey, str, str]] = []
        for tier, items, parents in work:
            if tier is self._remote:
                tier.put(items, parents)  # the remote tier is thread-safe and keeps its own policy
                continue
            with self._io_lock:
                result = tier.put(items, parents)
            evicted += [
                (key, tier.name, getattr(tier, "policy_name", "")) for key, _ in result.evicted
            ]
        if evicted:
            now = self._clock()
            with self._lock:
                for key, tier_name, policy in evicted:
                    self._record(key, now, tier_name, policy, None)

    def watch(self, listener: Callable[[str, BlockKey, bool], None] | None) -> None:
        """Tells ``listener(tier name, key, held)`` of every block memory or disk starts or stops
        holding (the remote tier is shared by other servers: not watched). Called under the
        tiers' locks: the listener only queues."""
        self._memory.watch(listener)
        if self._disk is not None:
            self._disk.watch(listener)

    @contextlib.contextmanager
    def lock(self, *, wait: bool = True) -> Iterator[bool]:
        """The store's lock, for a caller keeping its own view of the tiers (`TierLookup`):
        yields False, untaken, when another holds it and ``not wait``."""
        if not self._lock.acquire(blocking=wait):
            yield False
            return
        try:
            yield True
        finally:
            self._lock.release()

    def holding(self, keys: Sequence[BlockKey]) -> list[int]:
        """Which local tiers hold each key: 1 memory, 2 disk, 3 both, 0 neither (unverified)."""
        with self._lock:
            memory, disk = self._memory, self._disk
            if disk is None:
                return [int(key in memory) for key in keys]
            return [(key in memory) | (key in disk) << 1 for key in keys]

    # -- keys ------------------------------------------------------------------

    def keys_for(self, namespace: Namespace, token_ids: TokenIds) -> list[BlockKey]:
        """Block keys of ``token_ids`` under ``namespace`` (registered for `explain`)."""
        with self._lock:
            self._namespaces.setdefault(namespace.root_key(), namespace)
        return block_keys(namespace, token_ids)

    # -- reads -----------------------------------------------------------------

    def leading_hits(self, keys: Sequence[BlockKey]) -> int:
        """Leading run of ``keys`` held in any tier (unverified; `get` verifies)."""
        with self._locked():
            local = [t for t in self.tiers if t is not self._remote]
            count = 0
            for key in keys:
                if not any(key in tier for tier in local):
                    break
                count += 1
            if self._remote is not None and count < len(keys):
                count += self._remote.leading_hits(keys[count:])
            return count

    def get(self, keys: Sequence[BlockKey]) -> list[Block]:
        """The verified leading run of ``keys``; disk hits are promoted into memory."""
        with self._locked():
            blocks, reason = self._get(keys)
            if reason is not None:
                self._misses[reason] += 1
            return blocks

    def try_get_resident(
        self, keys: Sequence[BlockKey], *, verify: bool = True
    ) -> list[Block] | None:
        """`get` when the store lock is free and every key is in memory; else None at once.

        Never waits for the lock and never touches disk or the network: for callers
        on an event loop. Writes it defers (demotions) wait for `flush_deferred`.
        ``verify=False`` skips the checksum of blocks already in memory (they were
        verified on the way in): for a caller whose reader verifies them anyway, as
        every cache client does.
        """
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if not all(key in self._memory for key in keys):
                return None
            blocks, reason = self._get(keys, verify=verify)
            if reason is not None:
                self._misses[reason] += 1
            return blocks
        finally:
            self._lock.release()

    def try_leading_hits_resident(self, keys: Sequence[BlockKey]) -> int | None:
        """`leading_hits` when the lock is free and memory alone answers it; else None at once."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            count = self._memory.leading_hits(keys)
            return count if count == len(keys) or len(self.tiers) == 1 else None
        finally:
            self._lock.release()

    def _get(
        self, keys: Sequence[BlockKey], *, verify: bool = True
    ) -> tuple[list[Block], MissReason | None]:
        self._expire()
        self._counts["lookups"] += 1
        blocks: list[Block] = []
        reason: MissReason | None = None
        for position, key in enumerate(keys):
            block, why = self._read_verified(key, keys[position - 1] if position else None, verify)
            if block is None:
                reason = why
                break
            blocks.append(block)
        self._counts["hit_blocks"] += len(blocks)
        return blocks, reason

    def lookup(self, namespace: Namespace, token_ids: TokenIds) -> list[Block]:
        """`get` by tokens; a miss whose block exists under another namespace counts as ``namespace``."""
        keys = self.keys_for(namespace, token_ids)
        with self._locked():
            blocks, reason = self._get(keys)
            if reason == "never_stored" and self._other_namespace(
                namespace, token_ids, len(blocks)
            ):
                reason = "namespace"
            if reason is not None:
                self._misses[reason] += 1
            return blocks

    def _read_verified(
        self, key: BlockKey, parent: BlockKey | None, verify: bool = True
    ) -> tuple[Block | None, MissReason]:
        data = self._memory.get([key])[0]
        from_disk = data is None
        for tier in self._lower:
            if data is not None:
                break
            if tier is self._remote:
                data = tier.get([key])[0]
            elif key in tier:
                with self._io_lock:
                    data = tier.get([key])[0]
        if data is None:
            return None, "evicted" if key in self._history else "never_stored"
        try:
            block = parse_block(data, expected_key=key, verify=verify or from_disk)
        except BlockFormatError:
            return None, "format"
        if block is None:
            self._quarantine(key)
            return None, "checksum"
        self._uses[key] = self._uses.get(key, 0) + 1
        if from_disk:
            self._counts["promotions"] += 1
            self._put_memory([(key, bytes(data))], [parent])
            block = parse_block(self.memory.peek(key) or data, expected_key=key) or block
        return block, "never_stored"

    def _quarantine(self, key: BlockKey) -> None:
        self._quarantined.add(key)
        self._memory.remove([key])
        if self._disk is not None:
            with self._io_lock:
                self._disk.quarantine(key)

    @contextlib.contextmanager
    def lease(self, keys: Sequence[BlockKey]) -> Iterator[list[Block]]:
        """Like `get`, and the returned blocks stay resident until the block exits."""
        with self._locked():
            blocks = self.get(keys)
            held = [b.header.key for b in blocks if self.memory.pin(b.header.key)]
        try:
            yield blocks
        finally:
            with self._locked():
                for key in held:
                    self.memory.unpin(key)

    # -- writes ----------------------------------------------------------------

    def put(self, keys: Sequence[BlockKey], kvs: Sequence[Any]) -> int:
        """Encodes and stores one KV tensor per key (a chain: each key's parent is the one before)."""
        if len(keys) != len(kvs):
            raise ConfigError(f"put got {len(keys)} keys and {len(kvs)} KV tensors")
        return self.put_encoded(
            [(key, encode_block(key, kv)) for key, kv in zip(keys, kvs, strict=True)]
        )

    def put_encoded(self, items: Sequence[tuple[BlockKey, bytes]]) -> int:
        """Stores already-encoded blocks (a chain); returns how many memory holds.

        Raises:
            BlockFormatError: a block is not version 1 or carries another key; nothing is stored.
        """
        for key, data in items:
            if decode_header(data).key != key:
                raise BlockFormatError(
                    f"block for key {key.hex()[:16]} carries another key in its header"
                )
        parents: list[BlockKey | None] = [None, *(key for key, _ in items[:-1])]
        with self._locked():
            self._expire()
            for key, _ in items:
                self._uses[key] = self._uses.get(key, 0) + 1
                self._quarantined.discard(key)
            stored = len(self._put_memory(list(items), parents))
        # Written by this caller after the lock is released, and before it returns: an
        # acknowledged write-through block is on disk, and no reader waited for the write.
        through = [
            t for t in self._lower if t is self._remote or self._disk_admission == "write-through"
        ]
        self._write_out([(tier, list(items), parents) for tier in through])
        return stored

    def _put_memory(
        self, items: list[tuple[BlockKey, bytes]], parents: Sequence[BlockKey | None]
    ) -> tuple[BlockKey, ...]:
        result = self._memory.put(items, parents)
        now = self._clock()
        for victim, data in result.evicted:
            self._demote_or_drop(victim, data, now)
        for key, data in items:
            if key in result.rejected and self._disk is not None:
                self._defer(self._disk, [(key, data)])
        return result.stored

    def _demote_or_drop(self, key: BlockKey, data: bytes | None, now: float) -> None:
        reused = self._uses.pop(key, 0) >= 2 or self._disk_admission != "second-access"
        demote = self.disk is not None and data is not None and (reused or key in self._protected)
        if demote and self._disk is not None and data is not None:
            self._defer(self._disk, [(key, data)])
            self._counts["demotions"] += 1
            self._record(key, now, "memory", self.memory.policy_name, "disk")
        else:
            self._counts["dropped"] += 1
            self._record(key, now, "memory", self.memory.policy_name, None)

    def _record(
        self, key: BlockKey, now: float, tier: str, policy: str, demoted_to: str | None
    ) -> None:
        self._history[key] = EvictionRecord(now, tier, policy, demoted_to)
        self._history.move_to_end(key)
        while len(self._history) > self._history_limit:
            self._history.popitem(last=False)

    def remove(self, keys: Sequence[BlockKey]) -> int:
        """Removes ``keys`` from every tier; returns how many tier copies were removed."""
        self.flush_deferred()  # a block on its way to disk is removed there too
        with self._locked():
            removed = 0
            for tier in self.tiers:
                with self._io_lock:
                    removed += tier.remove(keys)
            for key in keys:
                self._uses.pop(key, None)
                self._holders.pop(key, None)
            return removed

    # -- sessions --------------------------------------------------------------

    def open_session(self, session_id: str, *, parent: Session | None = None) -> Session:
        """A new agent session; ``parent`` makes it a sub-agent closed with its parent."""
        with self._locked():
            if session_id in self._sessions:
                raise ConfigError(f"session {session_id!r} is already open")
            session = Session(self, session_id, parent)
            self._sessions[session_id] = session
            return session

    def _begin_turn(self, session: Session, keys: Sequence[BlockKey]) -> int:
        with self._locked():
            if session.state is SessionState.CLOSED:
                raise ConfigError(f"session {session.session_id!r} is closed")
            self._release(session)
            blocks = self.get(keys)
            session.state = SessionState.ACTIVE
            session.deadline_s = None
            self._track(session, [b.header.key for b in blocks])
            return len(blocks)

    def _track(self, session: Session, keys: Sequence[BlockKey]) -> None:
        for key in keys:
            if key not in session.keys:
                session.keys.append(key)
                self._protected[key] = self._protected.get(key, 0) + 1
                self._holders[key] = self._holders.get(key, 0) + 1
            if self.memory.pin(key):
                session._pinned.append(key)

    def _add_to_session(self, session: Session, keys: Sequence[BlockKey]) -> None:
        with self._locked():
            self._track(session, keys)

    def _release(self, session: Session) -> None:
        for key in session._pinned:
            self.memory.unpin(key)
        session._pinned.clear()

    def _end_turn(self, session: Session, ttl_s: float) -> None:
        if ttl_s < 0:
            raise ConfigError(f"ttl_s={ttl_s} must be >= 0")
        with self._locked():
            self._release(session)
            session.state = SessionState.WAITING
            session.deadline_s = self._clock() + ttl_s
            touch = getattr(self.remote, "touch", None)
            if callable(touch) and session.keys:  # the shared copy outlives the wait, too
                touch(list(session.keys), ttl_s)
            self._expire()

    def _close_session(self, session: Session, release_private: bool = False) -> None:
        with self._locked():
            for child in [s for s in self._sessions.values() if s.parent is session]:
                self._close_session(child, release_private)
            self._release(session)
            now = self._clock()
            for key in session.keys:
                left = self._protected.get(key, 0) - 1
                if left > 0:
                    self._protected[key] = left
                else:
                    self._protected.pop(key, None)
                if (
                    release_private
                    and self._holders.get(key) == 1
                    and not self.memory.is_pinned(key)
                ):
                    data = self.memory.peek(key)
                    if data is not None and self._memory.remove([key]):
                        self._counts["released"] += 1
                        if self._disk is not None:
                            self._defer(self._disk, [(key, data)])
                            self._record(key, now, "memory", "session-done", "disk")
                        else:
                            self._record(key, now, "memory", "session-done", None)
            session.state = SessionState.CLOSED
            self._sessions.pop(session.session_id, None)

    def _expire(self) -> None:
        """Demotes the memory blocks of waiting sessions whose time-to-live has run out."""
        now = self._clock()
        for session in list(self._sessions.values()):
            if (
                session.state is SessionState.WAITING
                and session.deadline_s is not None
                and now >= session.deadline_s
            ):
                session.state = SessionState.IDLE
                for key in session.keys:
                    data = self.memory.peek(key)
                    if data is None or self.memory.is_pinned(key):
                        continue
                    if self._disk is not None and self._memory.remove([key]):
                        self._defer(self._disk, [(key, data)])
                        self._counts["demotions"] += 1
                        self._record(key, now, "memory", "session-ttl", "disk")

    def session(self, session_id: str) -> Session | None:
        """The open session ``session_id``, or None."""
        with self._lock:
            return self._sessions.get(session_id)

    def sessions(self) -> list[Session]:
        """Open sessions."""
        with self._lock:
            return list(self._sessions.values())

    # -- diagnosis -------------------------------------------------------------

    def _other_namespace(
        self, namespace: Namespace, token_ids: TokenIds, position: int
    ) -> Namespace | None:
        size = namespace.block_size_tokens
        prefix = np.asarray(token_ids)[: (position + 1) * size]
        with self._lock:
            candidates = [
                ns for root, ns in self._namespaces.items() if root != namespace.root_key()
            ]
        for other in candidates:
            keys = block_keys(other, prefix[: (position + 1) * other.block_size_tokens])
            if len(keys) > position and self.leading_hits(keys[position : position + 1]):
                return other
        return None

    def explain(self, namespace: Namespace, token_ids: TokenIds) -> Explanation:
        """Why the prefix ``token_ids`` does not fully hit under ``namespace``."""
        keys = self.keys_for(namespace, token_ids)
        explanation = self.explain_keys(keys)
        if explanation.reason != "never_stored" or explanation.first_missing is None:
            return explanation
        hits, key = explanation.first_missing, keys[explanation.first_missing]
        other = self._other_namespace(namespace, token_ids, hits)
        if other is not None:
            return Explanation(
                len(keys), hits, hits, key, "namespace",
                f"block {hits} ({key.hex()[:16]}) is cached under another namespace (model {other.model_id!r}, "
                f"dtype {other.kv_dtype}, block size {other.block_size_tokens}); this lookup used model "
                f"{namespace.model_id!r}",
            )  # fmt: skip
        return explanation

    def explain_keys(self, keys: Sequence[BlockKey]) -> Explanation:
        """Why the chain ``keys`` does not fully hit: never stored, evicted or failed its checksum."""
        with self._locked():
            hits = self.leading_hits(keys)
            if hits == len(keys):
                return Explanation(
                    len(keys), hits, None, None, None, f"all {hits} full blocks are cached"
                )
            key = keys[hits]
            where = f"block {hits} ({key.hex()[:16]})"
            if key in self._quarantined:
                return Explanation(
                    len(keys),
                    hits,
                    hits,
                    key,
                    "checksum",
                    f"{where} failed its checksum and was quarantined",
                )
            record = self._history.get(key)
            if record is not None:
                detail = (
                    f"{where} was evicted from the {record.tier} tier by policy {record.policy} "
                    f"at t={record.at_s:.3f}s"
                    + (f" and demoted to {record.demoted_to}" if record.demoted_to else "")
                )
                return Explanation(len(keys), hits, hits, key, "evicted", detail, record)
        return Explanation(len(keys), hits, hits, key, "never_stored", f"{where} was never stored")

    def stats(self) -> StoreStats:
        """A snapshot of every counter."""
        with self._locked(), self._io_lock:
            tiers = tuple(tier.stats() for tier in self.tiers)
            return StoreStats(
                misses_by_reason=dict(self._misses),
                quarantined=len(self._quarantined),
                sessions_active=sum(
                    s.state is SessionState.ACTIVE for s in self._sessions.values()
                ),
                tiers=tiers,
                **self._counts,
            )

    def close(self) -> None:
        """Writes what is deferred, then releases the disk tier's lock."""
        self.flush_deferred()
        with self._lock, self._io_lock:
            if self._disk is not None:
                self._disk.close()

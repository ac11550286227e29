"""`TierLookup`: TIER_HITS answered from the client's own keys, without hashing each one.

A client names its blocks by its keys; the store holds them under the tenant's
scoping of each (``tenant_key``: one SHA-256 per block). Scoping every key of a
128k-token prompt costs more than the whole lookup may, so the server keeps, per
tenant, which local tiers hold each block it has seen stored, by the client's
key: a lookup is then one dict probe per block.

The index only ever knows less than the store, never something else: it learns a
block's tiers from the store itself, when the server scopes it for a PUT or a lookup
finds it held, and follows it through the tiers' watch events; a block it does not
know (stored before this server started, or behind its back, or held nowhere for a
moment between tiers) is scoped and checked in the store, a chunk at a time up to
the first miss, as before.
It costs about 300 bytes per block held.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import struct
import threading
from collections.abc import Callable, Iterable, Sequence

from agentinfra.kvcache._keys import BlockKey
from agentinfra.kvcache._store import TieredStore

__all__ = ["TierLookup"]

_MEMORY, _DISK = 1, 2
_TIER_BITS = {"memory": _MEMORY, "disk": _DISK}
_FAST_CHUNK = 512
"""Client keys probed at once: a miss in the first chunk costs this many slices."""
_SLOW_CHUNK = 64
"""Unknown keys scoped and checked in the store at once (a miss costs one chunk of hashes)."""
_U16 = struct.Struct("<H")
_UNKNOWN = 255
"""A block's tier bits when the index has not learnt them (bits are 0-3 otherwise)."""
_NOT_IN_MEMORY = bytes(0 if v & _MEMORY and v != _UNKNOWN else 1 for v in range(256))
_NOT_ON_DISK = bytes(0 if v & _DISK and v != _UNKNOWN else 1 for v in range(256))


def tenant_prefix(tenant: str) -> bytes:
    """The bytes ``tenant_key`` hashes before a client's key (docs/protocol.md section 5)."""
    name = tenant.encode()
    return b"AIKT" + _U16.pack(len(name)) + name


class TierLookup:
    """Which local tiers hold each block, by (tenant, client key); the store's watch listener."""

    def __init__(
        self, store: TieredStore, forward: Callable[[str, BlockKey, bool], None] | None = None
    ) -> None:
        self.store = store
        self.forward = forward
        """Another listener of the store's events (the KV events publisher), called first."""
        self._lock = threading.Lock()
        self._held: dict[str, dict[bytes, int]] = {}
        """tenant -> client key -> tier bits (memory 1, disk 2; 0 while a PUT of it runs);
        absent: unknown."""
        self._owner: dict[BlockKey, tuple[str, bytes]] = {}
        """store key -> (tenant, client key), for the blocks the index follows."""

    def __len__(self) -> int:
        return len(self._owner)

    # -- following the store --------------------------------------------------------------

    def expect(self, tenant: str, pairs: Iterable[tuple[bytes, BlockKey]]) -> None:
        """Follows the blocks a PUT is about to store, ``(client key, store key)`` pairs, from
        where the store holds them now (the store's lock, then the index's: the order the
        store's listeners take them, so no change falls between the answer and the index)."""
        pairs = list(pairs)
        with self.store.lock(), self._lock:
            found = self.store.holding([key for _, key in pairs])
            for (client, key), bits in zip(pairs, found, strict=True):
                client = bytes(client)
                self._owner[key] = (tenant, client)
                self._held.setdefault(tenant, {})[client] = bits

    def settle(self, keys: Sequence[BlockKey]) -> None:
        """After a PUT: stops following its blocks that no tier took."""
        with self._lock:
            for key in keys:
                owner = self._owner.get(key)
                if owner is not None and not self._held.get(owner[0], {}).get(owner[1]):
                    del self._owner[key]
                    self._held.get(owner[0], {}).pop(owner[1], None)

    def changed(self, tier: str, key: BlockKey, held: bool) -> None:
        """The store's watch listener: ``tier`` started or stopped holding ``key``."""
        if self.forward is not None:
            self.forward(tier, key, held)
        bit = _TIER_BITS.get(tier)
        if bit is None:
            return
        with self._lock:
            owner = self._owner.get(key)
            if owner is None:
                return
            tenant, client = owner
            table = self._held.setdefault(tenant, {})
            bits = table.get(client)
            if bits is None:  # other tiers unknown: left for a lookup to learn whole
                return
            bits = bits | bit if held else bits & ~bit
            if bits:
                table[client] = bits
            else:  # held nowhere: forget it (a later copy is learnt again)
                table.pop(client, None)
                del self._owner[key]

    # -- the lookup -----------------------------------------------------------------------

    def runs(self, tenant: str, data: bytes, *, wait: bool) -> tuple[int, int, int] | None:
        """Leading runs of the keys in ``data`` (a key list's wire bytes: u32 count, 32-byte keys)
        held in any local tier, in memory, on disk. None when the store's lock is taken and
        ``not wait`` (only unknown blocks need it)."""
        scope = hashlib.sha256(tenant_prefix(tenant))
        either = in_memory = on_disk = 0
        memory_run = disk_run = True
        for start in range(4, len(data), 32 * _FAST_CHUNK):
            end = min(len(data), start + 32 * _FAST_CHUNK)
            clients = list(_keys_struct((end - start) // 32).unpack_from(data, start))
            with self._lock:
                table = self._held.get(tenant, {})
                codes = bytes(map(table.get, clients, itertools.repeat(_UNKNOWN)))
            if _UNKNOWN in codes:
                bits: list[int | None] = [None if c == _UNKNOWN else c for c in codes]
                if not self._resolve(tenant, scope, clients, bits, wait):
                    return None
                # what stays unknown lies past a block no tier holds (`_resolve` stops there)
                codes = bytes(_UNKNOWN if b is None else b for b in bits)
            # one byte of tier bits per block: each run is one C scan, not a Python loop
            run = _first_of(codes, 0, _UNKNOWN)
            either += run
            if memory_run:
                in_memory += (count := min(run, _first_of(codes.translate(_NOT_IN_MEMORY), 1)))
                memory_run = count == len(codes)
            if disk_run:
                on_disk += (count := min(run, _first_of(codes.translate(_NOT_ON_DISK), 1)))
                disk_run = count == len(codes)
            if run < len(codes):
                break
        return either, in_memory, on_disk

    def _resolve(
        self, tenant: str, scope: object, clients: list[bytes], bits: list[int | None], wait: bool
    ) -> bool:
        """Fills the unknown ``bits`` up to the first block no tier holds, from the store, and
        learns the held ones. False when the store's lock is taken and ``not wait``."""
        stop = bits.index(0) if 0 in bits else len(bits)
        unknown = [i for i, value in enumerate(bits[: stop + 1]) if value is None]
        for start in range(0, len(unknown), _SLOW_CHUNK):
            picked = unknown[start : start + _SLOW_CHUNK]
            keys = []
            for i in picked:
                digest = scope.copy()  # type: ignore[attr-defined]
                digest.update(clients[i])
                keys.append(BlockKey(digest.digest()))
            # the store's lock, then the index's (the order the store's listeners take them):
            # every change after the store's answer reaches the index after it
            with self.store.lock(wait=wait) as taken:
                if not taken:
                    return False
                with self._lock:
                    found = self.store.holding(keys)
                    table = self._held.setdefault(tenant, {})
                    for i, key, value in zip(picked, keys, found, strict=True):
                        bits[i] = value
                        if value:
                            table[clients[i]] = value
                            self._owner.setdefault(key, (tenant, clients[i]))
            if 0 in found:
                break
        return True


@functools.lru_cache(maxsize=8)
def _keys_struct(count: int) -> struct.Struct:
    """Splits ``count`` 32-byte keys in one C call (a slice per key costs twice as much)."""
    return struct.Struct("32s" * count)


def _first_of(values: bytes, *targets: int) -> int:
    """The index of the first byte of ``values`` equal to any of ``targets`` (``len(values)`` if none)."""
    return min((values.index(t) for t in targets if t in values), default=len(values))

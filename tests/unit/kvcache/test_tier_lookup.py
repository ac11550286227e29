"""TIER_HITS from the server's index of client keys agrees with the store, whatever wrote the blocks."""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from agentinfra.kvcache import (
    CacheClient,
    DiskTier,
    MemoryTier,
    Namespace,
    ServerConfig,
    ServerThread,
    TieredStore,
    block_keys,
    encode_block,
)
from agentinfra.kvcache._server import tenant_key
from agentinfra.kvcache._tier_lookup import TierLookup

NS = Namespace(model_id="tiny", block_size_tokens=4)
SHAPE = (2, 2, 4, 1, 8)
BLOCK_BYTES = 80 + 2 * 2 * 4 * 1 * 8 * 4


def kv(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


def truth(store: TieredStore, tenant: str, keys: list[bytes]) -> tuple[int, int, int]:
    """The leading runs from the store's own view (held anywhere, in memory, on disk)."""
    held = store.holding([tenant_key(tenant, k) for k in keys])

    def run(tiers: int) -> int:
        return next((i for i, bits in enumerate(held) if not bits & tiers), len(held))

    return run(3), run(1), run(2)


def test_runs_follow_each_tier_across_chunks(tmp_path: Path) -> None:
    """A chain longer than the lookup's chunks, blocks in memory, on disk, on both, one only on
    disk: each tier's leading run, learnt from the store and then answered from the index."""
    disk = DiskTier(tmp_path / "d", 1600 * BLOCK_BYTES)
    store = TieredStore(MemoryTier(1600 * BLOCK_BYTES), disk)
    lookup = TierLookup(store)
    store.watch(lookup.changed)
    chain = block_keys(NS, list(range(4 * 1500)))
    keys = [tenant_key("default", k) for k in chain]
    store.put(keys[:1300], [kv(i) for i in range(1300)])
    disk.put([(k, encode_block(k, kv(0))) for k in [*keys[:700], keys[1400]]])
    store.memory.remove([keys[1000]])
    disk.put([(keys[1000], encode_block(keys[1000], kv(0)))])
    for _ in range(2):  # learnt from the store, then from the index
        assert lookup.runs("default", _wire(chain), wait=True) == (1300, 1000, 700)
        assert lookup.runs("default", _wire(chain[500:]), wait=True) == (800, 500, 200)
        assert truth(store, "default", chain) == (1300, 1000, 700)
    store.memory.remove([keys[0]])
    assert lookup.runs("default", _wire(chain), wait=True) == (1300, 0, 700)
    assert lookup.runs("default", _wire([]), wait=True) == (0, 0, 0)
    assert lookup.runs("other", _wire(chain), wait=True) == (0, 0, 0)


def test_tier_hits_matches_the_store_through_puts_removals_evictions_and_outside_writes(
    tmp_path: Path,
) -> None:
    """Blocks written before the server started, behind its back, by PUTs of two tenants, removed,
    evicted to disk: after every step TIER_HITS equals the store's own scan of the scoped keys."""
    disk = DiskTier(tmp_path / "d", 400 * BLOCK_BYTES)
    store = TieredStore(MemoryTier(60 * BLOCK_BYTES), disk, disk_admission="all")
    chains = [block_keys(NS, [root] * 4 + list(range(4 * 1200))) for root in range(3)]
    before = [tenant_key("default", k) for k in chains[0][:40]]
    store.put(before, [kv(i) for i in range(40)])  # stored before the server: unknown to its index
    thread = ServerThread(store, ServerConfig(port=0, tokens={"t-a": "acme", "t-b": "default"}))
    rng = random.Random(7)
    try:
        assert thread.server is not None
        lookup = thread.server.lookup
        with (
            CacheClient("127.0.0.1", thread.port, token="t-a") as acme,
            CacheClient("127.0.0.1", thread.port, token="t-b") as plain,
        ):
            assert plain.tier_hits(chains[0]) == truth(store, "default", chains[0]) == (40, 40, 0)
            assert len(lookup) == 40  # learnt by the lookup
            for step in range(120):
                client, tenant = rng.choice([(acme, "acme"), (plain, "default")])
                chain = rng.choice(chains)
                start = rng.randrange(0, 1100)
                span = chain[start : start + rng.randrange(1, 90)]
                action = rng.random()
                if action < 0.5:
                    client.put(span, [kv(step)] * len(span))
                elif action < 0.65:
                    client.remove(span)
                elif action < 0.8:  # behind the server's back: straight into a tier
                    scoped = [tenant_key(tenant, k) for k in span]
                    disk.put([(k, encode_block(k, kv(step))) for k in scoped])
                else:
                    store.memory.remove([tenant_key(tenant, k) for k in span])
                store.flush_deferred()
                for who, name in ((acme, "acme"), (plain, "default")):
                    for probe in chains:
                        for offset in (0, start):
                            got = tuple(who.tier_hits(probe[offset:]))
                            assert got == truth(store, name, probe[offset:]), (step, name, offset)
            assert client.tier_hits([]) == (0, 0, 0)
    finally:
        thread.close()
        store.close()


def test_a_prompt_of_8192_blocks_held_in_memory_is_answered_from_the_index() -> None:
    """After the first lookup every block is in the index: the second needs no store lock."""
    store = TieredStore(MemoryTier(9000 * BLOCK_BYTES))
    thread = ServerThread(store, ServerConfig(port=0))
    try:
        assert thread.server is not None
        keys = block_keys(NS, list(range(4 * 8192)))
        with CacheClient("127.0.0.1", thread.port) as client:
            for start in range(0, len(keys), 1024):
                client.put(keys[start : start + 1024], [kv(0)] * len(keys[start : start + 1024]))
            assert len(thread.server.lookup) == 8192
            with _held_elsewhere(store):  # the store is busy: the index alone answers
                lookup = thread.server.lookup
                assert lookup.runs("default", _wire(keys), wait=False) == (8192, 8192, 0)
                unknown = block_keys(NS, list(range(10_000, 10_004)))
                assert lookup.runs("default", _wire(unknown), wait=False) is None
            store.memory.remove([tenant_key("default", keys[5000])])
            assert client.tier_hits(keys) == (5000, 5000, 0)
            assert len(thread.server.lookup) == 8191
    finally:
        thread.close()
        store.close()


@contextlib.contextmanager
def _held_elsewhere(store: TieredStore) -> Iterator[None]:
    """The store's lock held by another thread (it is reentrant, so this thread's would not count)."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.lock():
            taken.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(30)
        yield
    finally:
        release.set()
        holder.join()


def _wire(keys: list[bytes]) -> bytes:
    return len(keys).to_bytes(4, "little") + b"".join(keys)

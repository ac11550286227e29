"""The store's KV events: vLLM's format, announced blocks only, store before removal, replay."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np
import pytest
import zmq

from agentinfra.errors import ConfigError, ProtocolError
from agentinfra.kvcache import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CacheClient,
    DiskTier,
    EventsConfig,
    KVEventBatch,
    MemoryTier,
    Namespace,
    ServerConfig,
    ServerThread,
    StoreEvents,
    TieredStore,
    block_keys,
    encode_block,
)
from agentinfra.kvcache._events import END_SEQ
from agentinfra.kvcache._server import tenant_key

NS = Namespace(model_id="tiny", block_size_tokens=4)
SHAPE = (2, 2, 4, 1, 8)
BLOCK_BYTES = 80 + 2 * 2 * 4 * 1 * 8 * 4
DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def kv(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


def replay(events: StoreEvents, start: int = 0, timeout_s: float = 5.0) -> list[KVEventBatch]:
    """Every batch since ``start``, asked of the replay socket once the queue has drained."""
    deadline = time.monotonic() + timeout_s
    while events._queue and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(3 * events.config.flush_s)
    assert events.replay_endpoint is not None
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(events.replay_endpoint)
    socket.send_multipart((b"", start.to_bytes(8, "big")))
    batches: list[KVEventBatch] = []
    try:
        while True:
            assert socket.poll(int(timeout_s * 1000)), "the replay socket did not answer"
            _, seq, payload = socket.recv_multipart()
            if seq == END_SEQ:
                return batches
            batches.append(DECODER.decode(payload))
    finally:
        socket.close(0)
        context.term()


def flat(batches: list[KVEventBatch]) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
    return [event for batch in batches for event in batch.events]


@pytest.fixture
def events() -> Iterator[StoreEvents]:
    publisher = StoreEvents(
        EventsConfig(
            endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", flush_s=0.01
        )
    )
    yield publisher
    publisher.close()


def test_a_stored_chain_is_published_with_its_tokens_and_parent(
    tmp_path: Path, events: StoreEvents
) -> None:
    store = TieredStore(MemoryTier(2 * BLOCK_BYTES), DiskTier(tmp_path / "d", 10 * BLOCK_BYTES),
                        disk_admission="all")  # fmt: skip
    store.watch(events.changed)
    tokens = list(range(100, 112))
    keys = block_keys(NS, tokens)
    events.announce(keys[:2], tokens[:8], block_size=4, parent=None, salt="acme")
    events.announce(keys[2:], tokens[8:], block_size=4, parent=keys[1])
    store.put(keys, [kv(i) for i in range(3)])  # memory holds 2: one goes to disk
    store.flush_deferred()
    got = flat(replay(events))
    assert isinstance(got[0], AllBlocksCleared)
    stored = [e for e in got if isinstance(e, BlockStored) and e.medium == "CPU"]
    hashes = [h for e in stored for h in e.block_hashes]
    assert hashes == keys
    assert stored[0].parent_block_hash is None
    assert stored[0].extra_keys == [("acme",), None]
    assert [t for e in stored for t in e.token_ids] == tokens
    assert all(e.block_size == 4 for e in stored)
    (victim,) = [i for i, key in enumerate(keys) if key not in store.memory]
    removed = [e for e in got if isinstance(e, BlockRemoved)]
    assert [(e.medium, e.block_hashes) for e in removed] == [("CPU", [keys[victim]])]
    on_disk = [e for e in got if isinstance(e, BlockStored) and e.medium == "STORAGE"]
    assert [e.block_hashes for e in on_disk] == [[keys[victim]]]
    assert on_disk[0].token_ids == tokens[victim * 4 : victim * 4 + 4]
    assert on_disk[0].parent_block_hash == (keys[victim - 1] if victim else None)
    assert got.index(removed[0]) > got.index(stored[0])  # a removal follows its store


def test_blocks_stored_before_their_announcement_are_published_when_it_comes(
    events: StoreEvents,
) -> None:
    store = TieredStore(MemoryTier(10 * BLOCK_BYTES))
    store.watch(events.changed)
    tokens = list(range(8))
    keys = block_keys(NS, tokens)
    store.put(keys, [kv(0), kv(1)])
    unrelated = block_keys(NS, [9, 9, 9, 9])
    store.put(unrelated, [kv(2)])  # never announced: counted, not published
    first = flat(replay(events))
    assert not [e for e in first if isinstance(e, BlockStored)]
    events.announce(keys, tokens, block_size=4, parent=None)
    store.remove(unrelated)
    got = flat(replay(events))
    stored = [e for e in got if isinstance(e, BlockStored)]
    assert [h for e in stored for h in e.block_hashes] == keys
    assert not [e for e in got if isinstance(e, BlockRemoved)]  # never published, never removed
    assert events.counts["unannounced"] == 3
    assert events.counts["stored"] == 2


def test_a_promoted_block_is_published_again_in_memory(tmp_path: Path, events: StoreEvents) -> None:
    store = TieredStore(MemoryTier(BLOCK_BYTES), DiskTier(tmp_path / "d", 10 * BLOCK_BYTES),
                        disk_admission="all")  # fmt: skip
    store.watch(events.changed)
    tokens = list(range(8))
    keys = block_keys(NS, tokens)
    events.announce(keys, tokens, block_size=4, parent=None)
    store.put(keys, [kv(0), kv(1)])
    store.flush_deferred()
    assert [b.header.key for b in store.get(keys[:1])] == keys[:1]  # promoted from disk
    store.flush_deferred()
    got = [e for e in flat(replay(events)) if not isinstance(e, AllBlocksCleared)]
    cpu = [(type(e).__name__, e.block_hashes) for e in got if e.medium == "CPU"]
    assert cpu[-1] == ("BlockStored", keys[:1])
    assert cpu.count(("BlockRemoved", keys[:1])) == 1


def test_live_subscribers_get_each_batch_in_order() -> None:
    publisher = StoreEvents(EventsConfig(endpoint="tcp://127.0.0.1:0", topic="kv", flush_s=0.01))
    context = zmq.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SUBSCRIBE, b"kv")
    socket.connect(publisher.endpoint)
    try:
        store = TieredStore(MemoryTier(10 * BLOCK_BYTES))
        store.watch(publisher.changed)
        time.sleep(0.3)  # a SUB socket misses what is sent before it has joined
        seen: list[int] = []
        keys: list[bytes] = []
        for round_ in range(3):
            tokens = [round_] * 4
            chain = block_keys(NS, tokens)
            publisher.announce(chain, tokens, block_size=4, parent=None)
            store.put(chain, [kv(round_)])
            keys += chain
            time.sleep(0.05)
        got: list[bytes] = []
        while len(got) < 3 and socket.poll(5000):
            topic, seq, payload = socket.recv_multipart()
            assert topic == b"kv"
            seen.append(int.from_bytes(seq, "big"))
            got += [h for e in DECODER.decode(payload).events if isinstance(e, BlockStored)
                    for h in e.block_hashes]  # fmt: skip
        assert got == keys
        assert seen == sorted(seen)
        assert len(set(seen)) == len(seen)
    finally:
        socket.close(0)
        context.term()
        publisher.close()


def test_bad_addresses_and_announcements_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="must be a ZMQ address"):
        EventsConfig(endpoint="127.0.0.1:5557")
    with pytest.raises(ConfigError, match="cannot bind KV events"):
        StoreEvents(EventsConfig(endpoint="tcp://203.0.113.1:5557"))
    publisher = StoreEvents(EventsConfig(endpoint="tcp://127.0.0.1:0"))
    try:
        with pytest.raises(ConfigError, match="2 blocks of 4 tokens got 7 tokens"):
            publisher.announce(block_keys(NS, list(range(8))), range(7), block_size=4, parent=None)
    finally:
        publisher.close()


def test_the_server_scopes_announced_keys_by_tenant_and_answers_tier_hits(tmp_path: Path) -> None:
    store = TieredStore(MemoryTier(2 * BLOCK_BYTES), DiskTier(tmp_path / "d", 10 * BLOCK_BYTES),
                        disk_admission="all")  # fmt: skip
    config = ServerConfig(
        port=0,
        tokens={"t-acme": "acme"},
        events=EventsConfig(
            endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", flush_s=0.01
        ),
    )
    thread = ServerThread(store, config)
    try:
        assert thread.server is not None
        assert thread.server.events is not None
        tokens = list(range(16))
        keys = block_keys(NS, tokens)
        with CacheClient("127.0.0.1", thread.port, token="t-acme") as client:
            assert client.announce(keys[:2], tokens[:8], block_size=4)
            assert client.announce(keys[2:], tokens[8:], block_size=4, parent=keys[1])
            client.put(keys, [kv(i) for i in range(4)])
            store.flush_deferred()
            scoped = [tenant_key("acme", k) for k in keys]

            def run(tier: object, chain: list[bytes]) -> int:
                held = [key in tier for key in chain]  # type: ignore[operator]
                return held.index(False) if False in held else len(held)

            memory, disk = store.memory, store.disk
            assert client.tier_hits(keys) == (4, run(memory, scoped), run(disk, scoped))
            assert 0 < run(memory, scoped) + run(disk, scoped) < 8  # memory holds two of four
            assert client.tier_hits(keys[1:]) == (
                3, run(memory, scoped[1:]), run(disk, scoped[1:])
            )  # fmt: skip
            assert client.tier_hits(block_keys(NS, [7] * 8)) == (0, 0, 0)
            with pytest.raises(ProtocolError, match="lineage of 1 blocks of 4 tokens got 3"):
                client.announce(keys[:1], tokens[:3], block_size=4)
        got = flat(replay(thread.server.events))
        stored = [e for e in got if isinstance(e, BlockStored) and e.medium == "CPU"]
        assert [h for e in stored for h in e.block_hashes] == scoped
        assert stored[0].extra_keys is not None
        assert stored[0].extra_keys[0] == ("acme",)
    finally:
        thread.close()


def test_a_server_without_events_says_so_to_an_announcement() -> None:
    thread = ServerThread(TieredStore(MemoryTier(10 * BLOCK_BYTES)), ServerConfig(port=0))
    try:
        keys = block_keys(NS, list(range(4)))
        with CacheClient("127.0.0.1", thread.port) as client:
            assert client.announce(keys, list(range(4)), block_size=4) is False
            client.put_encoded([(keys[0], encode_block(keys[0], kv(0)))])
            assert client.tier_hits(keys) == (1, 1, 0)
    finally:
        thread.close()

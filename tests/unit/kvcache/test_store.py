"""Memory and disk tiers, the tiered store, sessions, integrity and explain."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from agentinfra.errors import BlockFormatError, StoreLockedError
from agentinfra.kvcache import DiskTier, MemoryTier, Namespace, TieredStore, encode_block

NS = Namespace(model_id="tiny", block_size_tokens=4)
SHAPE = (2, 2, 4, 1, 8)  # layers, k/v, tokens, kv heads, head dim: 512 bytes of fp32 per block
BLOCK_BYTES = 80 + 2 * 2 * 4 * 1 * 8 * 4


def kv_for(key: bytes) -> np.ndarray:
    seed = int.from_bytes(key[:4], "little")
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_store(
    tmp_path: Path, memory_blocks: int, disk_blocks: int = 100, **kwargs: object
) -> TieredStore:
    disk = DiskTier(tmp_path / "disk", disk_blocks * BLOCK_BYTES)
    return TieredStore(MemoryTier(memory_blocks * BLOCK_BYTES), disk, **kwargs)  # type: ignore[arg-type]


def put_tokens(store: TieredStore, tokens: list[int]) -> list[bytes]:
    keys = store.keys_for(NS, tokens)
    store.put(keys, [kv_for(k) for k in keys])
    return keys


def test_round_trip_returns_verified_views(tmp_path: Path) -> None:
    store = make_store(tmp_path, 10)
    keys = put_tokens(store, list(range(12)))
    blocks = store.lookup(NS, list(range(14)))
    assert [b.header.key for b in blocks] == keys
    for block, key in zip(blocks, keys, strict=True):
        np.testing.assert_array_equal(block.as_numpy(), kv_for(key))
    assert store.stats().hit_blocks == 3
    memory = store.stats().tiers[0]
    assert (memory.name, memory.blocks, memory.puts, memory.hits, memory.misses) == (
        "memory",
        3,
        3,
        3,
        0,
    )
    assert memory.bytes_read == memory.bytes_written == 3 * BLOCK_BYTES
    assert memory.used_bytes == 3 * BLOCK_BYTES


def test_eviction_demotes_reused_blocks_to_disk_and_promotes_back(tmp_path: Path) -> None:
    store = make_store(tmp_path, 3)
    first = put_tokens(store, list(range(12)))
    assert len(store.get(first)) == 3  # second use: these have shown reuse
    put_tokens(store, list(range(100, 112)))  # evicts the first chain from memory
    assert not any(k in store.memory for k in first)
    assert all(k in store.disk for k in first)  # type: ignore[operator]
    blocks = store.get(first)
    assert len(blocks) == 3
    assert all(k in store.memory for k in first)
    stats = store.stats()
    assert stats.demotions >= 3
    assert stats.promotions == 3


def test_one_off_blocks_are_not_written_to_disk(tmp_path: Path) -> None:
    store = make_store(tmp_path, 2)
    once = put_tokens(store, list(range(8)))
    put_tokens(store, list(range(200, 208)))
    assert not any(k in store.disk for k in once)  # type: ignore[operator]
    assert store.stats().dropped == 2
    everything = make_store(tmp_path / "all", 2, disk_admission="all")
    once = put_tokens(everything, list(range(8)))
    put_tokens(everything, list(range(200, 208)))
    assert all(k in everything.disk for k in once)  # type: ignore[operator]


def test_corrupt_block_is_a_miss_and_quarantined(tmp_path: Path) -> None:
    store = make_store(tmp_path, 1, disk_admission="all")
    keys = put_tokens(store, list(range(12)))
    path = store.disk._path(keys[1])  # type: ignore[union-attr]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    store.memory.remove(keys)
    blocks = store.get(keys)
    assert [b.header.key for b in blocks] == keys[:1]  # the verified leading run
    stats = store.stats()
    assert stats.misses_by_reason["checksum"] == 1
    assert stats.quarantined == 1
    assert (tmp_path / "disk" / "quarantine" / path.name).exists()
    explanation = store.explain(NS, list(range(12)))
    assert explanation.reason == "checksum"
    assert explanation.first_missing == 1


def test_explain_reasons(tmp_path: Path) -> None:
    store = TieredStore(MemoryTier(2 * BLOCK_BYTES), clock=Clock())
    assert store.explain(NS, list(range(8))).reason == "never_stored"
    put_tokens(store, list(range(8)))
    hit = store.explain(NS, list(range(9)))
    assert hit.reason is None
    assert hit.hit_blocks == 2
    put_tokens(store, list(range(50, 58)))
    evicted = store.explain(NS, list(range(8)))
    assert evicted.reason == "evicted"
    assert evicted.eviction is not None
    assert evicted.eviction.policy == "prefix-lru"
    other = Namespace(model_id="tiny", kv_dtype="float16", block_size_tokens=4)
    wrong = store.explain(other, list(range(50, 58)))
    assert wrong.reason == "namespace"
    assert "bfloat16" in wrong.detail
    store.lookup(other, list(range(50, 58)))
    assert store.stats().misses_by_reason["namespace"] == 1


def test_session_pins_then_demotes_after_ttl_and_prefetches(tmp_path: Path) -> None:
    clock = Clock()
    store = make_store(tmp_path, 4, clock=clock)
    session = store.open_session("agent-1")
    keys = put_tokens(store, list(range(12)))
    assert session.begin_turn(keys) == 3
    put_tokens(store, list(range(300, 316)))  # pressure: 4 more blocks; the session's 3 are pinned
    assert all(k in store.memory for k in keys)
    session.end_turn(ttl_s=30)
    clock.now = 10
    store.get([])
    assert all(k in store.memory for k in keys)
    clock.now = 31
    store.get([])
    assert not any(k in store.memory for k in keys)
    assert all(k in store.disk for k in keys)  # type: ignore[operator]
    assert session.begin_turn(keys) == 3  # resume: prefetched back into memory
    assert all(k in store.memory for k in keys)
    child = store.open_session("agent-1/sub", parent=session)
    session.close()
    assert child.state.value == "closed"
    assert store.sessions() == []


def test_foreign_version_block_is_refused(tmp_path: Path) -> None:
    store = make_store(tmp_path, 4)
    key = store.keys_for(NS, list(range(4)))[0]
    data = bytearray(encode_block(key, kv_for(key)))
    data[4] = 9
    with pytest.raises(BlockFormatError, match="version 9"):
        store.put_encoded([(key, bytes(data))])
    assert key not in store.memory
    other = store.keys_for(NS, list(range(10, 14)))[0]
    with pytest.raises(BlockFormatError, match="another key"):
        store.put_encoded([(other, encode_block(key, kv_for(key)))])


def test_disk_index_rebuilt_after_restart_and_tmp_cleared(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path / "d", 10 * BLOCK_BYTES)
    store = TieredStore(MemoryTier(BLOCK_BYTES), disk, disk_admission="all")
    keys = put_tokens(store, list(range(16)))
    store.close()
    half_written = tmp_path / "d" / "tmp" / ("ab" * 32 + ".blk.tmp")
    half_written.write_bytes(b"partial")
    reopened = TieredStore(MemoryTier(BLOCK_BYTES), DiskTier(tmp_path / "d", 10 * BLOCK_BYTES))
    assert not half_written.exists()
    in_disk = [k for k in keys if k in reopened.disk]  # type: ignore[operator]
    assert len(in_disk) == 3  # the last block stayed in memory and was lost with it
    assert len(reopened.get(in_disk)) == 3


def test_directory_locks_and_foreign_directories(tmp_path: Path) -> None:
    first = DiskTier(tmp_path / "d", BLOCK_BYTES * 4)
    with pytest.raises(StoreLockedError, match=r"owned by another live store \(pid"):
        DiskTier(tmp_path / "d", BLOCK_BYTES * 4)
    first.close()
    DiskTier(tmp_path / "d", BLOCK_BYTES * 4).close()
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(StoreLockedError, match="not a KV store directory"):
        DiskTier(foreign, BLOCK_BYTES)
    assert (foreign / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_another_process_reads_the_disk_tier_read_only(tmp_path: Path) -> None:
    store = make_store(tmp_path, 1, disk_admission="all")
    keys = put_tokens(store, list(range(12)))
    on_disk = [k for k in keys if k in store.disk]  # type: ignore[operator]
    code = (
        "import sys; from pathlib import Path; from agentinfra.kvcache import DiskTier, parse_block;"
        f"d = DiskTier(Path({str(tmp_path / 'disk')!r}), 0, read_only=True);"
        f"keys = [bytes.fromhex(h) for h in {[k.hex() for k in on_disk]!r}];"
        "blocks = [parse_block(b, expected_key=k) for k, b in zip(keys, d.get(keys))];"
        "print(sum(b is not None for b in blocks))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(len(on_disk))


def test_many_threads_share_one_store(tmp_path: Path) -> None:
    store = make_store(tmp_path, 16, disk_blocks=64, disk_admission="all")
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(40):
                base = int(rng.integers(0, 6)) * 100
                tokens = list(range(base, base + 4 * int(rng.integers(1, 5))))
                keys = put_tokens(store, tokens)
                with store.lease(keys) as blocks:
                    for block in blocks:
                        np.testing.assert_array_equal(block.as_numpy(), kv_for(block.header.key))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert store.stats().misses_by_reason["checksum"] == 0


class RecordingRemote(MemoryTier):
    """A remote tier fake: a memory tier that records TTL extensions."""

    name = "remote"

    def __init__(self) -> None:
        super().__init__(1 << 30)
        self.touched: list[tuple[list[bytes], float]] = []

    def touch(self, keys: list[bytes], ttl_s: float) -> None:
        self.touched.append((list(keys), ttl_s))


def test_remote_tier_is_written_through_read_after_local_and_touched_by_sessions() -> None:
    remote = RecordingRemote()
    writer = TieredStore(MemoryTier(1 << 30), remote=remote)
    keys = put_tokens(writer, list(range(64)))
    assert all(k in remote for k in keys)  # written through
    reader = TieredStore(MemoryTier(1 << 30), remote=remote)  # another node
    assert reader.leading_hits(keys) == len(keys)
    assert len(reader.get(keys)) == len(keys)
    assert all(k in reader.memory for k in keys)  # promoted
    session = writer.open_session("agent")
    session.begin_turn(keys)
    session.end_turn(ttl_s=90)
    assert remote.touched == [(keys, 90)]
    assert writer.stats().tiers[-1].name == "remote"
    assert writer.remove(keys) == 2 * len(keys)  # memory and remote copies


def test_a_done_session_releases_only_its_private_blocks(tmp_path: Path) -> None:
    store = make_store(tmp_path, 10)
    shared = put_tokens(store, list(range(8)))  # a system prompt both agents read
    first, second = store.open_session("a"), store.open_session("b")
    first.begin_turn(shared)
    second.begin_turn(shared)
    private = put_tokens(store, list(range(8)) + list(range(100, 108)))[2:]  # a's own turn
    first.add(private)
    first.end_turn(ttl_s=60)
    first.close(release_private=True)
    assert all(k in store.memory for k in shared)  # b still holds them, and held them before
    assert not any(k in store.memory for k in private)
    assert all(k in store.disk for k in private)  # type: ignore[operator]  # demoted, not lost
    assert store.stats().released == len(private)
    second.close()  # without release: its blocks simply become ordinary
    assert all(k in store.memory for k in shared)

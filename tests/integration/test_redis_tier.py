"""The Redis/Valkey tier against real redis-server processes: one node, two stores, a 3-node cluster."""

from __future__ import annotations

import subprocess
import time

import numpy as np
import pytest
import redis
import redis.cluster

from agentinfra.errors import ConfigError
from agentinfra.kvcache import (
    MemoryTier,
    Namespace,
    RedisTier,
    TieredStore,
    block_keys,
    encode_block,
)

pytestmark = pytest.mark.service
NS = Namespace(model_id="redis-test", kv_dtype="float32", block_size_tokens=8)


def blocks(count: int, seed: int = 0, width: int = 256) -> list[tuple[bytes, bytes]]:
    rng = np.random.default_rng(seed)
    keys = block_keys(NS, rng.integers(0, 10_000, count * 8))
    return [(k, encode_block(k, rng.random((2, 2, 8, 2, width), dtype=np.float32))) for k in keys]


def test_chunked_roundtrip_ttl_touch_and_remove(redis_url: str) -> None:
    tier = RedisTier(redis_url, chunk_bytes=8192, ttl_s=60)
    items = blocks(5)  # 65 KiB blocks -> 9 chunks each
    assert tier.put(items).stored == tuple(k for k, _ in items)
    keys = [k for k, _ in items]
    assert tier.leading_hits(keys) == 5
    assert tier.get(keys) == [d for _, d in items]
    raw = redis.Redis.from_url(redis_url)
    name = f"aikv:{{{keys[0].hex()}}}"
    assert raw.exists(f"{name}:8") == 1
    assert 0 < raw.pttl(f"{name}:m") <= 60_000
    tier.touch(keys[:1], 600)
    assert raw.pttl(f"{name}:m") > 60_000
    assert raw.pttl(f"{name}:3") > 60_000
    raw.delete(f"{name}:4")  # a chunk evicted by Redis: a miss, never a short block
    assert tier.get(keys[:2]) == [None, items[1][1]]
    assert tier.remove(keys[1:]) == 4
    assert tier.leading_hits(keys[1:]) == 0
    assert tier.stats().hits >= 6
    raw.close()
    tier.close()


def test_two_nodes_share_blocks_through_redis(redis_url: str) -> None:
    node_a = TieredStore(MemoryTier(1 << 20), remote=RedisTier(redis_url))
    node_b = TieredStore(MemoryTier(1 << 20), remote=RedisTier(redis_url))
    items = blocks(3)
    keys = [k for k, _ in items]
    node_a.put_encoded(items)
    assert node_b.leading_hits(keys) == 3
    got = node_b.get(keys)  # verified, promoted into B's memory
    assert [bytes(g.payload) for g in got] == [d[80:] for _, d in items]
    assert all(k in node_b.memory for k in keys)
    assert node_b.stats().tiers[-1].name == "redis"


def test_redis_down_means_misses_not_errors(redis_url: str) -> None:
    tier = RedisTier(redis_url, retry_after_s=60, socket_timeout_s=1)
    store = TieredStore(MemoryTier(1 << 20), remote=tier)
    items = blocks(2)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    subprocess.run(
        ["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True, timeout=10
    )
    assert store.put_encoded(items) == 2  # memory took them; Redis rejected them
    assert tier.stats().rejected == 2
    assert tier.errors >= 1
    assert len(store.get([k for k, _ in items])) == 2
    other = blocks(2, seed=5)
    assert store.get([k for k, _ in other]) == []


def test_bad_settings_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="chunk_bytes"):
        RedisTier("redis://127.0.0.1:1/0", chunk_bytes=10)
    with pytest.raises(ConfigError, match="--redis"):
        RedisTier("notaurl://x")


def test_three_node_cluster_loses_only_the_dead_nodes_blocks(
    redis_cluster: list[tuple[int, subprocess.Popen[bytes]]],
) -> None:
    first_port = redis_cluster[0][0]
    tier = RedisTier(
        f"redis://127.0.0.1:{first_port}", cluster=True, chunk_bytes=16384, socket_timeout_s=1
    )
    items = blocks(30, seed=3)
    keys = [k for k, _ in items]
    assert len(tier.put(items).stored) == 30
    assert tier.get(keys) == [d for _, d in items]
    assert tier.stats().blocks >= 30 * 3  # chunks + meta on all three primaries
    cluster = redis.cluster.RedisCluster(host="127.0.0.1", port=first_port)
    owners: dict[int, set[bytes]] = {port: set() for port, _ in redis_cluster}
    for key in keys:
        owners[cluster.get_node_from_key(f"aikv:{{{key.hex()}}}:m").port].add(key)
    cluster.close()
    assert all(owners.values()), "every node should own some blocks"
    dead_port, dead = redis_cluster[1]
    dead.kill()
    dead.wait(10)
    deadline = time.monotonic() + 15  # read once the others have marked it failed, as in production
    while time.monotonic() < deadline and b" fail " not in subprocess.run(
        ["redis-cli", "-p", str(first_port), "cluster", "nodes"], capture_output=True, timeout=5
    ).stdout.replace(b",fail ", b" fail "):
        time.sleep(0.2)
    got = tier.get(keys)
    for key, data, found in zip(keys, [d for _, d in items], got, strict=True):
        if key in owners[dead_port]:
            assert found is None
        else:
            assert found == data

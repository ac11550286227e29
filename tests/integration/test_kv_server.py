"""The cache server end to end: real sockets, real subprocesses, fuzzed frames, kills."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from services import free_port

from agentinfra.errors import ProtocolError, TierUnavailableError
from agentinfra.kvcache import (
    CacheClient,
    MemoryTier,
    Namespace,
    Op,
    ServerConfig,
    ServerThread,
    Status,
    TieredStore,
    block_keys,
    encode_block,
)
from agentinfra.kvcache._protocol import HEADER, decode_error, encode_header, encode_hello

NS = Namespace(model_id="test-model", kv_dtype="float32", block_size_tokens=16)


def serve_in_thread(store: TieredStore, **config: object) -> ServerThread:
    return ServerThread(store, ServerConfig(port=0, **config))  # type: ignore[arg-type]


@pytest.fixture
def server() -> Iterator[ServerThread]:
    thread = serve_in_thread(TieredStore(MemoryTier(256 << 20)), metrics_port=0)
    yield thread
    thread.close()


def chain(tokens: int = 64, seed: int = 0, ns: Namespace = NS) -> tuple[list[bytes], list[bytes]]:
    rng = np.random.default_rng(seed)
    keys = block_keys(ns, rng.integers(0, 50_000, tokens))
    blocks = [encode_block(k, rng.random((2, 2, 16, 2, 8), dtype=np.float32)) for k in keys]
    return list(keys), blocks


def test_roundtrip_isolation_stats_explain_and_metrics(server: ServerThread) -> None:
    keys, blocks = chain()
    with (
        CacheClient("127.0.0.1", server.port, tenant="a") as a,
        CacheClient("127.0.0.1", server.port, tenant="b") as b,
    ):
        assert a.put_encoded(list(zip(keys, blocks, strict=True))) == 4
        assert a.leading_hits(keys) == 4
        got = a.get(keys)
        assert [bytes(g.payload) for g in got] == [blk[80:] for blk in blocks]
        assert [g.header.key for g in got] == keys  # headers carry the client's keys
        assert b.leading_hits(keys) == 0
        assert b.get(keys) == []
        explanation = b.explain_keys(keys)
        assert explanation["reason"] == "never_stored"
        assert explanation["key"] == keys[0].hex()
        assert a.explain_keys(keys)["hit_blocks"] == 4
        assert a.remove(keys[2:]) == 2
        assert a.leading_hits(keys) == 2
        stats = a.stats()
        assert stats["tiers"][0]["name"] == "memory"
        assert stats["tiers"][0]["blocks"] == 2
        assert stats["server"]["connections"] == 2
    assert server.server is not None
    assert server.server.metrics_port
    text = (
        urllib.request.urlopen(f"http://127.0.0.1:{server.server.metrics_port}/metrics", timeout=5)
        .read()
        .decode()
    )
    assert "agentinfra_kv_prefix_cache_queries_blocks_total 20.0" in text  # 5 calls x 4 keys
    assert 'agentinfra_kv_tier_blocks{tier="memory"} 2.0' in text
    assert 'agentinfra_kv_requests_total{op="GET",status="OK"} 2.0' in text
    assert "agentinfra_kv_request_seconds_bucket" in text
    assert 'agentinfra_kv_misses_total{reason="never_stored"} 1.0' in text


def test_tokens_are_required_and_decide_the_tenant() -> None:
    thread = serve_in_thread(TieredStore(MemoryTier(64 << 20)), tokens={"good": "team-a"})
    try:
        with pytest.raises(ProtocolError) as caught:
            CacheClient("127.0.0.1", thread.port, token="wrong")
        assert caught.value.status is Status.UNAUTHORIZED
        with pytest.raises(ProtocolError):
            CacheClient("127.0.0.1", thread.port, tenant="team-b", token="good")
        with CacheClient("127.0.0.1", thread.port, token="good") as client:
            assert client.server_info["tenant"] == "team-a"
        with socket.create_connection(("127.0.0.1", thread.port)) as raw:  # no HELLO first
            raw.sendall(encode_header(Op.STATS, 9, 0))
            assert _read_error(raw).status is Status.UNAUTHORIZED
    finally:
        thread.close()


def _read_error(raw: socket.socket) -> ProtocolError:
    raw.settimeout(5)
    data = b""
    while True:
        chunk = raw.recv(65536)
        if not chunk:
            break
        data += chunk
    offset = 0
    while offset + HEADER.size <= len(data):  # skip answers (HELLO) before the error
        magic, _v, op, _f, _rid, length, _r = HEADER.unpack_from(data, offset)
        assert magic == b"AIKP"
        if op == Op.ERROR:
            return decode_error(data[offset + HEADER.size : offset + HEADER.size + length])
        offset += HEADER.size + length
    raise AssertionError("the server closed without an error frame")


def test_oversized_truncated_and_garbage_frames_close_only_their_connection() -> None:
    thread = serve_in_thread(TieredStore(MemoryTier(64 << 20)), max_frame_bytes=8192)
    keys, blocks = chain()
    try:
        with CacheClient("127.0.0.1", thread.port) as good:
            good.put_encoded(list(zip(keys, blocks, strict=True))[:1])
            with socket.create_connection(("127.0.0.1", thread.port)) as raw:
                raw.sendall(encode_header(Op.GET, 1, 10_000))
                assert _read_error(raw).status is Status.FRAME_TOO_LARGE
            with socket.create_connection(("127.0.0.1", thread.port)) as raw:
                raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert _read_error(raw).status is Status.BAD_FRAME
            with socket.create_connection(("127.0.0.1", thread.port)) as raw:
                raw.sendall(encode_header(Op.PUT, 1, 1000) + b"x" * 10)  # then hang up
            hello = encode_hello("", "")
            with socket.create_connection(("127.0.0.1", thread.port)) as raw:
                bad_put = b"\x01\x00\x00\x00" + (99).to_bytes(8, "little") + b"short"
                raw.sendall(encode_header(Op.HELLO, 1, len(hello)) + hello)
                raw.sendall(encode_header(Op.PUT, 2, len(bad_put)) + bad_put)
                time.sleep(0.2)
                assert _read_error(raw).status is Status.BAD_REQUEST
            with socket.create_connection(("127.0.0.1", thread.port)) as raw:
                corrupt = bytearray(blocks[0])
                corrupt[-1] ^= 0xFF
                body = b"\x01\x00\x00\x00" + len(corrupt).to_bytes(8, "little") + corrupt
                raw.sendall(encode_header(Op.HELLO, 1, len(hello)) + hello)
                raw.sendall(encode_header(Op.PUT, 2, len(body)) + body)
                assert _read_error(raw).status is Status.BAD_BLOCK
            assert good.leading_hits(keys) == 1  # the well-behaved client never noticed
    finally:
        thread.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(garbage=st.binary(min_size=1, max_size=300), with_hello=st.booleans())
def test_fuzzed_frames_never_hurt_other_clients(
    server: ServerThread, garbage: bytes, with_hello: bool
) -> None:
    hello = encode_hello("", "")
    with CacheClient("127.0.0.1", server.port) as good:
        with socket.create_connection(("127.0.0.1", server.port)) as raw:
            if with_hello:
                raw.sendall(encode_header(Op.HELLO, 1, len(hello)) + hello)
            raw.sendall(garbage)
            raw.shutdown(socket.SHUT_WR)
            raw.settimeout(5)
            while raw.recv(65536):  # the server answers (or not) and closes
                pass
        assert good.stats()["server"]["protocol"] == 1


def test_pipelined_requests_from_many_tasks(server: ServerThread) -> None:
    from agentinfra.kvcache import AsyncCacheClient

    async def run() -> None:
        client = await AsyncCacheClient.connect("127.0.0.1", server.port)
        chains = [chain(64, seed) for seed in range(20)]
        await asyncio.gather(*(client.put_encoded(list(zip(k, b, strict=True))) for k, b in chains))
        results = await asyncio.gather(*(client.get(k) for k, _ in chains))
        for (_keys, blocks), got in zip(chains, results, strict=True):
            assert [bytes(g.payload) for g in got] == [b[80:] for b in blocks]
        buffer = bytearray(1 << 20)
        got = await client.get(chains[0][0], into=buffer)
        assert got[0].payload.obj is buffer or bytes(got[0].payload) == chains[0][1][0][80:]
        await client.close()

    asyncio.run(run())


def _serve(port: int, disk: Path, *extra: str) -> subprocess.Popen[bytes]:
    log = disk.parent / f"serve-{port}.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "agentinfra", "kv", "serve", "--port", str(port), "--disk-dir", str(disk),
             "--memory", "1GiB", "--disk", "4GiB", "--metrics-port", str(free_port()), *extra],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process
        except OSError:
            assert process.poll() is None, log.read_text()
            time.sleep(0.1)
    raise AssertionError("kv serve did not start")


@pytest.mark.slow
def test_kill_mid_transfer_then_restart_keeps_the_disk_tier(tmp_path: Path) -> None:
    port = free_port()
    process = _serve(port, tmp_path / "kv")
    try:
        _kill_mid_transfer_then_restart(port, process, tmp_path)
    finally:
        process.kill()
        process.wait(10)


def _kill_mid_transfer_then_restart(
    port: int, process: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    rng = np.random.default_rng(1)
    ns = Namespace(model_id="big", kv_dtype="float32", block_size_tokens=1024)
    keys = block_keys(ns, rng.integers(0, 1000, 8192))
    kv = rng.random((4, 2, 1024, 8, 128), dtype=np.float32)  # 32 MiB per block
    items = [(k, encode_block(k, kv)) for k in keys]
    with CacheClient("127.0.0.1", port) as client:
        client.put_encoded(items)
    outcomes: list[object] = []

    def reader() -> None:
        try:
            with CacheClient("127.0.0.1", port) as client:
                for _ in range(50):
                    outcomes.append(len(client.get(keys)))
        except TierUnavailableError as exc:
            outcomes.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(1.0)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    thread.join(30)
    assert isinstance(outcomes[-1], TierUnavailableError), outcomes[-3:]
    assert all(
        o in (0, len(keys)) or isinstance(o, Exception) for o in outcomes
    )  # every GET verified
    process = _serve(port, tmp_path / "kv")
    try:
        with CacheClient("127.0.0.1", port) as client:
            got = client.get(keys)
            assert len(got) == len(keys)
            assert all(bytes(g.payload) == items[0][1][80:] for g in got)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0


def test_unreachable_server_is_one_clear_error() -> None:
    port = free_port()
    with pytest.raises(TierUnavailableError, match=f"127.0.0.1:{port}.*kv serve"):
        CacheClient("127.0.0.1", port, timeout_s=2)


@pytest.mark.parametrize("same", [True, False], ids=["port-is-metrics-port", "metrics-port-taken"])
def test_a_port_clash_is_one_line_naming_the_knob(tmp_path: Path, same: bool) -> None:
    port = free_port()
    with socket.create_server(("127.0.0.1", 0)) as taken:
        metrics = port if same else taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "agentinfra", "kv", "serve", "--port", str(port), "--memory", "64MiB",
             "--metrics-port", str(metrics)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert "--metrics-port" in done.stderr, done.stderr
    assert str(metrics) in done.stderr, done.stderr
    with socket.create_server(("127.0.0.1", port)):
        pass  # the main port was let go


@pytest.mark.service
def test_server_keeps_serving_when_redis_dies(tmp_path: Path, redis_url: str) -> None:
    from agentinfra.kvcache import RedisTier

    remote = RedisTier(redis_url, retry_after_s=0.5, socket_timeout_s=1)
    thread = serve_in_thread(TieredStore(MemoryTier(64 << 20), remote=remote))
    keys, blocks = chain()
    try:
        with CacheClient("127.0.0.1", thread.port) as client:
            client.put_encoded(list(zip(keys, blocks, strict=True)))
            assert remote.stats().blocks >= 4  # written through to Redis
            port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
            subprocess.run(
                ["redis-cli", "-p", str(port), "shutdown", "nosave"],
                capture_output=True,
                timeout=10,
            )
            assert len(client.get(keys)) == 4  # memory still serves
            other, more = chain(seed=7)
            client.put_encoded(list(zip(other, more, strict=True)))  # Redis rejects, memory keeps
            assert client.leading_hits(other) == 4
            assert remote.errors >= 1
    finally:
        thread.close()


def test_cli_serve_stats_and_explain_with_tokens(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# tenant token\nteam-a secret-a\nteam-b secret-b\n")
    client_token = tmp_path / "client-token"
    client_token.write_text("secret-a\n")
    port = free_port()
    process = _serve(port, tmp_path / "kv", "--token-file", str(tokens))
    try:
        ns = Namespace(model_id="cli-model", kv_dtype="float32", block_size_tokens=16)
        ids = list(range(64))
        keys = block_keys(ns, ids)
        rng = np.random.default_rng(3)
        with CacheClient("127.0.0.1", port, token="secret-a") as client:
            client.put(keys[:2], [rng.random((2, 2, 16, 2, 8), dtype=np.float32) for _ in range(2)])
        (tmp_path / "ids.json").write_text(json.dumps(ids))
        common = ["--port", str(port), "--token-file", str(client_token)]
        stats = subprocess.run(
            [sys.executable, "-m", "agentinfra", "kv", "stats", "--json", *common],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        data = json.loads(stats.stdout)
        assert data["tiers"][0]["blocks"] == 2
        assert data["tiers"][1]["name"] == "disk"
        assert data["tiers"][1]["blocks"] == 2  # write-through
        explain = subprocess.run(
            [sys.executable, "-m", "agentinfra", "kv", "explain", str(tmp_path / "ids.json"), "--model-id",
             "cli-model", "--kv-dtype", "float32", "--block-size", "16", *common],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert "2/4 blocks hit" in explain.stdout
        assert "block 2" in explain.stdout
        assert "never stored" in explain.stdout
        client_token.write_text("wrong\n")
        refused = subprocess.run(
            [sys.executable, "-m", "agentinfra", "kv", "stats", *common],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert refused.returncode == 2
        assert "UNAUTHORIZED" in refused.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    bad = subprocess.run(
        [sys.executable, "-m", "agentinfra", "kv", "serve", "--port", str(free_port()), "--token-file", str(empty)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "holds no token (--token-file)" in bad.stderr


def test_session_hints_over_the_protocol(server: ServerThread) -> None:
    shared_keys, shared_blocks = chain(32, seed=1)  # a system prompt both agents read
    own_keys, own_blocks = chain(32, seed=2)
    with (
        CacheClient("127.0.0.1", server.port, tenant="a") as agent,
        CacheClient("127.0.0.1", server.port, tenant="a") as other,
        CacheClient("127.0.0.1", server.port, tenant="b") as stranger,
    ):
        agent.put_encoded(list(zip(shared_keys, shared_blocks, strict=True)))
        assert agent.session("run-1", "begin", shared_keys) == {
            "session": "run-1",
            "open": True,
            "hits": 2,
        }
        assert other.session("run-2", "begin", shared_keys)["hits"] == 2
        agent.put_encoded(list(zip(own_keys, own_blocks, strict=True)))
        agent.session("run-1", "add", own_keys)
        agent.session("run-1", "end", ttl_s=30)
        # another tenant's session of the same name is another session: closing it touches nothing of a's
        assert stranger.session("run-1", "close") == {"session": "run-1", "open": False}
        assert agent.leading_hits(own_keys) == 2
        assert agent.session("run-1", "close") == {"session": "run-1", "open": False}
        assert (
            agent.leading_hits(own_keys) == 0
        )  # its private blocks left memory (no disk tier here)
        assert agent.leading_hits(shared_keys) == 2  # run-2 holds the shared ones
        assert agent.stats()["released"] == 2
        with pytest.raises(ProtocolError, match="action 'pin'"):
            agent.session("run-2", "pin")
        assert (
            other.session("run-2", "close")["open"] is False
        )  # the connection survived the refusal


def test_concurrent_requests_on_one_connection_never_interleave_their_frames(
    server: ServerThread,
) -> None:
    """An engine saves in the background while it loads, on one connection: a large PUT that
    must wait for the socket may not let a GET's frame in between its pieces."""
    from agentinfra.kvcache import AsyncCacheClient

    rng = np.random.default_rng(5)
    big = []
    for i in range(4):  # 8 MiB each: far more than a loopback socket takes at once
        ns = Namespace(model_id=f"big-{i}", kv_dtype="float32", block_size_tokens=16)
        key = block_keys(ns, np.arange(16))[0]
        big.append((key, encode_block(key, rng.random((32, 2, 16, 8, 128), dtype=np.float32))))
    keys, blocks = chain(64, seed=6)

    async def run() -> tuple[int, int, int]:
        client = await AsyncCacheClient.connect("127.0.0.1", server.port)
        try:
            await client.put_encoded(list(zip(keys, blocks, strict=True)))

            async def gets() -> int:
                for _ in range(100):
                    assert len(await client.get(keys)) == len(keys)
                return len(keys)

            return await asyncio.gather(
                client.put_encoded(big), gets(), client.put_encoded(big[::-1])
            )
        finally:
            await client.close()

    assert asyncio.run(run()) == [4, 4, 4]

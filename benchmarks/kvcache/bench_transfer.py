"""Moves the same KV blocks through the raw limits and through agentinfra, in one run.

Raw limits: memcpy, a loopback TCP socket (sender in another process, receiver
``recv_into`` a reused buffer), file write and read (page cache), redis-py SET/GET.
Then: the memory tier, the disk tier, the cache server (GET into a reused buffer,
GET into a fresh buffer, PUT) and the Redis tier. Then server GET with 1..64
concurrent clients. Prints one JSON line per measurement: GB/s, p50 and p99.

    python benchmarks/kvcache/bench_transfer.py            # full (a few minutes)
    python benchmarks/kvcache/bench_transfer.py --smoke    # seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, free_port, wait_port

from agentinfra.kvcache import (
    AsyncCacheClient,
    DiskTier,
    MemoryTier,
    Namespace,
    RedisTier,
    TieredStore,
    block_keys,
    encode_block,
)

MiB = 1024 * 1024


def make_block(size: int, seed: int = 0) -> tuple[bytes, bytes]:
    """An encoded float16 block whose payload is ``size`` bytes."""
    tokens = size // (4 * 2 * 8 * 128 * 2)
    rng = np.random.default_rng(seed)
    kv = rng.integers(0, 1 << 16, (4, 2, tokens, 8, 128), dtype=np.uint16).view(np.float16)
    ns = Namespace(model_id=f"bench-{size}-{seed}", kv_dtype="float16", block_size_tokens=tokens)
    key = block_keys(ns, np.arange(tokens))[0]
    return key, encode_block(key, kv)


def measure(
    name: str, size: int, repeat: int, op: Callable[[], Any], **extra: Any
) -> dict[str, Any]:
    op()  # warm
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        op()
        times.append(time.perf_counter() - t)
    return summarise(name, size, times, **extra)


def summarise(
    name: str, size: int, times: list[float], clients: int = 1, **extra: Any
) -> dict[str, Any]:
    times = sorted(times)
    total = sum(times) / clients  # clients run concurrently: wall time ~ sum / clients
    return {
        "bench": "kv_transfer",
        "path": name,
        "block_bytes": size,
        "clients": clients,
        "ops": len(times),
        "gb_per_s": round(len(times) * size / total / 1e9, 3),
        "p50_ms": round(statistics.median(times) * 1000, 3),
        "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))] * 1000, 3),
        **extra,
    }


def _raw_sender(port: int, payload_size: int, ready: Any) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen()
    ready.set()
    payload = os.urandom(payload_size)
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while conn.recv(1):
        conn.sendall(payload)
    conn.close()
    srv.close()


@contextlib.contextmanager
def raw_socket_session(size: int) -> Iterator[Callable[[], None]]:
    """A sender process on loopback; each call of the yielded function receives ``size`` bytes
    into one reused buffer."""
    port = free_port()
    ready = multiprocessing.Event()
    sender = multiprocessing.Process(target=_raw_sender, args=(port, size, ready))
    sender.start()
    ready.wait(10)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    view = memoryview(bytearray(size))

    def once() -> None:
        sock.send(b"x")
        got = 0
        while got < size:
            got += sock.recv_into(view[got:])

    try:
        yield once
    finally:
        sock.close()
        sender.join(10)


def raw_socket(size: int, repeat: int) -> dict[str, Any]:
    with raw_socket_session(size) as once:
        return measure("raw_socket", size, repeat, once)


def server_process(
    port: int, disk: Path | None, shm_socket: Path | None = None
) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "agentinfra", "kv", "serve", "--port", str(port), "--memory", "8GiB",
            "--metrics-port", str(free_port())]  # fmt: skip
    if disk is not None:
        args += ["--disk-dir", str(disk), "--disk", "16GiB"]
    if shm_socket is not None:
        args += ["--shm-socket", str(shm_socket)]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return process


async def server_paths(
    port: int, size: int, repeat: int, concurrency: list[int]
) -> list[dict[str, Any]]:
    key, data = make_block(size, seed=7)
    client = await AsyncCacheClient.connect("127.0.0.1", port)
    await client.put_encoded([(key, data)])
    buffer = bytearray(len(data) + 64)
    results = []
    for name, call in (
        ("server_get_into", lambda: client.get([key], into=buffer)),
        ("server_get_fresh", lambda: client.get([key])),
        ("server_put", lambda: client.put_encoded([(key, data)])),
    ):
        await call()
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            got = await call()
            times.append(time.perf_counter() - t)
            if name.startswith("server_get"):
                assert len(got) == 1
        results.append(summarise(name, size, times))
    await client.close()
    for clients in concurrency:
        conns = [await AsyncCacheClient.connect("127.0.0.1", port) for _ in range(clients)]
        per = max(2, repeat // clients)
        buffers = [bytearray(len(data) + 64) for _ in conns]

        async def worker(c: AsyncCacheClient, buf: bytearray, per: int = per) -> list[float]:
            out = []
            for _ in range(per):
                t = time.perf_counter()
                await c.get([key], into=buf)
                out.append(time.perf_counter() - t)
            return out

        started = time.perf_counter()
        lists = await asyncio.gather(*(worker(c, b) for c, b in zip(conns, buffers, strict=True)))
        wall = time.perf_counter() - started
        times = sorted(t for lst in lists for t in lst)
        row = summarise("server_get_concurrent", size, times, clients=clients)
        row["gb_per_s"] = round(len(times) * size / wall / 1e9, 3)  # wall-clock throughput
        results.append(row)
        for c in conns:
            await c.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny repeat counts; for CI")
    parser.add_argument("--out", type=Path, help="also append the JSON lines to this file")
    args = parser.parse_args()
    sizes = [256 * 1024, 2 * MiB, 32 * MiB]
    budget = (32 if args.smoke else 512) * MiB
    concurrency = [1, 8] if args.smoke else [1, 4, 16, 64]
    env = environment()
    rows: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-transfer-"))
    redis_proc = None
    redis_url = None
    if shutil.which("redis-server"):
        rport = free_port()
        redis_proc = subprocess.Popen(
            ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(tmp)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_port(rport)
        redis_url = f"redis://127.0.0.1:{rport}/0"
    sport = free_port()
    server = server_process(sport, None)
    try:
        for size in sizes:
            repeat = max(3, min(200, budget // size))
            key, data = make_block(size)
            src = np.frombuffer(data, dtype=np.uint8)
            dst = np.empty_like(src)
            rows.append(measure("raw_memcpy", size, repeat, lambda s=src, d=dst: np.copyto(d, s)))
            rows.append(raw_socket(size, repeat))
            path = tmp / f"raw-{size}"
            rows.append(
                measure("raw_file_write", size, repeat, lambda p=path, d=data: p.write_bytes(d))
            )
            buf = bytearray(len(data))

            def read_into(p: Path = path, b: bytearray = buf) -> None:
                with open(p, "rb", buffering=0) as handle:
                    handle.readinto(b)

            rows.append(measure("raw_file_read", size, repeat, read_into))
            memory = TieredStore(MemoryTier(4 << 30))
            memory.put_encoded([(key, data)])
            rows.append(
                measure("memory_tier_get", size, repeat, lambda s=memory, k=key: s.get([k]))
            )
            disk = DiskTier(tmp / f"disk-{size}", 8 << 30)
            rows.append(
                measure(
                    "disk_tier_put",
                    size,
                    repeat,
                    lambda t=disk, k=key, d=data: (t.remove([k]), t.put([(k, d)])),
                )
            )
            rows.append(
                measure(
                    "disk_tier_get_into",
                    size,
                    repeat,
                    lambda t=disk, k=key, b=buf: t.get_into([k], [b]),
                )
            )
            disk.close()
            if redis_url is not None:
                import redis

                raw = redis.Redis.from_url(redis_url)
                rows.append(
                    measure("raw_redis_set", size, repeat, lambda r=raw, d=data: r.set("raw", d))
                )
                rows.append(measure("raw_redis_get", size, repeat, lambda r=raw: r.get("raw")))
                raw.close()
                tier = RedisTier(redis_url)
                rows.append(
                    measure(
                        "redis_tier_put",
                        size,
                        repeat,
                        lambda t=tier, k=key, d=data: t.put([(k, d)]),
                    )
                )
                rows.append(
                    measure("redis_tier_get", size, repeat, lambda t=tier, k=key: t.get([k]))
                )
                tier.close()
            rows.extend(asyncio.run(server_paths(sport, size, repeat, concurrency)))
            for row in rows:
                if "git" not in row:
                    row.update(env)
                    line = json.dumps(row, sort_keys=True)
                    print(line, flush=True)
                    if args.out:
                        with open(args.out, "a") as out:
                            out.write(line + "\n")
    finally:
        server.terminate()
        server.wait(20)
        if redis_proc is not None:
            redis_proc.kill()
            redis_proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

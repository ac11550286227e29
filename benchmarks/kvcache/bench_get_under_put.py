"""GET latency of memory-resident blocks while other clients PUT with write-through.

The server (its own process) has a memory tier and a write-through disk tier, so
every PUT writes its blocks to disk (fsync'd) before it is acknowledged. One
client GETs blocks that are resident in memory and times each request; ``--putters``
other clients (each its own process) PUT fresh blocks as fast as they can. A
server that holds its store lock during disk writes, or does disk I/O on its
event loop, shows it as a long tail on the memory GETs.

    python benchmarks/kvcache/bench_get_under_put.py            # 20 s, 4 putters
    python benchmarks/kvcache/bench_get_under_put.py --smoke    # 3 s

Prints one JSON line: GET p50/p99/max in ms, GETs and PUT bytes per second.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, free_port, wait_port

from agentinfra.kvcache import CacheClient, Namespace, block_keys, encode_block

KiB = 1024
SERVER = """
import asyncio, sys
from pathlib import Path
from agentinfra.kvcache import CacheServer, DiskTier, MemoryTier, ServerConfig, TieredStore
async def main():
    store = TieredStore(MemoryTier(1 << 30), DiskTier(Path(sys.argv[2]), 8 << 30), disk_admission="write-through")
    async with CacheServer(store, ServerConfig(port=int(sys.argv[1]), metrics_port=None)):
        await asyncio.Event().wait()
asyncio.run(main())
"""


def blocks(model: str, count: int, block_bytes: int, seed: int) -> list[tuple[Any, bytes]]:
    namespace = Namespace(model_id=model, kv_dtype="uint8", block_size_tokens=16)
    tokens = np.random.default_rng(seed).integers(0, 50_000, size=count * 16)
    # [layers, 2, tokens, kv_heads, head_dim] of uint8: block_bytes in all
    payload = np.random.default_rng(seed).integers(
        0, 255, size=(1, 2, 16, 1, block_bytes // 32), dtype=np.uint8
    )
    return [(key, encode_block(key, payload)) for key in block_keys(namespace, tokens)]


def putter(port: int, seed: int, block_bytes: int, stop_at: float, sent: Any) -> None:
    with CacheClient("127.0.0.1", port) as client:
        round_ = 0
        while time.time() < stop_at:
            items = blocks(f"put-{seed}-{round_}", 4, block_bytes, seed * 1000 + round_)
            client.put_encoded(items)
            with sent.get_lock():
                sent.value += sum(len(d) for _, d in items)
            round_ += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--putters", type=int, default=4)
    parser.add_argument("--put-block-kib", type=int, default=1024)
    parser.add_argument("--get-blocks", type=int, default=8)
    parser.add_argument("--get-block-kib", type=int, default=64)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    seconds = 3.0 if args.smoke else args.seconds
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-get-put-") as folder:
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(port), str(Path(folder) / "disk")]
        )
        try:
            wait_port(port)
            resident = blocks("resident", args.get_blocks, args.get_block_kib * KiB, 7)
            keys = [key for key, _ in resident]
            with CacheClient("127.0.0.1", port) as client:
                client.put_encoded(resident)
                for _ in range(50):  # warm up
                    assert len(client.get(keys)) == len(keys)
                sent = multiprocessing.Value("q", 0)
                stop_at = time.time() + seconds
                procs = [
                    multiprocessing.Process(
                        target=putter, args=(port, i + 1, args.put_block_kib * KiB, stop_at, sent)
                    )
                    for i in range(args.putters)
                ]
                for proc in procs:
                    proc.start()
                time.sleep(0.5)  # the putters are connected and writing
                latencies: list[float] = []
                while time.time() < stop_at:
                    started = time.perf_counter()
                    got = client.get(keys)
                    latencies.append((time.perf_counter() - started) * 1000)
                    assert len(got) == len(keys), "a resident block missed"
                for proc in procs:
                    proc.join()
            latencies.sort()
            print(json.dumps({
                "bench": "get_under_put", "putters": args.putters, "put_block_kib": args.put_block_kib,
                "get_blocks": args.get_blocks, "get_block_kib": args.get_block_kib, "seconds": seconds,
                "gets": len(latencies), "get_p50_ms": round(statistics.median(latencies), 3),
                "get_p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 3),
                "get_max_ms": round(latencies[-1], 3),
                "put_mb_per_s": round(sent.value / seconds / 1e6, 1), "cpus": os.cpu_count(), **environment(),
            }))  # fmt: skip
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()

"""How long a router's lookup takes: TIER_HITS of a 128k-token prompt, p50 and p99.

``agentinfra kv serve`` runs in its own process with ``--events`` on (as a server a
router watches would) and holds a 131,072-token chain at each block size. A client
on one connection asks, one request at a time:

- ``tier_hits_full``: `AsyncCacheClient.tier_hits` of the whole prompt, every block
  held (the worst case: the scan runs to the end);
- ``tier_hits_miss``: the same prompt but its first block, which nobody stored
  (the scan stops at once: what a cold prompt costs);
- ``leading_hits_full``: the older LEADING_HITS of the whole prompt, for comparison;
- ``block_keys``: computing the prompt's keys from its token ids in the client
  (a router that holds token ids pays it once per prompt; an engine already has them).

Each row is the latency over ``--calls`` requests after a warm-up. One JSON line per
block size and path.

    .venv/bin/python benchmarks/kvcache/bench_tier_hits.py [--calls 500] [--out results/tier_hits.jsonl]
    .venv/bin/python benchmarks/kvcache/bench_tier_hits.py --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit, environment, free_port, wait_port

from agentinfra.kvcache import AsyncCacheClient, Namespace, block_keys, encode_block

PROMPT_TOKENS = 131_072
BLOCK_SIZES = (16, 64, 128, 256)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


async def timed(call: Callable[[], Awaitable[Any]], calls: int) -> list[float]:
    for _ in range(max(3, calls // 20)):
        await call()
    latencies = []
    for _ in range(calls):
        start = time.perf_counter()
        await call()
        latencies.append(time.perf_counter() - start)
    return latencies


async def run_size(port: int, block_size: int, calls: int) -> list[dict[str, Any]]:
    namespace = Namespace(model_id="bench-lookup", block_size_tokens=block_size)
    tokens = [(i * 7919) % 50_000 for i in range(PROMPT_TOKENS)]
    keys = block_keys(namespace, tokens)
    client = await AsyncCacheClient.connect("127.0.0.1", port)
    try:
        kv = np.zeros((1, 2, block_size, 1, 1), np.float16)  # the lookup never reads the bytes
        await client.put_encoded([(key, encode_block(key, kv)) for key in keys])
        await client.announce(keys, tokens, block_size=block_size)
        assert (await client.tier_hits(keys)).any == len(keys)
        cold = block_keys(namespace, [1, *tokens[1:]])
        rows = []
        paths: dict[str, Callable[[], Awaitable[Any]]] = {
            "tier_hits_full": lambda: client.tier_hits(keys),
            "tier_hits_miss": lambda: client.tier_hits(cold),
            "leading_hits_full": lambda: client.leading_hits(keys),
        }
        for path, call in paths.items():
            latencies = await timed(call, calls)
            rows.append(_row(path, block_size, len(keys), latencies))
        keyed = []
        for _ in range(max(5, calls // 25)):
            start = time.perf_counter()
            block_keys(namespace, tokens)
            keyed.append(time.perf_counter() - start)
        rows.append(_row("block_keys", block_size, len(keys), keyed))
        return rows
    finally:
        await client.remove(keys)
        await client.close()


def _row(path: str, block_size: int, blocks: int, latencies: list[float]) -> dict[str, Any]:
    return {
        "bench": "kv_lookup",
        "path": path,
        "prompt_tokens": PROMPT_TOKENS,
        "block_size": block_size,
        "blocks": blocks,
        "calls": len(latencies),
        "p50_ms": round(percentile(latencies, 50) * 1e3, 4),
        "p99_ms": round(percentile(latencies, 99) * 1e3, 4),
        "max_ms": round(max(latencies) * 1e3, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--smoke", action="store_true", help="few calls, two block sizes; for CI")
    parser.add_argument("--out", type=Path, help="also append the JSON lines to this file")
    args = parser.parse_args()
    calls, sizes = (20, (128, 256)) if args.smoke else (args.calls, BLOCK_SIZES)
    env = environment()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "agentinfra", "kv", "serve", "--port", str(port), "--memory", "2GiB",
         "--metrics-port", str(free_port()), "--events", f"tcp://127.0.0.1:{free_port()}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_port(port)
        for block_size in sizes:
            for row in asyncio.run(run_size(port, block_size, calls)):
                emit({**row, **env}, args.out)
    finally:
        server.terminate()
        server.wait(20)


if __name__ == "__main__":
    main()

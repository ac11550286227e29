"""Lookup of a 1M-token prefix (4,096 blocks of 256 tokens) in the memory tier.

    python benchmarks/kvcache/bench_lookup.py [--smoke]

Reports medians of: computing the 4,096 chained keys; the leading-run probe in
the memory tier given the keys; and the whole `TieredStore.get` returning the
verified blocks (checksums included) with small blocks, so hashing and indexing
dominate rather than memory bandwidth.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _common import emit, environment

from agentinfra.kvcache import MemoryTier, Namespace, TieredStore, block_keys


def median_ms(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    tokens_total = 65_536 if args.smoke else 1_048_576
    repeat = 3 if args.smoke else 15
    namespace = Namespace(model_id="bench", block_size_tokens=256)
    tokens = np.random.default_rng(0).integers(0, 200_000, size=tokens_total)
    keys = block_keys(namespace, tokens)
    store = TieredStore(MemoryTier(1 << 30))
    kv = np.zeros(
        (1, 2, 256, 1, 1), dtype=np.float16
    )  # 1 KiB payload: measures lookup, not bandwidth
    store.put(keys, [kv] * len(keys))
    env = environment()
    record = {
        "bench": "lookup",
        "tokens": tokens_total,
        "blocks": len(keys),
        "repeat": repeat,
        **env,
    }
    record["keys_ms"] = round(median_ms(lambda: block_keys(namespace, tokens), repeat), 3)
    record["leading_hits_ms"] = round(median_ms(lambda: store.memory.leading_hits(keys), repeat), 3)
    record["store_get_verified_ms"] = round(median_ms(lambda: store.get(keys), repeat), 3)
    assert store.memory.leading_hits(keys) == len(keys)
    emit(record)


if __name__ == "__main__":
    main()

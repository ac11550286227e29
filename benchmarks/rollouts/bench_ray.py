"""Rollouts on a local two-node Ray cluster against the same service without Ray; kill -9 accounting.

    .venv/bin/python benchmarks/rollouts/bench_ray.py [--smoke] [--rollouts 16] [--concurrency 4]
        [--model-delay-ms 500] [--parts throughput,kill9] [--out results/ray.jsonl]

The cluster is `ray.cluster_utils.Cluster` on this machine: a head and one worker node,
``--node-cpus`` logical CPUs each. The service runs as ``agentinfra rollouts serve`` in a
child process (``--ray ADDRESS`` or not), reached over real HTTP. The environment is
kernels (``examples/kernels/problems/10_slow_rowwise_softmax.py``).

Parts, one JSON line each (with the git revision, Python and the machine):

- ``throughput``: ``--rollouts`` rollouts (groups of 4) at ``--concurrency`` against the
  scripted model answering after ``--model-delay-ms``: a policy that lists the workspace's
  files 3 times and stops (4 model calls, no grading), so the difference between the two
  modes is what Ray adds per episode. Rollouts per minute from the first submit to the last
  trajectory, and each rollout's ``service_wall_s`` (p50/p90), for ``local`` and ``ray``;
  then ``overhead_s_per_episode`` = p50(ray) - p50(local).
- ``kill9``: a group of 4 that writes, submits and awaits the honest kernel (one grading
  each, a Ray task); once a grading's jail runs, ``kill -9`` of the service and
  ``remove_node`` (SIGKILL) of the worker node. Counted then: Ray workers still running an
  episode or a grading (until none, at most 60 s), and processes under sandbox uids that the
  service's rollouts started, when those workers are gone and 5 s after the kill; after a restart: uids its sweep killed, rollouts accounted for in the journal
  (finished, by label) out of those accepted, and sandbox processes left after it stops.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_rollouts import ROOT, Service, _descendants, _group, _percentile, solver

from agentinfra.agent import Reply, ScriptedModelServer

MODEL = "scripted-policy"
MODEL_DELAY_S = 0.5


def lister(body: dict[str, Any]) -> Reply:
    if sum(1 for m in body["messages"] if m["role"] == "assistant") < 3:
        return Reply(tool_calls=[("list_files", "{}")], delay_s=MODEL_DELAY_S)
    return Reply(content="done", delay_s=MODEL_DELAY_S)


def _run(service: Service, base_url: str, rollouts: int) -> dict[str, Any]:
    started = time.monotonic()
    groups = [service.client.submit_group(_group(base_url, 4, stream=False), retry_for_s=600)
              for _ in range(rollouts // 4)]  # fmt: skip
    trajectories = [t for g in groups for t in service.client.trajectories(g["group_id"])]
    wall_s = time.monotonic() - started
    walls = [float(t["rollout"]["service_wall_s"]) for t in trajectories]
    return {
        "rollouts": len(trajectories),
        "wall_s": round(wall_s, 2),
        "rollouts_per_min": round(len(trajectories) / wall_s * 60, 2),
        "episode_wall_s_p50": round(statistics.median(walls), 3),
        "episode_wall_s_p90": _percentile(walls, 0.9),
        "infra_failures": sum(t["infra_failure"] is not None for t in trajectories),
        "nodes": len({t["rollout"].get("node_id") for t in trajectories} - {None}),
    }


def throughput(folder: Path, args: argparse.Namespace, cluster: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"part": "throughput", "model_delay_ms": args.model_delay_ms,
                              "concurrency": args.concurrency}  # fmt: skip
    with ScriptedModelServer(lister, models=[MODEL]) as model:
        for mode in ("local", "ray"):
            extra = ["--ray", cluster.address] if mode == "ray" else []
            service = Service(folder / f"tp-{mode}", "--concurrency", str(args.concurrency), *extra)
            try:
                _run(service, model.base_url, 4)  # warm: Ray's workers start and import once
                record[mode] = _run(service, model.base_url, args.rollouts)
            finally:
                service.stop()
    local, ray = record["local"], record["ray"]
    record["overhead_s_per_episode"] = round(
        ray["episode_wall_s_p50"] - local["episode_wall_s_p50"], 3
    )
    record["throughput_ratio"] = round(ray["rollouts_per_min"] / local["rollouts_per_min"], 3)
    return record


def _episode_workers() -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                title = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            count += title.startswith((b"ray::_episode_remote", b"ray::_evaluate_remote"))
    return count


def _alive(processes: set[tuple[int, int]]) -> int:
    alive = 0
    for pid, uid in processes:
        try:
            alive += os.stat(f"/proc/{pid}").st_uid == uid
        except OSError:
            continue
    return alive


def kill9(folder: Path, args: argparse.Namespace, cluster: Any) -> dict[str, Any]:
    state = folder / "kill9"
    with ScriptedModelServer(solver, models=[MODEL]) as model:
        service = Service(state, "--ray", cluster.address, "--concurrency", str(args.concurrency))
        group = service.client.submit_group(_group(model.base_url, 4, stream=False))
        raylets = [n.all_processes["raylet"][0].process.pid for n in cluster.list_all_nodes()]
        jailed: set[tuple[int, int]] = set()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # every jail the rollouts start, until the kill
            jailed |= {p for r in raylets for p in _descendants(r)}
            if jailed:
                break
            time.sleep(0.02)
        if not jailed:
            raise SystemExit("kill9: no grading jail started in 300 s")
        workers_before = _episode_workers()
        service.stop(9)
        (worker,) = cluster.worker_nodes
        cluster.remove_node(worker, allow_graceful=False)
        killed_at = time.monotonic()
        while _episode_workers() and time.monotonic() - killed_at < 60:
            time.sleep(0.1)
        workers_gone_s = time.monotonic() - killed_at
        orphans_at_workers_gone = _alive(jailed)
        workers_after = _episode_workers()
        time.sleep(max(0.0, killed_at + 5 - time.monotonic()))
        orphans_5s_after_kill = _alive(jailed)
        cluster.add_node(num_cpus=args.node_cpus)
        restarted = Service(state, "--ray", cluster.address, "--concurrency", str(args.concurrency))
        trajectories = restarted.client.trajectories(group["group_id"])
        restarted.stop()
    events = [json.loads(line) for line in (state / "service.jsonl").read_text().splitlines()]
    swept = [e["data"]["swept_uids"] for e in events if e["type"] == "service_restarted"]
    finished = {e["data"]["rollout_id"]: e["data"]["label"] for e in events
                if e["type"] == "rollout_finished"}  # fmt: skip
    labels: dict[str, int] = {}
    for rid in group["rollout_ids"]:
        labels[finished.get(rid, "missing")] = labels.get(finished.get(rid, "missing"), 0) + 1
    return {
        "part": "kill9", "accepted": len(group["rollout_ids"]), "trajectories": len(trajectories),
        "journalled_finished": sum(rid in finished for rid in group["rollout_ids"]),
        "labels": labels, "jailed_at_kill": len(jailed),
        "episode_workers_at_kill": workers_before, "episode_workers_after_kill": workers_after,
        "episode_workers_gone_s": round(workers_gone_s, 2),
        "jail_processes_when_workers_gone": orphans_at_workers_gone,
        "jail_processes_5s_after_kill": orphans_5s_after_kill,
        "swept_uids_at_restart": len(swept[-1]) if swept else None,
        "jail_processes_left_after_stop": _alive(jailed),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="4 rollouts, throughput only.")
    parser.add_argument("--rollouts", type=int, default=16, help="A multiple of 4 (groups of 4).")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--node-cpus", type=int, default=3,
        help="Logical CPUs of each Ray node (--concurrency episodes and a grading must fit in both).",
    )  # fmt: skip
    parser.add_argument("--model-delay-ms", type=float, default=500.0)
    parser.add_argument("--parts", default="throughput,kill9")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "ray.jsonl")
    args = parser.parse_args()
    global MODEL_DELAY_S
    MODEL_DELAY_S = args.model_delay_ms / 1000
    if args.smoke:
        args.rollouts, args.parts = 4, "throughput"
    from ray.cluster_utils import Cluster

    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=ROOT).stdout.strip()  # fmt: skip
    meta = {"revision": revision, "python": platform.python_version(), "cpus": os.cpu_count(),
            "machine": platform.machine(), "node_cpus": args.node_cpus, "nodes": 2}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fast_failure = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                    "health_check_timeout_ms": 500, "health_check_failure_threshold": 3}  # fmt: skip
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": args.node_cpus, "include_dashboard": False, "_system_config": fast_failure})  # fmt: skip
    cluster.add_node(num_cpus=args.node_cpus)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
            for part in args.parts.split(","):
                record = {"throughput": lambda: throughput(Path(tmp), args, cluster),
                          "kill9": lambda: kill9(Path(tmp), args, cluster)}[part]()  # fmt: skip
                line = json.dumps({**meta, **record})
                print(line, flush=True)
                if not args.smoke:
                    with args.out.open("a") as sink:
                        sink.write(line + "\n")
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())

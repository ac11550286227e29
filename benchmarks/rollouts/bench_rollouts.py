"""Rollouts through `agentinfra rollouts serve`: throughput, overhead, cancel latency, kill -9, fault labels.

    .venv/bin/python benchmarks/rollouts/bench_rollouts.py [--smoke] [--groups 4] [--group-size 4]
        [--concurrency 8] [--policy scripted|smollm2] [--out results/rollouts.jsonl]

The service runs as a child process (``agentinfra rollouts serve``), reached with
`RolloutClient` over real HTTP; the environment is kernels on
``examples/kernels/problems/10_slow_rowwise_softmax.py``, graded by the real grader in
its jails. The policy is the scripted OpenAI-compatible server (`ScriptedModelServer`:
writes the honest kernel, submits it, waits for the verdict, stops: 4 model calls,
one grading), or SmolLM2-135M-Instruct in vLLM (``--policy smollm2``; `VllmServer`).

Parts, one JSON line each (with the git revision, Python and the machine):

- ``throughput``: ``--groups`` groups of ``--group-size`` at ``--concurrency``
  rollouts at once; rollouts per minute from the first submit to the last
  trajectory; per model call, agentinfra's own time (a rollout's wall time less
  model and tool time, over its calls; p50/p90); the grading (sandbox) share of the
  rollouts' summed wall time; infra failures.
- ``overhead``: as ``throughput`` with a policy that lists files 8 times and submits
  nothing (9 calls, no grading): agentinfra's own time per call without gradings
  competing for the CPU.
- ``cancel``: a group of 4 against a model that answers after 30 s; each rollout
  cancelled once it has called the model; latency p50/max, trajectories labelled.
- ``kill9``: a group of 4 (scripted policy), ``kill -9`` of the service while a
  grading jail runs, a restart; trajectories finished, labels, processes left
  under sandbox uids after the restarted service stops (orphans).
- ``faults``: the model server killed under a group of 4 (``max_retries`` 1), and
  4 gradings through ``POST /v1/grade`` with a 0.5 s grading timeout; labelled
  infra failures over injected faults.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from agentinfra.agent import Reply, ScriptedModelServer
from agentinfra.engines import SMOLLM2_NAME, VllmServer, smollm2_dir
from agentinfra.rollouts import RolloutClient, sandbox_processes

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "examples/kernels/problems/10_slow_rowwise_softmax.py"
HONEST = (ROOT / "examples/kernels/submissions/10_fast_softmax.py").read_text()
MODEL = "scripted-policy"
ENV = {**os.environ, "OPENAI_API_KEY": "test-key", "PYTHONUNBUFFERED": "1"}


def _assistants(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def solver(body: dict[str, Any]) -> Reply:
    step = _assistants(body)
    if step == 0:
        return Reply(
            tool_calls=[("write_file", json.dumps({"path": "solution.py", "content": HONEST}))]
        )
    if step == 1:
        return Reply(tool_calls=[("submit", json.dumps({"path": "solution.py"}))])
    if step == 2:
        return Reply(tool_calls=[("results", json.dumps({"wait_s": 300}))])
    return Reply(content="done")


MODEL_DELAY_S = 0.0
"""How long the scripted model takes per call in the ``overhead`` part (``--model-delay-ms``)."""


def lister(body: dict[str, Any]) -> Reply:
    if _assistants(body) < 8:
        return Reply(tool_calls=[("list_files", "{}")], delay_s=MODEL_DELAY_S)
    return Reply(content="done", delay_s=MODEL_DELAY_S)


def sleeper(body: dict[str, Any]) -> Reply:
    return Reply(tool_calls=[("list_files", "{}")], delay_s=30.0)


class Service:
    """`agentinfra rollouts serve` in a child process on a free port."""

    def __init__(self, state_dir: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        log_path = state_dir.parent / f"{state_dir.name}-{time.monotonic_ns()}.log"
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "agentinfra", "rollouts", "serve", "--port", "0",
                 "--state-dir", str(state_dir), *extra],
                stdout=log, stderr=log, env=env or ENV, cwd=ROOT,
            )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = re.search(
                r"serving rollouts on (http://\S+)", log_path.read_text(errors="replace")
            )
            if found:
                self.client = RolloutClient(found.group(1))
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise SystemExit(f"the service did not start:\n{log_path.read_text()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(120)


def _group(base_url: str, size: int, model: str = MODEL, **fields: Any) -> dict[str, Any]:
    return {"environment": "kernels", "task": str(PROBLEM), "group_size": size, "model": model,
            "base_url": base_url, **fields}  # fmt: skip


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def throughput(
    folder: Path, args: argparse.Namespace, base_url: str, model: str, **fields: Any
) -> dict[str, Any]:
    slots = ("--grading-slots", str(args.grading_slots)) if args.grading_slots else ()
    service = Service(folder / "throughput", "--concurrency", str(args.concurrency),
                      "--max-pending", str(max(64, args.groups * args.group_size)), *slots)  # fmt: skip
    try:
        started = time.monotonic()
        groups = [service.client.submit_group(_group(base_url, args.group_size, model, **fields))
                  for _ in range(args.groups)]  # fmt: skip
        trajectories = [t for g in groups for t in service.client.trajectories(g["group_id"])]
        wall_s = time.monotonic() - started
    finally:
        service.stop()
    overhead_ms = []
    walls, gradings = 0.0, 0.0
    for t in trajectories:
        times, calls = t.get("time") or {}, t.get("calls") or []
        if times and calls:
            rest = times["wall_s"] - times["model_s"] - times["tools_s"]
            overhead_ms.append(1000 * rest / len(calls))
            walls += times["wall_s"]
            gradings += times["grading_s"]
    return {
        "part": "throughput", "groups": args.groups, "group_size": args.group_size,
        "concurrency": args.concurrency, "grading_slots": args.grading_slots or "default (CPUs - 1)",
        "rollouts": len(trajectories), "wall_s": round(wall_s, 2),
        "rollouts_per_min": round(60 * len(trajectories) / wall_s, 2),
        "calls": sum(len(t.get("calls") or []) for t in trajectories),
        "overhead_ms_per_call_p50": _round(_percentile(overhead_ms, 0.5)),
        "overhead_ms_per_call_p90": _round(_percentile(overhead_ms, 0.9)),
        "grading_share_of_wall": round(gradings / walls, 3) if walls else None,
        "mean_rollout_wall_s": round(walls / len(trajectories), 2) if trajectories else None,
        "infra_failures": sum(1 for t in trajectories if t.get("infra_failure")),
        "hack_flagged": sum(1 for t in trajectories if t.get("hack_flagged")),
        "rewards": sorted({t.get("reward") for t in trajectories}, key=str),
        "outcomes": sorted(r["outcome"] for t in trajectories for r in t.get("turn_rewards", [])),
        "tokens": sorted({t.get("tokens") for t in trajectories}),
        "segments_per_rollout": sorted(len(t.get("segments") or []) for t in trajectories),
        "stop_reasons": sorted(str(t.get("stop_reason")) for t in trajectories),
        "_exact_share": sum(t.get("tokens") == "exact" for t in trajectories) / max(1, len(trajectories)),
    }  # fmt: skip


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def cancel(folder: Path) -> dict[str, Any]:
    with ScriptedModelServer(sleeper, models=[MODEL]) as slow:
        service = Service(folder / "cancel", "--concurrency", "4")
        try:
            group = service.client.submit_group(_group(slow.base_url, 4))
            deadline = time.monotonic() + 60
            while len(slow.requests) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            latencies, labelled = [], 0
            for rid in group["rollout_ids"]:
                started = time.monotonic()
                answer = service.client.cancel(rid, "stale policy")
                latencies.append(time.monotonic() - started)
                labelled += (answer["trajectory"]["infra_failure"] or {}).get("kind") == "cancelled"
        finally:
            service.stop()
    return {"part": "cancel", "cancelled": len(latencies), "labelled_cancelled": labelled,
            "latency_s_p50": round(statistics.median(latencies), 3), "latency_s_max": round(max(latencies), 3)}  # fmt: skip


def _descendants(root_pid: int) -> set[tuple[int, int]]:
    """(pid, uid) of the processes under sandbox uids that descend from ``root_pid``."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    jailed = {(p, u) for u, ps in sandbox_processes().items() for p in ps}
    found = set()
    for pid, uid in jailed:
        cursor = pid
        while cursor > 1 and cursor != root_pid:
            cursor = parents.get(cursor, 0)
        if cursor == root_pid:
            found.add((pid, uid))
    return found


def _alive(processes: set[tuple[int, int]]) -> int:
    alive = 0
    for pid, uid in processes:
        try:
            alive += os.stat(f"/proc/{pid}").st_uid == uid
        except OSError:
            continue
    return alive


def kill9(folder: Path) -> dict[str, Any]:
    """Only this service's jails count (other programs on the machine may run jails too)."""
    with ScriptedModelServer(solver, models=[MODEL]) as model:
        service = Service(folder / "kill9", "--concurrency", "4")
        group = service.client.submit_group(_group(model.base_url, 4))
        deadline = time.monotonic() + 180
        jailed: set[tuple[int, int]] = set()
        while len(jailed) < 2 and time.monotonic() < deadline:
            jailed = _descendants(service.process.pid)
            time.sleep(0.02)
        service.stop(signal.SIGKILL)
        restarted = Service(folder / "kill9", "--concurrency", "4")
        seen: set[tuple[int, int]] = set()
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                seen.update(_descendants(restarted.process.pid))

        sampler = threading.Thread(target=sample)
        sampler.start()
        trajectories = restarted.client.trajectories(group["group_id"])
        restarted.stop()
        done.set()
        sampler.join()
    time.sleep(1.0)
    return {
        "part": "kill9", "accepted": len(group["rollout_ids"]), "jailed_at_kill": len(jailed),
        "trajectories_after_restart": len(trajectories),
        "labels": sorted(str((t.get("infra_failure") or {}).get("kind", "ok")) for t in trajectories),
        "messages": sorted({str((t.get("infra_failure") or {}).get("message", ""))[:200] for t in trajectories}),
        "orphans_of_killed_service": _alive(jailed),
        "left_by_restarted_service": _alive(seen),
    }  # fmt: skip


def faults(folder: Path) -> dict[str, Any]:
    service = Service(folder / "faults", "--concurrency", "4", "--grade-timeout", "0.5")
    try:
        with ScriptedModelServer(solver, models=[MODEL]) as model:
            group = service.client.submit_group(_group(model.base_url, 4, max_retries=1))
        trajectories = service.client.trajectories(group["group_id"])  # the model server is gone
        model_labelled = sum(
            (t.get("infra_failure") or {}).get("kind") == "model_error" for t in trajectories
        )
        grades = [service.client.grade("kernels", str(PROBLEM), (HONEST + f"\n# {i}\n").encode(),
                                       name="solution.py") for i in range(4)]  # fmt: skip
        grade_labelled = sum(
            (g.get("infra_failure") or {}).get("kind") == "grader_error" for g in grades
        )
    finally:
        service.stop()
    return {"part": "faults", "model_server_killed": {"injected": 4, "labelled": model_labelled},
            "grader_timeout": {"injected": 4, "labelled": grade_labelled},
            "labelled_share": (model_labelled + grade_labelled) / 8}  # fmt: skip


def desktop(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """G rollouts of a desktop task, each on its own desktop, played by the task's scripted solution."""
    from agentinfra.environments.desktop import load_desktop_task
    from agentinfra.environments.desktop._policy import DesktopPolicy, solution_moves

    path = ROOT / "examples/desktop/tasks/calc-total.json"
    task = load_desktop_task(path)
    solution = task.solution()
    assert solution is not None
    options = {"action_space": solution["action_space"], "track": solution.get("track", "gui-only"),
               "observation": "screenshot"}  # fmt: skip
    policy = DesktopPolicy({task.instruction: solution_moves(solution)})
    with ScriptedModelServer(policy, models=[MODEL]) as model:
        service = Service(folder / "desktop", "--concurrency", str(args.concurrency))
        try:
            started = time.monotonic()
            groups = [
                service.client.submit_group(
                    {
                        **_group(model.base_url, args.group_size),
                        "environment": "desktop",
                        "task": str(path),
                        "options": options,
                        "max_turns": 40,
                        "stream": False,
                    }
                )
                for _ in range(max(1, args.groups // 2))
            ]
            trajectories = [t for g in groups for t in service.client.trajectories(g["group_id"])]
            wall_s = time.monotonic() - started
        finally:
            service.stop()
    totals = {k: sum((t.get("time") or {}).get(k, 0.0) for t in trajectories)
              for k in ("wall_s", "model_s", "tools_s", "grading_s")}  # fmt: skip
    return {
        "part": "desktop", "task": path.name, "group_size": args.group_size, "concurrency": args.concurrency,
        "rollouts": len(trajectories), "wall_s": round(wall_s, 1),
        "rollouts_per_min": round(60 * len(trajectories) / wall_s, 2),
        "desktop_tools_share_of_wall": round(totals["tools_s"] / totals["wall_s"], 3) if totals["wall_s"] else None,
        "grading_share_of_wall": round(totals["grading_s"] / totals["wall_s"], 3) if totals["wall_s"] else None,
        "outcomes": sorted(r["outcome"] for t in trajectories for r in t.get("turn_rewards", [])),
        "infra_failures": [t.get("infra_failure") for t in trajectories if t.get("infra_failure")],
        "stop_reasons": sorted(str(t.get("stop_reason")) for t in trajectories),
    }  # fmt: skip


def desktop_killed(folder: Path) -> dict[str, Any]:
    """A group of 2 desktop rollouts; each desktop is killed (SIGKILL to its uid) once it runs."""
    from agentinfra.environments.desktop import load_desktop_task
    from agentinfra.environments.desktop._policy import DesktopPolicy, solution_moves
    from agentinfra.sandbox import kill_uid

    path = ROOT / "examples/desktop/tasks/calc-total.json"
    task = load_desktop_task(path)
    solution = task.solution()
    assert solution is not None
    options = {"action_space": solution["action_space"], "observation": "screenshot"}
    policy = DesktopPolicy({task.instruction: solution_moves(solution)})
    killed: set[int] = set()
    with ScriptedModelServer(policy, models=[MODEL]) as model:
        service = Service(folder / "desktop-killed", "--concurrency", "2")
        try:
            body = {**_group(model.base_url, 2), "environment": "desktop", "task": str(path),
                    "options": options, "max_turns": 40, "stream": False, "max_retries": 1}  # fmt: skip
            group = service.client.submit_group(body)
            deadline = time.monotonic() + 300
            while len(killed) < 2 and time.monotonic() < deadline:
                for _, uid in _descendants(service.process.pid):
                    if uid not in killed and len(model.requests) >= 2:
                        kill_uid(uid)
                        killed.add(uid)
                time.sleep(0.2)
            trajectories = service.client.trajectories(group["group_id"])
        finally:
            service.stop()
    return {
        "part": "desktop_killed", "desktops_killed": len(killed), "rollouts": len(trajectories),
        "labels": sorted(str((t.get("infra_failure") or {}).get("kind", "none")) for t in trajectories),
        "messages": sorted(str((t.get("infra_failure") or {}).get("message", ""))[:160] for t in trajectories),
        "stop_reasons": sorted(str(t.get("stop_reason")) for t in trajectories),
        "outcomes": sorted(r["outcome"] for t in trajectories for r in t.get("turn_rewards", [])),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--smoke", action="store_true", help="One group of 2, concurrency 2; no other parts."
    )
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--grading-slots",
        type=int,
        help="The service's --grading-slots (default: its CPUs less one).",
    )
    parser.add_argument(
        "--model-delay-ms", type=float, default=0.0,
        help="overhead part: the scripted model's time per call (a real engine takes 10s to 1000s of ms).",
    )  # fmt: skip
    parser.add_argument("--policy", choices=["scripted", "smollm2"], default="scripted")
    parser.add_argument(
        "--keep", type=Path, help="Keep state and run directories here (default: a temporary one)."
    )
    parser.add_argument("--base-url", help="--policy smollm2: an engine already serving SmolLM2.")
    parser.add_argument("--parts", default="throughput,overhead,cancel,kill9,faults")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "rollouts.jsonl"
    )
    args = parser.parse_args()
    global MODEL_DELAY_S
    MODEL_DELAY_S = args.model_delay_ms / 1000
    if args.smoke:
        args.groups, args.group_size, args.concurrency, args.parts = 1, 2, 2, "throughput"
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=ROOT).stdout.strip()  # fmt: skip
    meta = {"revision": revision, "python": platform.python_version(), "cpus": os.cpu_count(),
            "machine": platform.machine(), "policy": args.policy}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-rollouts-") as tmp:
        folder = Path(tmp) if args.keep is None else args.keep
        folder.mkdir(parents=True, exist_ok=True)
        for part in args.parts.split(","):
            if part == "throughput" and args.policy == "smollm2":
                smol = {
                    "max_turns": 4,
                    "nudges": 2,
                    "max_output_tokens": 128,
                    "context_tokens": 8192,
                }
                if args.base_url:  # an engine already serving it (`agentinfra model serve`)
                    record = throughput(folder, args, args.base_url, SMOLLM2_NAME, **smol)
                else:
                    log = folder / "vllm.log"
                    with VllmServer(smollm2_dir(), log=log, served_name=SMOLLM2_NAME) as vllm:
                        record = throughput(folder, args, vllm.base_url, SMOLLM2_NAME, **smol)
                record["exact_tokens_share"] = record.pop("_exact_share", None)
            elif part == "throughput":
                with ScriptedModelServer(solver, models=[MODEL]) as model:
                    record = throughput(folder, args, model.base_url, MODEL)
                record.pop("_exact_share", None)
            elif part == "overhead":
                with ScriptedModelServer(lister, models=[MODEL]) as model:
                    record = {**throughput(folder, args, model.base_url, MODEL), "part": "overhead",
                              "model_delay_ms": args.model_delay_ms}  # fmt: skip
                record.pop("_exact_share", None)
            elif part == "desktop":
                record = desktop(folder, args)
            elif part == "desktop_killed":
                record = desktop_killed(folder)
            else:
                record = {"cancel": cancel, "kill9": kill9, "faults": faults}[part](folder)
            line = json.dumps({**meta, **record})
            print(line, flush=True)
            if not args.smoke:
                with args.out.open("a") as sink:
                    sink.write(line + "\n")


if __name__ == "__main__":
    main()

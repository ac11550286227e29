"""RL rollouts end to end: the CLI and the HTTP service with real HTTP, the scripted model, the real kernels grader.

The model is `ScriptedModelServer` (real HTTP and SSE on loopback); the environment is
kernels with the example problems, graded by the real grader in its jails; the service
runs as `agentinfra rollouts serve` in a child process, so ``kill -9`` is real.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from services import sandboxed_processes

from agentinfra.agent import Reply, ScriptedModelServer
from agentinfra.errors import RolloutError
from agentinfra.rollouts import RolloutClient
from agentinfra.sandbox import pids_by_uid

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "examples/kernels/problems/10_slow_rowwise_softmax.py"
HONEST = (ROOT / "examples/kernels/submissions/10_fast_softmax.py").read_text()
MODEL = "scripted-policy"
ENV = {**os.environ, "OPENAI_API_KEY": "test-key", "PYTHONUNBUFFERED": "1"}


def _assistants(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def solver(delay_s: float = 0.0) -> Any:
    """Writes the honest kernel, submits it, waits for the verdict, stops."""

    def script(body: dict[str, Any]) -> Reply:
        step = _assistants(body)
        if step == 0:
            content = json.dumps({"path": "solution.py", "content": HONEST})
            return Reply(tool_calls=[("write_file", content)], delay_s=delay_s)
        if step == 1:
            return Reply(
                tool_calls=[("submit", json.dumps({"path": "solution.py"}))], delay_s=delay_s
            )
        if step == 2:
            return Reply(tool_calls=[("results", json.dumps({"wait_s": 300}))], delay_s=delay_s)
        return Reply(content="done", delay_s=delay_s)

    return script


def talker(delay_s: float) -> Any:
    """Lists files a few times, slowly, then stops: no grading."""

    def script(body: dict[str, Any]) -> Reply:
        if _assistants(body) < 3:
            return Reply(tool_calls=[("list_files", "{}")], delay_s=delay_s)
        return Reply(content="done", delay_s=delay_s)

    return script


class Service:
    """`agentinfra rollouts serve` in a child process on a free port (its output in a log file)."""

    def __init__(self, state_dir: Path, *extra: str) -> None:
        self.state_dir = state_dir
        self.log_path = state_dir.parent / f"{state_dir.name}-{time.monotonic_ns()}.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "agentinfra", "rollouts", "serve", "--port", "0",
                 "--state-dir", str(state_dir), *extra],
                stderr=log, stdout=log, env=ENV, cwd=ROOT,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        found = None
        while found is None and time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            found = re.search(r"serving rollouts on http://127\.0\.0\.1:(\d+)", text)
            if found is None and self.process.poll() is not None:
                raise AssertionError(f"the service did not start: {text}")
            time.sleep(0.05)
        assert found is not None, self.log_path.read_text()
        self.url = f"http://127.0.0.1:{found.group(1)}"
        self.client = RolloutClient(self.url)

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def services() -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for service in started:
        service.stop()


def _group(base_url: str, group_size: int, **fields: Any) -> dict[str, Any]:
    return {"environment": "kernels", "task": str(PROBLEM), "group_size": group_size,
            "model": MODEL, "base_url": base_url, **fields}  # fmt: skip


@pytest.mark.slow
def test_rollouts_run_writes_one_trajectory_per_rollout_in_groups(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with ScriptedModelServer(solver(), models=[MODEL]) as model:
        done = subprocess.run(
            [sys.executable, "-m", "agentinfra", "rollouts", "run", "--env", "kernels",
             "--tasks", str(PROBLEM), "--group-size", "2", "--model", MODEL, "--base-url", model.base_url,
             "--policy-version", "step-7", "--no-stream", "--concurrency", "2",
             "--runs-dir", str(tmp_path / "runs"), "--out", str(out)],
            capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 2
    assert len({t["group_id"] for t in lines}) == 1
    assert len({t["run_id"] for t in lines}) == 2
    for trajectory in lines:
        assert trajectory["infra_failure"] is None
        assert trajectory["policy_version"] == "step-7"
        assert trajectory["turn_rewards"][0]["outcome"] == "passed"
        assert trajectory["reward"] > 0
        assert trajectory["stop_reason"] == "done"
    workspaces = [p / "agent/workspace" for p in (tmp_path / "runs").glob("rollouts-*/*")]
    assert len(workspaces) == 2  # each rollout its own run directory and workspace
    assert all((w / "solution.py").read_text() == HONEST for w in workspaces)
    assert "2 of 2 trajectories" in done.stderr


def test_rollouts_run_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    with ScriptedModelServer([], models=[MODEL]) as model:
        cases = {
            ("--group-size", "0"): "--group-size 0",
            ("--env", "nope"): "nope",
            ("--tasks", str(tmp_path / "missing.py")): "missing.py",
            ("--model", "not-served"): "not-served",
            ("--grading-slots", "0"): "--grading-slots 0",
        }
        for (flag, value), named in cases.items():
            args = {"--env": "kernels", "--tasks": str(PROBLEM), "--group-size": "2",
                    "--model": MODEL, "--base-url": model.base_url, flag: value}  # fmt: skip
            done = subprocess.run(
                [sys.executable, "-m", "agentinfra", "rollouts", "run", *sum(args.items(), ()),
                 "--out", str(tmp_path / "o.jsonl")],
                capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120,
            )  # fmt: skip
            assert done.returncode == 2, (flag, done.stderr)
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
            assert named in done.stderr


@pytest.mark.slow
def test_service_groups_stream_cancel_backpressure_and_bad_input(
    tmp_path: Path, services: list[Service]
) -> None:
    with ScriptedModelServer(talker(delay_s=0.3), models=[MODEL]) as model:
        service = Service(tmp_path / "state", "--concurrency", "2", "--max-pending", "3")
        services.append(service)
        client = service.client
        accepted = client.submit_group(_group(model.base_url, 2, policy_version="v1"))
        assert len(accepted["rollout_ids"]) == 2
        with pytest.raises(RolloutError) as full:  # 2 pending + 2 > 3
            client.submit_group(_group(model.base_url, 2))
        assert full.value.status == 429
        assert full.value.retry_after_s is not None
        assert full.value.retry_after_s >= 1
        trajectories = client.trajectories(accepted["group_id"])
        assert sorted(t["run_id"] for t in trajectories) == sorted(accepted["rollout_ids"])
        assert {t["group_id"] for t in trajectories} == {accepted["group_id"]}
        assert all(t["infra_failure"] is None and t["policy_version"] == "v1" for t in trajectories)
        assert all(len(t["calls"]) == 4 for t in trajectories)

    with ScriptedModelServer(talker(delay_s=30.0), models=[MODEL]) as slow:
        group = client.submit_group(_group(slow.base_url, 1), retry_for_s=30)
        rid = group["rollout_ids"][0]
        deadline = time.monotonic() + 30
        while not slow.requests and time.monotonic() < deadline:
            time.sleep(0.1)
        started = time.monotonic()
        answer = client.cancel(rid, "stale: policy v2 is out")
        latency_s = time.monotonic() - started
        assert latency_s < 5.0
        partial = answer["trajectory"]
        assert partial["infra_failure"] == {
            "kind": "cancelled",
            "message": "stale: policy v2 is out",
        }
        assert partial["run_id"] == rid
        assert client.rollout(rid)["state"] == "finished"

    bad = {
        "unknown environment": (_group(model.base_url, 1, environment="nope"), 400, "nope"),
        "unknown task": (_group(model.base_url, 1, task="/no/such.py"), 400, "/no/such.py"),
        "group size 0": (_group(model.base_url, 0), 422, "group_size"),
        "endpoint down": (_group("http://127.0.0.1:9/v1", 1), 400, "127.0.0.1:9"),
        "malformed": ({"environment": "kernels"}, 422, "task"),
    }
    for name, (body, status, named) in bad.items():
        with pytest.raises(RolloutError) as refused:
            client.submit_group(body)
        assert refused.value.status == status, name
        assert named in str(refused.value), name
    with ScriptedModelServer([], models=[MODEL]) as other:
        with pytest.raises(RolloutError, match="not-served") as unserved:
            client.submit_group({**_group(other.base_url, 1), "model": "not-served"})
        assert unserved.value.status == 400
    metrics = client.metrics()
    assert 'agentinfra_rollouts{state="finished_ok"} 2.0' in metrics
    assert 'agentinfra_rollouts{state="finished_cancelled"} 1.0' in metrics
    assert "agentinfra_rollouts_queue_depth 0.0" in metrics
    assert "agentinfra_rollouts_http_seconds_count" in metrics


def test_service_tokens_and_loopback(tmp_path: Path, services: list[Service]) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("trainer s3cret\n")
    service = Service(tmp_path / "state", "--token-file", str(tokens))
    services.append(service)
    with pytest.raises(RolloutError) as refused:
        service.client.group("g0")
    assert refused.value.status == 401
    with pytest.raises(RolloutError) as unknown:
        RolloutClient(service.url, token="s3cret").group("g0")
    assert unknown.value.status == 404  # authorised; the group does not exist
    done = subprocess.run(
        [sys.executable, "-m", "agentinfra", "rollouts", "serve", "--host", "0.0.0.0"],
        capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--token-file" in done.stderr


@pytest.mark.slow
def test_grade_is_idempotent_and_a_grader_timeout_is_an_infra_failure(
    tmp_path: Path, services: list[Service]
) -> None:
    service = Service(tmp_path / "state")
    services.append(service)
    first = service.client.grade("kernels", str(PROBLEM), HONEST.encode(), name="solution.py")
    assert first["graded"] is True
    assert first["outcome"] == "passed"
    assert first["hack_flagged"] is False
    assert first["infra_failure"] is None
    again = service.client.grade("kernels", str(PROBLEM), HONEST.encode(), name="solution.py")
    assert again["graded"] is False
    assert {k: v for k, v in again.items() if k != "graded"} == {
        k: v for k, v in first.items() if k != "graded"
    }
    assert "agentinfra_grades_total 1.0" in service.client.metrics()
    with pytest.raises(RolloutError) as bad:
        service.client.grade("kernels", str(tmp_path / "nope.py"), b"x")
    assert bad.value.status == 400
    service.stop()

    restarted = Service(tmp_path / "state", "--grade-timeout", "0.5")
    services.append(restarted)
    stored = restarted.client.grade("kernels", str(PROBLEM), HONEST.encode(), name="solution.py")
    assert stored["graded"] is False  # answered from disk after a restart: graded once in all
    timed_out = restarted.client.grade("kernels", str(PROBLEM), b"import torch\n", name="other.py")
    assert timed_out["outcome"] == "grader_error"
    assert timed_out["infra_failure"]["kind"] == "grader_error"
    assert "0.5 s" in timed_out["infra_failure"]["message"]


def _jailed_descendants(root_pid: int) -> set[tuple[int, int]]:
    """(pid, uid) of processes under sandbox uids descending from ``root_pid`` (other programs on
    the machine may run jails of their own: they are not this service's)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry)] = int(stat[1])
            except (OSError, IndexError, ValueError):
                continue
    found = set()
    for pid, uid in sandboxed_processes():
        cursor = pid
        while cursor > 1 and cursor != root_pid:
            cursor = parents.get(cursor, 0)
        if cursor == root_pid:
            found.add((pid, uid))
    return found


def _still_alive(processes: set[tuple[int, int]]) -> set[tuple[int, int]]:
    now = pids_by_uid()
    return {(pid, uid) for pid, uid in processes if pid in now.get(uid, [])}


@pytest.mark.slow
def test_kill_9_mid_grading_then_restart_finishes_every_rollout_and_leaves_no_jail(
    tmp_path: Path, services: list[Service]
) -> None:
    with ScriptedModelServer(solver(), models=[MODEL]) as model:
        service = Service(tmp_path / "state", "--concurrency", "2")
        services.append(service)
        group = service.client.submit_group(_group(model.base_url, 2))
        deadline = time.monotonic() + 120
        jailed: set[tuple[int, int]] = set()
        while time.monotonic() < deadline and not jailed:
            jailed = _jailed_descendants(service.process.pid)
            time.sleep(0.02)  # until a grading has a jail running
        assert jailed, "no grading started"
        service.kill9()
        restarted = Service(tmp_path / "state", "--concurrency", "2")
        services.append(restarted)
        trajectories = restarted.client.trajectories(group["group_id"])
    assert sorted(t["run_id"] for t in trajectories) == sorted(group["rollout_ids"])
    for trajectory in trajectories:  # resumed from the run directories, to the same end
        assert trajectory["infra_failure"] is None, trajectory["infra_failure"]
        # one verdict each (the outcome itself is the grader's: timing checks on 2 busy cores)
        assert len(trajectory["turn_rewards"]) == 1
    restarted.stop()
    time.sleep(0.5)
    assert _still_alive(jailed) == set()  # none of the killed service's jails outlived it


@pytest.mark.slow
def test_a_killed_model_server_is_a_labelled_infra_failure(
    tmp_path: Path, services: list[Service]
) -> None:
    service = Service(tmp_path / "state")
    services.append(service)
    model = ScriptedModelServer(talker(delay_s=0.0), models=[MODEL])
    with model:
        group = service.client.submit_group(_group(model.base_url, 2, max_retries=1))
    # the model server is gone before (or while) the rollouts call it
    trajectories = service.client.trajectories(group["group_id"])
    assert len(trajectories) == 2
    for trajectory in trajectories:
        assert trajectory["infra_failure"]["kind"] == "model_error", trajectory["infra_failure"]
    assert 'agentinfra_rollouts{state="finished_model_error"} 2.0' in service.client.metrics()


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process under a sandbox uid needs root")
def test_the_sweep_kills_processes_of_unheld_uids_only() -> None:
    from agentinfra.rollouts import sandbox_processes, sweep_orphaned_jails
    from agentinfra.sandbox import reserve_uid

    held_uid, held_fd = reserve_uid()  # a live jail's uid: its lock is held
    orphan_uid, orphan_fd = reserve_uid()
    os.close(orphan_fd)  # its owner died: the lock file stays, nobody holds it
    held = subprocess.Popen(["sleep", "60"], user=held_uid)
    orphan = subprocess.Popen(["sleep", "60"], user=orphan_uid)
    try:
        assert sandbox_processes()[orphan_uid] == [orphan.pid]
        swept = sweep_orphaned_jails()
        assert orphan_uid in swept
        assert held_uid not in swept
        assert orphan.wait(10) == -signal.SIGKILL
        assert held.poll() is None
    finally:
        held.kill()
        held.wait()
        os.close(held_fd)


@pytest.mark.slow
def test_kill_9_right_after_accepting_loses_nothing(
    tmp_path: Path, services: list[Service]
) -> None:
    with ScriptedModelServer(talker(delay_s=0.0), models=[MODEL]) as model:
        service = Service(tmp_path / "state", "--concurrency", "4")
        services.append(service)
        group = service.client.submit_group(_group(model.base_url, 4))
        time.sleep(0.2)  # run directories are being created
        service.kill9()
        restarted = Service(tmp_path / "state", "--concurrency", "4")
        services.append(restarted)
        trajectories = restarted.client.trajectories(group["group_id"])
    assert sorted(t["run_id"] for t in trajectories) == sorted(group["rollout_ids"])
    assert [t["infra_failure"] for t in trajectories] == [None] * 4


@pytest.mark.slow
@pytest.mark.vllm
def test_model_serve_then_rollouts_run_on_real_smollm2(tmp_path: Path) -> None:
    """The README's commands: `model serve` (real vLLM, SmolLM2), then `rollouts run` against it."""
    from agentinfra.engines import SMOLLM2_NAME, smollm2_dir

    if not smollm2_dir(check=False).is_dir():
        pytest.skip("no SmolLM2 here: run `make smollm2`")
    url_file, log = tmp_path / "url", tmp_path / "serve.log"
    with url_file.open("wb") as out, log.open("wb") as err:
        serve = subprocess.Popen(
            [sys.executable, "-m", "agentinfra", "model", "serve", "--log", str(tmp_path / "vllm.log")],
            stdout=out, stderr=err, env=ENV, cwd=ROOT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 900
        while not url_file.read_text().strip() and time.monotonic() < deadline:
            assert serve.poll() is None, log.read_text()
            time.sleep(1)
        base_url = url_file.read_text().split()[0]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", base_url)
        out = tmp_path / "smol.jsonl"
        done = subprocess.run(
            [sys.executable, "-m", "agentinfra", "rollouts", "run", "--tasks", str(PROBLEM),
             "--group-size", "2", "--model", SMOLLM2_NAME, "--base-url", base_url,
             "--policy-version", "smol-0", "--max-turns", "2", "--nudges", "1",
             "--max-output-tokens", "48", "--context-tokens", "8192",
             "--runs-dir", str(tmp_path / "runs"), "--out", str(out)],
            capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "returns the engine's token ids" in done.stderr
        trajectories = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(trajectories) == 2
        for trajectory in trajectories:
            assert trajectory["tokens"] == "exact"
            assert trajectory["infra_failure"] is None
            assert {c["policy_version"] for c in trajectory["calls"]} == {"smol-0"}
            sampled = sum(len(c["completion_ids"]) for c in trajectory["calls"])
            masked = sum(sum(s["loss_mask"]) for s in trajectory["segments"])
            assert masked == sampled  # every engine-sampled token, and only those, is trained on
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(120) == 0, log.read_text()

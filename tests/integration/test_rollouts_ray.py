"""The rollout service on a local two-node Ray cluster (`ray.cluster_utils.Cluster`): placement, a lost node, orphans.

The cluster (a head with three CPUs and one worker node with two) runs in this process's children;
the service runs as `agentinfra rollouts serve --ray ADDRESS` in a child process, so its
``kill -9`` is real, and a node is killed with ``Cluster.remove_node(allow_graceful=False)``
(SIGKILL to its raylet and its workers). The model is `ScriptedModelServer`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_rollouts import MODEL, PROBLEM, Service, _jailed_descendants, _still_alive, solver, talker

from agentinfra.agent import ScriptedModelServer

DESKTOP_TASK = Path(__file__).resolve().parents[2] / "examples/desktop/tasks/os-mkdir.json"

# A killed raylet is declared dead after a few missed health checks, not Ray's default ~15 s.
_FAST_FAILURE = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                 "health_check_timeout_ms": 500, "health_check_failure_threshold": 3}  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    local = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 3, "include_dashboard": False, "_system_config": _FAST_FAILURE})  # fmt: skip
    local.add_node(num_cpus=2)
    try:
        yield local
    finally:
        local.shutdown()


def _group(base_url: str, group_size: int) -> dict[str, Any]:
    return {"environment": "kernels", "task": str(PROBLEM), "group_size": group_size,
            "model": MODEL, "base_url": base_url, "stream": False}  # fmt: skip


def _worker(cluster: Any) -> Any:
    (node,) = cluster.worker_nodes
    return node


def _journalled(state_dir: Path) -> dict[str, str]:
    """Rollout id -> the label its ``rollout_finished`` event carries."""
    finished = {}
    for line in (state_dir / "service.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("type") == "rollout_finished":
            finished[event["data"]["rollout_id"]] = event["data"]["label"]
    return finished


def _episode_calls(model: ScriptedModelServer) -> int:
    """Model calls of rollouts (the service's token probe offers no tools)."""
    return sum(1 for body in model.requests if body.get("tools"))


def _episode_workers() -> list[int]:
    """Pids of Ray workers running an episode or a grading now (Ray titles a busy worker ``ray::<function>``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                title = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if title.startswith((b"ray::_episode_remote", b"ray::_evaluate_remote")):
                found.append(int(entry))
    return found


@pytest.mark.slow
def test_rollouts_spread_over_nodes_and_a_lost_node_loses_no_rollout(
    tmp_path: Path, cluster: Any
) -> None:
    head_id, worker_id = cluster.head_node.node_id, _worker(cluster).node_id
    service = Service(tmp_path / "state", "--ray", cluster.address, "--concurrency", "4")
    try:
        with ScriptedModelServer(talker(delay_s=0.3), models=[MODEL]) as model:
            group = service.client.submit_group(_group(model.base_url, 4))
            trajectories = service.client.trajectories(group["group_id"])
        assert sorted(t["run_id"] for t in trajectories) == sorted(group["rollout_ids"])
        assert [t["infra_failure"] for t in trajectories] == [None] * 4
        assert {t["rollout"]["node_id"] for t in trajectories} == {head_id, worker_id}

        with ScriptedModelServer(talker(delay_s=2.0), models=[MODEL]) as slow:
            group = service.client.submit_group(_group(slow.base_url, 4))
            deadline = time.monotonic() + 60
            while _episode_calls(slow) < 4 and time.monotonic() < deadline:
                time.sleep(0.1)  # every rollout is mid-episode, two on the worker node
            assert _episode_calls(slow) >= 4
            cluster.remove_node(_worker(cluster), allow_graceful=False)
            trajectories = service.client.trajectories(group["group_id"])
    finally:
        service.stop()
    assert sorted(t["run_id"] for t in trajectories) == sorted(group["rollout_ids"])
    lost = [t for t in trajectories if t["rollout"]["lost_nodes"]]
    assert lost, "no rollout ran on the killed node"
    for trajectory in lost:  # resumed on the head from their run directories, to the end
        assert trajectory["rollout"]["lost_nodes"] == [worker_id]
        assert trajectory["rollout"]["node_id"] == head_id
        assert trajectory["infra_failure"] is None
        assert len(trajectory["calls"]) == 4
    journalled = _journalled(tmp_path / "state")
    assert set(group["rollout_ids"]) <= set(journalled)
    cluster.add_node(num_cpus=2)  # for the next test


@pytest.mark.slow
def test_kill_9_of_the_service_and_a_node_leaves_no_orphan_and_loses_no_rollout(
    tmp_path: Path, cluster: Any
) -> None:
    with ScriptedModelServer(solver(), models=[MODEL]) as model:
        service = Service(tmp_path / "state", "--ray", cluster.address, "--concurrency", "2")
        try:
            group = service.client.submit_group(_group(model.base_url, 2))
            raylets = [n.all_processes["raylet"][0].process.pid for n in cluster.list_all_nodes()]
            deadline = time.monotonic() + 120
            jailed: set[tuple[int, int]] = set()
            while not jailed and time.monotonic() < deadline:
                jailed = {p for r in raylets for p in _jailed_descendants(r)}
                time.sleep(0.05)  # until a grading has a jail running on a node
            assert jailed, "no grading started"
            assert _episode_workers()
            service.kill9()
            cluster.remove_node(_worker(cluster), allow_graceful=False)
            deadline = time.monotonic() + 30
            while _episode_workers() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _episode_workers() == []  # Ray ended the dead service's workers with it
            restarted = Service(tmp_path / "state", "--ray", cluster.address, "--concurrency", "2")
            assert _still_alive(jailed) == set()  # none left, on any node (a sweep ran at start)
            answers = [
                restarted.client.cancel(rid, "the trainer moved on") for rid in group["rollout_ids"]
            ]
            restarted.stop()
        finally:
            service.stop()
    assert [a["trajectory"]["infra_failure"]["kind"] for a in answers] == ["cancelled"] * 2
    journalled = _journalled(tmp_path / "state")
    assert {rid: journalled.get(rid) for rid in group["rollout_ids"]} == dict.fromkeys(
        group["rollout_ids"], "cancelled"
    )


def _desktop_policy(delay_s: float) -> Any:
    """os-mkdir's solution, a WAIT first (the setup's xterm may not have its window yet), each reply slow."""
    from agentinfra.environments.desktop import load_desktop_task
    from agentinfra.environments.desktop._policy import DesktopPolicy, solution_moves

    solution = load_desktop_task(DESKTOP_TASK).solution()
    assert solution is not None
    moves = solution_moves(solution)
    policy = DesktopPolicy({load_desktop_task(DESKTOP_TASK).instruction: [moves[1], *moves]})

    def slow(body: dict[str, Any]) -> Any:
        return dataclasses.replace(policy(body), delay_s=delay_s)

    return slow


def _desktop_group(base_url: str, group_size: int) -> dict[str, Any]:
    return {"environment": "desktop", "task": str(DESKTOP_TASK), "group_size": group_size,
            "model": MODEL, "base_url": base_url, "stream": False, "max_turns": 10,
            "options": {"action_space": "computer_13", "observation": "a11y"}}  # fmt: skip


def _restarts(state_dir: Path) -> list[dict[str, Any]]:
    """The ``service_restarted`` events' data (``resumed``, ``swept_uids``), in order."""
    events = [json.loads(line) for line in (state_dir / "service.jsonl").read_text().splitlines()]
    return [e["data"] for e in events if e.get("type") == "service_restarted"]


@pytest.mark.slow
def test_desktops_run_on_both_nodes_and_kill_9_of_the_service_and_a_node_leaves_no_desktop(
    tmp_path: Path, cluster: Any
) -> None:
    """Desktop episodes as Ray tasks: one per node (2 CPUs each), each graded 1; then, with both
    mid-episode, ``kill -9`` of the service and of the worker node: no desktop process outlives
    them, the restarted service resumes both rollouts to their verdict, and the journal says
    how many orphaned uids its sweep had to kill."""
    if not cluster.worker_nodes:
        cluster.add_node(num_cpus=2)
    head_id, worker_id = cluster.head_node.node_id, _worker(cluster).node_id
    state = tmp_path / "state"
    memory = ("--ray-episode-memory-gib", "1")  # each local node's share of this machine's memory
    service = Service(state, "--ray", cluster.address, "--concurrency", "2", *memory)
    try:
        with ScriptedModelServer(_desktop_policy(0.0), models=[MODEL]) as model:
            group = service.client.submit_group(_desktop_group(model.base_url, 2))
            trajectories = service.client.trajectories(group["group_id"])
        assert [t["infra_failure"] for t in trajectories] == [None, None]
        assert [t["reward"] for t in trajectories] == [1.0, 1.0]
        assert {t["rollout"]["node_id"] for t in trajectories} == {head_id, worker_id}

        with ScriptedModelServer(_desktop_policy(2.0), models=[MODEL]) as slow:
            group = service.client.submit_group(_desktop_group(slow.base_url, 2))
            raylets = {n.node_id: n.all_processes["raylet"][0].process.pid
                       for n in cluster.list_all_nodes()}  # fmt: skip
            deadline = time.monotonic() + 120
            desktops: dict[str, set[tuple[int, int]]] = {}
            while time.monotonic() < deadline and not all(desktops.get(n) for n in raylets):
                desktops = {n: _jailed_descendants(pid) for n, pid in raylets.items()}
                time.sleep(0.1)  # until each node runs a desktop
            assert all(desktops.values()), f"a node runs no desktop: {desktops}"
            time.sleep(1.0)  # into the episodes: the desktops' processes have all started
            jailed = {p for pid in raylets.values() for p in _jailed_descendants(pid)}
            service.kill9()
            cluster.remove_node(_worker(cluster), allow_graceful=False)
            deadline = time.monotonic() + 30
            while _episode_workers() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _episode_workers() == []
            restarted = Service(state, "--ray", cluster.address, "--concurrency", "2", *memory)
            try:
                assert _still_alive(jailed) == set()  # no desktop left, on any node
                resumed = restarted.client.trajectories(group["group_id"])
            finally:
                restarted.stop()
    finally:
        service.stop()
        cluster.add_node(num_cpus=2)  # for the next test
    assert sorted(t["run_id"] for t in resumed) == sorted(group["rollout_ids"])
    assert [t["infra_failure"] for t in resumed] == [None, None]
    assert [t["reward"] for t in resumed] == [1.0, 1.0]
    (restart,) = _restarts(state)
    assert sorted(restart["resumed"]) == sorted(group["rollout_ids"])
    print(f"desktop processes at the kill: {len(jailed)}; uids the restart's sweep killed: "
          f"{restart['swept_uids']}")  # fmt: skip

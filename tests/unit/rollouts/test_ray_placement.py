"""Rollouts on Ray without a cluster: what episodes and gradings declare, refusals, a lost node's accounting."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from agentinfra._settings import GraderConfig, Settings
from agentinfra.errors import ConfigError
from agentinfra.rollouts import GroupRequest, RayPlacement, new_group
from agentinfra.rollouts._ray import (
    DESKTOP_EPISODE_MEMORY_BYTES,
    RayCluster,
    episode_resources,
    unsatisfiable,
)

ray_exceptions = pytest.importorskip("ray.exceptions")

NODES = [{"CPU": 2.0, "memory": 4.0 * 2**30}, {"CPU": 8.0, "memory": 2.0 * 2**30, "grading": 1.0}]


def test_an_episode_declares_its_environments_defaults_or_the_knobs() -> None:
    placement = RayPlacement(address="auto")
    assert episode_resources(placement, "kernels") == {"CPU": 1.0}
    assert episode_resources(placement, "desktop") == {
        "CPU": 2.0,
        "memory": float(DESKTOP_EPISODE_MEMORY_BYTES),
    }
    tuned = RayPlacement(address="auto", episode_cpus=0.5, episode_memory_bytes=2**30,
                         episode_resources={"rollout": 1.0})  # fmt: skip
    assert episode_resources(tuned, "desktop") == {"CPU": 0.5, "memory": 2.0**30, "rollout": 1.0}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"address": " "}, "--ray ''"),
        ({"episode_cpus": -1.0}, "--ray-episode-cpus -1.0"),
        ({"node_retries": -1}, "--ray-node-retries -1"),
        ({"grading_resources": {"CPU": 1.0}}, "--ray-grading-resource CPU=1.0"),
        ({"episode_resources": {"rollout": 0.0}}, "--ray-episode-resource rollout=0.0"),
    ],
)
def test_bad_placement_is_one_line_naming_its_flag(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as refused:
        RayPlacement(**{"address": "auto", **fields})
    assert named in str(refused.value)
    assert "\n" not in str(refused.value)


def test_unsatisfiable_names_the_resource_the_need_and_the_largest_node() -> None:
    assert unsatisfiable({"CPU": 2.0, "memory": 2.0**30}, NODES, "an episode") is None
    short = unsatisfiable({"CPU": 16.0}, NODES, "an episode")
    assert short is not None
    assert short.resource == "CPU"
    assert short.message == "an episode needs CPU=16 but the largest live node has CPU=8"
    memory = unsatisfiable({"CPU": 1.0, "memory": 6.0 * 2**30}, NODES, "x")
    assert memory is not None
    assert memory.message == "x needs memory=6 GiB but the largest live node has memory=4 GiB"
    split = unsatisfiable({"CPU": 4.0, "memory": 3.0 * 2**30}, NODES, "x")  # each fits, not both
    assert split is not None
    assert split.resource is None
    assert "on one node" in split.message
    assert unsatisfiable({"GPU": 1.0}, [], "x") is not None  # no live node at all


class _OfflineCluster(RayCluster):
    """A `RayCluster` with scripted nodes and attempts instead of Ray (the logic around them is real)."""

    def __init__(self, placement: RayPlacement, attempts: list[str | None]) -> None:
        self.placement = placement
        self.lost_nodes = set()
        self._background = set()
        self._lost = (ray_exceptions.NodeDiedError,)
        self.attempts = attempts
        self.sweeps = 0

    def nodes(self) -> dict[str, dict[str, float]]:
        return {f"n{i}": node for i, node in enumerate(NODES)}

    async def sweep(self) -> list[int]:
        self.sweeps += 1
        return []

    async def _attempt(self, job: Any, options: Any, node: list[str], cancel: Any) -> Any:
        outcome = self.attempts.pop(0)  # "lost@<node>", "lost" (before it started), "ok@<node>"
        kind, _, where = (outcome or "").partition("@")
        if where:
            node.append(where)
        if kind == "lost":
            raise ray_exceptions.NodeDiedError(f"node {where or '?'} died")
        return {"infra_failure": None, "rollout": {"id": job.rollout_id}}


def _run(cluster: _OfflineCluster, tmp_path: Path) -> dict[str, Any]:
    group = new_group(GroupRequest(environment="kernels", task=str(tmp_path / "t.py"), group_size=1,
                                   model="m", base_url="http://127.0.0.1:9/v1"))  # fmt: skip

    async def go() -> dict[str, Any]:
        trajectory = await cluster.run_rollout(
            tmp_path / "runs", group, group.rollout_ids[0], settings=Settings(), api_key="k",
            eval_workers=1, cancel_reason=lambda: None,
        )  # fmt: skip
        await asyncio.gather(*cluster._background)
        return trajectory

    return asyncio.run(go())


def test_a_lost_node_resumes_the_rollout_once_then_labels_it_node_lost(tmp_path: Path) -> None:
    resumed = _OfflineCluster(RayPlacement(address="auto"), ["lost@a", "ok@b"])
    trajectory = _run(resumed, tmp_path)
    assert trajectory["infra_failure"] is None
    assert trajectory["rollout"]["node_id"] == "b"
    assert trajectory["rollout"]["lost_nodes"] == ["a"]
    assert resumed.sweeps == 1  # every live node swept after the loss

    twice = _OfflineCluster(RayPlacement(address="auto"), ["lost@a", "lost@b", "ok@c"])
    trajectory = _run(twice, tmp_path)
    assert trajectory["infra_failure"]["kind"] == "node_lost"
    assert "node b died" in trajectory["infra_failure"]["message"]
    assert trajectory["rollout"]["lost_nodes"] == ["a", "b"]
    assert trajectory["rollout"]["node_id"] == "b"
    assert twice.attempts == ["ok@c"]  # not tried a third time

    no_retry = _OfflineCluster(RayPlacement(address="auto", node_retries=0), ["lost@a"])
    assert _run(no_retry, tmp_path)["infra_failure"]["kind"] == "node_lost"


def test_a_rollout_lost_before_it_started_is_placed_again_without_counting(tmp_path: Path) -> None:
    cluster = _OfflineCluster(RayPlacement(address="auto", node_retries=0), ["lost", "ok@a"])
    trajectory = _run(cluster, tmp_path)
    assert trajectory["infra_failure"] is None
    assert trajectory["rollout"]["lost_nodes"] == []


def test_a_group_no_node_can_run_is_refused_naming_the_knob() -> None:
    settings = Settings()
    _OfflineCluster(RayPlacement(address="auto"), []).check("kernels", settings)
    big = _OfflineCluster(RayPlacement(address="auto", episode_cpus=9), [])
    with pytest.raises(ConfigError) as refused:
        big.check("kernels", settings)
    assert str(refused.value) == (
        "a kernels episode needs CPU=9 but the largest live node has CPU=8 (--ray-episode-cpus)"
    )
    pool = _OfflineCluster(RayPlacement(address="auto", grading_resources={"gpu-pool": 1.0}), [])
    with pytest.raises(
        ConfigError, match=r"gpu-pool=1 .* has gpu-pool=0 \(--ray-grading-resource\)"
    ):
        pool.check("kernels", settings)
    cuda = dataclasses.replace(settings, grader=dataclasses.replace(GraderConfig(), device="cuda"))
    with pytest.raises(ConfigError, match=r"grading needs GPU=1 .* \(--ray-grading-gpus\)"):
        _OfflineCluster(RayPlacement(address="auto"), []).check("kernels", cuda)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (
            ["--ray-episode-resource", "rollout"],
            "--ray-episode-resource 'rollout' must be NAME=AMOUNT",
        ),
        (["--ray-grading-resource", "grading=-1"], "--ray-grading-resource grading=-1.0"),
        (["--ray-node-retries", "-1"], "--ray-node-retries -1"),
    ],
)
def test_serve_refuses_bad_ray_flags_before_anything_starts(
    flags: list[str], named: str, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from agentinfra.cli import app

    result = CliRunner().invoke(
        app, ["rollouts", "serve", "--state-dir", str(tmp_path), "--ray", "auto", *flags]
    )
    assert isinstance(result.exception, ConfigError), result.output
    assert named in str(result.exception)
    assert not (tmp_path / "service.jsonl").exists()


def test_an_address_nothing_listens_on_is_refused_at_once() -> None:
    from agentinfra.errors import RolloutError

    started = time.monotonic()
    with pytest.raises(RolloutError, match=r"cannot reach the Ray cluster at --ray 127\.0\.0\.1:9"):
        RayCluster(RayPlacement(address="127.0.0.1:9"))  # ray.init would wait for it forever
    assert time.monotonic() - started < 10


def test_episodes_that_would_hold_every_cpu_a_grading_needs_are_refused() -> None:
    cluster = _OfflineCluster(RayPlacement(address="auto"), [])  # nodes: CPU 2 + 8
    cluster.check("kernels", Settings(), concurrency=9)  # 9 episodes + 1 grading = 10
    with pytest.raises(ConfigError) as refused:
        cluster.check("kernels", Settings(), concurrency=10)
    assert str(refused.value).startswith(
        "--concurrency 10 kernels episodes (CPU=1 each) and a grading (CPU=1) need CPU=11 "
        "but the live nodes have CPU=10 in all"
    )
    halves = _OfflineCluster(RayPlacement(address="auto", episode_cpus=0.5), [])
    halves.check("kernels", Settings(), concurrency=18)


def test_a_desktop_pool_with_ray_is_refused(tmp_path: Path) -> None:
    from agentinfra.rollouts import ServiceConfig

    with pytest.raises(ConfigError, match=r"--desktop-pool 2 .* --ray"):
        ServiceConfig(state_dir=tmp_path, ray=RayPlacement(address="auto"), desktop_pool=2)

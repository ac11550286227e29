"""The runner's pieces: gradings with the group's seed; a trajectory even when no run could be read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentinfra.environments import Evaluation, Outcome, Submission, Task
from agentinfra.environments.kernels import KernelSettings
from agentinfra.harness import EvaluationRequest
from agentinfra.rollouts import GroupRequest, SeededExecutor, new_group, read_trajectory


class _Recorder:
    def __init__(self) -> None:
        self.seeds: list[int | None] = []

    async def evaluate(self, request: EvaluationRequest) -> Evaluation:
        self.seeds.append(request.seed)
        return Evaluation(
            environment="kernels", outcome=Outcome.PASSED, correct=True, score_unit="x"
        )


def test_every_grading_of_a_group_uses_its_hidden_seed() -> None:
    executor = SeededExecutor(1234)
    recorder = _Recorder()
    executor._local = recorder  # type: ignore[assignment]
    request = EvaluationRequest(
        environment="kernels", task=Task(name="t", data=b"x"), settings=KernelSettings(),
        submission=Submission(data=b"code"),
    )  # fmt: skip
    for _ in range(2):
        asyncio.run(executor.evaluate(request))
    assert recorder.seeds == [1234, 1234]  # never the fresh (None) seed of a plain run


def _group() -> Any:
    return new_group(GroupRequest(environment="kernels", task="/t.py", group_size=2, model="m",
                                  base_url="http://127.0.0.1:1/v1", policy_version="v3"))  # fmt: skip


def test_a_rollout_cancelled_before_it_started_still_has_a_trajectory(tmp_path: Path) -> None:
    group = _group()
    rid = group.rollout_ids[1]
    trajectory = read_trajectory(tmp_path / rid, group, cancelled="stale")
    assert trajectory["infra_failure"] == {"kind": "cancelled", "message": "stale"}
    assert trajectory["group_id"] == group.group_id
    assert trajectory["policy_version"] == "v3"
    assert trajectory["tokens"] == "unavailable"
    assert trajectory["calls"] == []
    assert trajectory["reward"] == 0.0
    assert trajectory["rollout"]["index"] == 1


def test_an_unreadable_run_is_an_infra_failure_not_a_bad_episode(tmp_path: Path) -> None:
    group = _group()
    trajectory = read_trajectory(tmp_path / group.rollout_ids[0], group)
    assert trajectory["infra_failure"]["kind"] == "internal"
    failure = {"kind": "environment_died", "message": "desktop gone"}
    labelled = read_trajectory(tmp_path / group.rollout_ids[0], group, failure=failure)
    assert labelled["infra_failure"] == failure


def test_run_groups_gives_a_labelled_trajectory_when_a_rollout_breaks(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import agentinfra.rollouts._runner as runner
    from agentinfra._settings import load_settings

    async def broken(root: Path, group: Any, rollout_id: str, **_: Any) -> dict[str, Any]:
        if rollout_id.endswith("-1"):
            raise RuntimeError("bug")
        return {"run_id": rollout_id, "infra_failure": None}

    monkeypatch.setattr(runner, "run_rollout", broken)
    got: list[dict[str, Any]] = []
    group = _group()
    done = asyncio.run(
        runner.run_groups(
            [group],
            tmp_path,
            settings=load_settings(),
            api_key="k",
            concurrency=2,
            on_trajectory=got.append,
        )
    )
    assert done == 2
    labels = sorted(str((t["infra_failure"] or {}).get("kind")) for t in got)
    assert labels == ["None", "internal"]


def test_a_harness_failure_is_internal_and_a_dead_sandbox_is_environment_died() -> None:
    from agentinfra.errors import HarnessError, SandboxError
    from agentinfra.rollouts import infra_failure_of

    assert infra_failure_of(HarnessError("journal gone"))["kind"] == "internal"
    assert infra_failure_of(SandboxError("jail died"))["kind"] == "environment_died"


def test_opening_a_rollouts_run_directory_imports_no_torch(tmp_path: Path) -> None:
    """Importing torch for run.json's version string held the GIL ~1 s under the service's loop."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    problem = root / "examples" / "kernels" / "problems" / "10_slow_rowwise_softmax.py"
    code = (
        "import sys, pathlib\n"
        "from agentinfra._settings import load_settings\n"
        "from agentinfra.rollouts import GroupRequest, new_group\n"
        "from agentinfra.rollouts._runner import open_rollout_run\n"
        f"g = new_group(GroupRequest(environment='kernels', task={str(problem)!r}, group_size=1,\n"
        "    model='m', base_url='http://127.0.0.1:1/v1'))\n"
        f"run = open_rollout_run(pathlib.Path({str(tmp_path)!r}), g, g.rollout_ids[0], load_settings())\n"
        "print(run.info.versions['torch'], 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, imported = out.stdout.split()
    assert imported == "False"
    assert version != "absent"  # still recorded, from the installed distribution


def test_the_model_client_is_built_off_the_event_loop(monkeypatch: Any) -> None:
    """Its TLS context reads the CA bundle: tens of ms that stalled every rollout of the loop."""
    import threading

    import agentinfra.harness._agent_run as agent_run

    built_on: list[int] = []

    class _Client:
        def __init__(self, **kwargs: Any) -> None:
            built_on.append(threading.get_ident())
            self.kwargs = kwargs

    monkeypatch.setattr(agent_run, "ModelClient", _Client)

    async def main() -> Any:
        return await agent_run.model_client_off_loop(model="m", base_url="u")

    client = asyncio.run(main())
    assert client.kwargs == {"model": "m", "base_url": "u"}
    assert built_on
    assert built_on[0] != threading.get_ident()

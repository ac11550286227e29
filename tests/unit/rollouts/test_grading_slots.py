"""One bounded pool of grading cores per process: rollouts' gradings wait for it instead of oversubscribing the machine."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from agentinfra._settings import load_settings
from agentinfra.environments import Evaluation, Outcome, Submission, Task
from agentinfra.environments.kernels import KernelSettings
from agentinfra.errors import ConfigError
from agentinfra.harness import EvaluationRequest
from agentinfra.rollouts import GroupRequest, SeededExecutor, ServiceConfig, new_group, run_groups
from agentinfra.rollouts._slots import GradingSlots


class _Slow:
    """An executor that counts how many evaluations run at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.order: list[bytes] = []

    async def evaluate(self, request: EvaluationRequest) -> Evaluation:
        self.now += 1
        self.most = max(self.most, self.now)
        self.order.append(request.submission.data)
        await asyncio.sleep(0.02)
        self.now -= 1
        return Evaluation(
            environment="kernels", outcome=Outcome.PASSED, correct=True, score_unit="x"
        )


def _request(data: bytes, threads: int = 1) -> EvaluationRequest:
    return EvaluationRequest(
        environment="kernels", task=Task(name="t", data=b"x"),
        settings=KernelSettings(threads=threads), submission=Submission(data=data),
    )  # fmt: skip


def _graded_at_once(slots: GradingSlots, gradings: int, threads: int = 1) -> _Slow:
    slow = _Slow()
    executors = [SeededExecutor(7, slots) for _ in range(gradings)]  # one per rollout
    for executor in executors:
        executor._local = slow  # type: ignore[assignment]

    async def main() -> None:
        await asyncio.gather(
            *(e.evaluate(_request(bytes([i]), threads)) for i, e in enumerate(executors))
        )

    asyncio.run(main())
    return slow


def test_eight_rollouts_grade_at_most_as_many_at_once_as_the_pool_has_cores() -> None:
    slow = _graded_at_once(GradingSlots(2), 8)
    assert slow.most == 2
    assert slow.order == [bytes([i]) for i in range(8)]  # first come, first served


def test_a_grading_takes_as_many_cores_as_its_grader_threads() -> None:
    assert _graded_at_once(GradingSlots(4), 6, threads=2).most == 2
    assert _graded_at_once(GradingSlots(2), 3, threads=8).most == 1  # never more than the pool


def test_a_cancelled_wait_gives_nothing_away() -> None:
    slots = GradingSlots(1)

    async def main() -> None:
        async with slots.hold():
            waiter = asyncio.create_task(_enter(slots))
            await asyncio.sleep(0.01)
            assert slots.waiting == 1
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert slots.waiting == 0
        assert slots.free == 1
        await asyncio.wait_for(_enter(slots), 1)  # the pool still serves

    asyncio.run(main())


async def _enter(slots: GradingSlots) -> None:
    async with slots.hold():
        pass


def test_the_default_pool_is_the_machines_cpus_and_bad_sizes_are_refused(tmp_path: Path) -> None:
    assert GradingSlots().slots == max(1, len(os.sched_getaffinity(0)) - 1)
    for bad in (0, -3):
        with pytest.raises(ConfigError, match="--grading-slots"):
            GradingSlots(bad)
        with pytest.raises(ConfigError, match="--grading-slots"):
            ServiceConfig(state_dir=tmp_path, grading_slots=bad)


def test_run_groups_gives_every_rollout_the_same_pool(tmp_path: Path, monkeypatch: Any) -> None:
    import agentinfra.rollouts._runner as runner

    pools: list[GradingSlots] = []

    async def record(root: Path, group: Any, rollout_id: str, **kw: Any) -> dict[str, Any]:
        pools.append(kw["slots"])
        return {"run_id": rollout_id, "infra_failure": None}

    monkeypatch.setattr(runner, "run_rollout", record)
    groups = [new_group(GroupRequest(environment="kernels", task="/t.py", group_size=4, model="m",
                                     base_url="http://127.0.0.1:1/v1")) for _ in range(2)]  # fmt: skip
    done = asyncio.run(run_groups(groups, tmp_path, settings=load_settings(), api_key="k",
                                  concurrency=8, on_trajectory=lambda _: None, grading_slots=3))  # fmt: skip
    assert done == 8
    assert len(pools) == 8
    assert len({id(p) for p in pools}) == 1
    assert pools[0].slots == 3


def test_the_service_grades_its_rollouts_and_post_grade_from_one_pool(tmp_path: Path) -> None:
    from agentinfra.rollouts import RolloutService

    service = RolloutService(ServiceConfig(state_dir=tmp_path, grading_slots=3), load_settings(),
                             api_key_of=lambda _: "k")  # fmt: skip
    assert service.slots.slots == 3
    assert service.desk.slots is service.slots


def test_the_service_metrics_show_the_pool(tmp_path: Path) -> None:
    from prometheus_client import generate_latest

    from agentinfra.rollouts import RolloutService

    service = RolloutService(ServiceConfig(state_dir=tmp_path, grading_slots=3), load_settings(),
                             api_key_of=lambda _: "k")  # fmt: skip

    async def main() -> str:
        async with service.slots.hold(2):
            return generate_latest(service.metrics.registry).decode()

    text = asyncio.run(main())
    assert 'agentinfra_grading_slots{state="busy"} 2.0' in text
    assert 'agentinfra_grading_slots{state="free"} 1.0' in text
    assert "agentinfra_gradings_waiting 0.0" in text
    assert "agentinfra_gradings_waiting_memory " in text  # the host's ledger: other processes count
    assert "agentinfra_grading_memory_reserved_bytes " in text

"""One rollout: an agent run in its own run directory, graded with its group's hidden seed, as a trajectory.

A rollout is an ordinary agent run (`agentinfra.harness.run_agent`: the loop, the
grading queue, the environment's tools), with two differences:

- its gradings use the group's hidden seed (`SeededExecutor`), so the G rollouts of a
  group are judged on the same secret inputs;
- whatever happens, it ends in a trajectory (`agentinfra.harness.trajectory_of`, read
  from the run directory, never re-tokenized here). An exception that ended the run
  is labelled as an infra failure (`infra_failure_of`) when the trajectory does not
  already carry one; a cancel is labelled ``cancelled`` with the trainer's reason.

Run directories are ``<root>/<rollout id>``; a rollout whose directory exists is
resumed from its journals (after a crash of the service), as `agentinfra resume` does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentinfra._settings import Settings
from agentinfra.agent import EndpointLimiter
from agentinfra.environments import Evaluation, environment_definition
from agentinfra.errors import AgentInfraError, HarnessError
from agentinfra.harness import (
    AgentRunState,
    EvaluationRequest,
    Executor,
    LocalExecutor,
    RunDirectory,
    agent_run_spec,
    run_agent,
    trajectory_of,
)
from agentinfra.harness import error_failure as infra_failure_of
from agentinfra.rollouts._slots import GradingSlots, grading_cost
from agentinfra.rollouts._spec import ROLLOUT_SCHEMA_VERSION, Group

__all__ = [
    "SeededExecutor",
    "infra_failure_of",
    "open_rollout_run",
    "read_trajectory",
    "run_groups",
    "run_rollout",
]

logger = logging.getLogger(__name__)


class SeededExecutor:
    """Evaluates every request with the group's hidden ``seed``, once ``slots`` has its cores.

    The evaluation runs in this process (`LocalExecutor`), or in ``inner`` (a `RayExecutor`,
    whose gradings Ray places by the resources they declare: no ``slots`` then). The wait
    for cores lies between the run's ``grading_started`` and ``graded``, so a trajectory's
    time split counts it as grading.
    """

    def __init__(
        self, seed: int, slots: GradingSlots | None = None, *, inner: Executor | None = None
    ) -> None:
        self._seed = seed
        self._slots = slots
        self._local: Executor = inner or LocalExecutor()  # the evaluator (named for its default)
        self.where = self._local.where

    async def evaluate(self, request: EvaluationRequest) -> Evaluation:
        request = dataclasses.replace(request, seed=self._seed)
        if self._slots is None:
            return await self._local.evaluate(request)
        async with self._slots.hold(grading_cost(request.settings)):
            return await self._local.evaluate(request)


def open_rollout_run(root: Path, group: Group, rollout_id: str, settings: Settings) -> RunDirectory:
    """The run directory of ``rollout_id``: created on its first start, reopened (resumed) after a crash.

    Raises:
        ConfigError: the group's environment, task or options are refused.
        HarnessError: the directory exists but cannot be opened.
    """
    path = root / rollout_id
    if (path / "run.json").is_file():
        return RunDirectory.open(path)
    if path.exists():  # a crash inside `RunDirectory.create`: before run.json, nothing ran
        shutil.rmtree(path)
    request = group.request
    definition = environment_definition(request.environment)
    task = Path(request.task)
    spec = agent_run_spec(
        rollout_id, task, request.loop_config(capture_tokens=group.capture_tokens), definition.new_settings(settings),
        environment=request.environment, options=definition.options_of(request.options),
    )  # fmt: skip
    return RunDirectory.create(path, spec, grader_version=definition.grader_version)


def read_trajectory(
    path: Path,
    group: Group,
    *,
    failure: dict[str, str] | None = None,
    cancelled: str | None = None,
) -> dict[str, Any]:
    """The trajectory of the run at ``path`` (`trajectory_of`), labelled with ``failure`` if it has none.

    A run that cannot be read as a trajectory (it ended before its first model call was
    journalled) still gives one: no calls, no tokens, reward 0, and its infra failure.
    """
    try:
        trajectory: dict[str, Any] = trajectory_of(
            path, group_id=group.group_id, cancelled=cancelled
        )
    except AgentInfraError as exc:
        if failure is None and cancelled is None:
            failure = infra_failure_of(exc)
        trajectory = _empty_trajectory(path, group, failure, cancelled)
    if trajectory.get("infra_failure") is None and failure is not None:
        trajectory["infra_failure"] = failure
    if trajectory.get("policy_version") is None:
        trajectory["policy_version"] = group.request.policy_version
    trajectory["rollout"] = {"schema_version": ROLLOUT_SCHEMA_VERSION, "id": path.name,
                             "index": group.rollout_ids.index(path.name)
                             if path.name in group.rollout_ids else None}  # fmt: skip
    return trajectory


def _empty_trajectory(
    path: Path, group: Group, failure: dict[str, str] | None, cancelled: str | None
) -> dict[str, Any]:
    request = group.request
    if cancelled is not None:
        failure = {"kind": "cancelled", "message": cancelled}
    return {
        "schema_version": 1, "run_id": path.name, "environment": request.environment,
        "task": request.task, "group_id": group.group_id, "model": request.model,
        "base_url": request.base_url, "policy_version": request.policy_version,
        "tokens": "unavailable", "calls": [], "segments": [], "messages": [], "tools": [],
        "reward": 0.0, "turn_rewards": [], "hack_flagged": False, "infra_failure": failure,
        "stop_reason": "infra_failure", "time": None, "usage": None,
    }  # fmt: skip


async def run_rollout(
    root: Path,
    group: Group,
    rollout_id: str,
    *,
    settings: Settings,
    api_key: str,
    limiter: EndpointLimiter,
    eval_workers: int = 1,
    slots: GradingSlots | None = None,
    cancel_reason: Callable[[], str | None] = lambda: None,
    state: AgentRunState | None = None,
    grader: Executor | None = None,
) -> dict[str, Any]:
    """Runs (or resumes) one rollout to its end and returns its trajectory.

    Its gradings take their cores from ``slots``, the pool every rollout of the process
    shares (None: no bound, for a caller that runs one rollout), and run in this process,
    or in ``grader`` (a `RayExecutor`), always with the group's seed.

    A cancel of the calling task with ``cancel_reason()`` set ends the run (its
    transcript is journalled per call) and returns the partial trajectory labelled
    ``cancelled``; any other cancel propagates.
    """
    failure: dict[str, str] | None = None
    cancelled: str | None = None
    started = time.monotonic()
    run: RunDirectory | None = None
    try:
        run = await asyncio.to_thread(open_rollout_run, root, group, rollout_id, settings)
        executor = SeededExecutor(group.seed, slots, inner=grader)
        await run_agent(
            run, api_key=api_key, limiter=limiter, eval_workers=eval_workers, state=state,
            executor=executor,
        )  # fmt: skip
    except asyncio.CancelledError:
        cancelled = cancel_reason()
        if cancelled is None:
            raise
    except HarnessError as exc:  # the run directory itself
        logger.exception("rollout %s: harness failed", rollout_id)
        failure = infra_failure_of(exc)
    except Exception as exc:  # labelled, never a reward 0 of a bad episode
        logger.info("rollout %s ended by %s: %s", rollout_id, type(exc).__name__, exc)
        failure = infra_failure_of(exc)
    finally:
        if run is not None:
            run.close()
    trajectory = await asyncio.to_thread(
        read_trajectory, root / rollout_id, group, failure=failure, cancelled=cancelled
    )
    trajectory.setdefault("rollout", {})["service_wall_s"] = round(time.monotonic() - started, 3)
    return trajectory


async def run_groups(
    groups: list[Group],
    root: Path,
    *,
    settings: Settings,
    api_key: str,
    concurrency: int,
    on_trajectory: Callable[[dict[str, Any]], None],
    eval_workers: int = 1,
    grading_slots: int | None = None,
) -> int:
    """Runs every rollout of ``groups`` under ``root``, at most ``concurrency`` at once, in group order.

    Their gradings share one pool of ``grading_slots`` cores (`GradingSlots`; None: the
    machine's CPUs less one). Each trajectory goes to ``on_trajectory`` as soon as its rollout ends;
    returns how many did.

    Raises:
        ConfigError: ``grading_slots`` is below 1.
    """
    slots = GradingSlots(grading_slots)
    gate = asyncio.Semaphore(concurrency)
    limiter = EndpointLimiter(max_in_flight=concurrency)
    done = 0

    async def one(group: Group, rollout_id: str) -> None:
        nonlocal done
        async with gate:
            try:
                trajectory = await run_rollout(
                    root, group, rollout_id, settings=settings, api_key=api_key, limiter=limiter,
                    eval_workers=eval_workers, slots=slots,
                )  # fmt: skip
            except Exception as exc:  # agentinfra's own failure: still one labelled trajectory
                logger.exception("rollout %s", rollout_id)
                failure = {"kind": "internal", "message": f"{type(exc).__name__}: {exc}"[:2000]}
                try:
                    trajectory = read_trajectory(root / rollout_id, group, failure=failure)
                except Exception:  # nothing to give: counted as missing (exit status 1)
                    logger.exception("rollout %s: no trajectory", rollout_id)
                    return
        on_trajectory(trajectory)
        done += 1

    async with asyncio.TaskGroup() as tasks:
        for group in groups:
            for rollout_id in group.rollout_ids:
                tasks.create_task(one(group, rollout_id))
    return done

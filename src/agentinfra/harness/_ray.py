"""Grading on a Ray cluster: any environment's evaluations run as Ray tasks.

Ray is the existing distributed engine; agentinfra only ships each evaluation to
it. What travels is the environment's name, its task and the submission as bytes,
and the environment's settings as JSON; the Ray worker opens the environment
through the registry (which validates the settings by the environment's own
model) and evaluates there. Each node needs agentinfra (and the environment's
own requirements: for kernels, ``unshare`` and ``setpriv``). Install with
``pip install 'agentinfra[ray]'``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentinfra.environments import (
    Evaluation,
    Submission,
    Task,
    environment_definition,
)
from agentinfra.errors import HarnessError
from agentinfra.harness._executors import EvaluationRequest

__all__ = ["RayExecutor"]


def _evaluate_remote(
    name: str, task: Task, settings: dict[str, Any], submission: Submission, seed: int | None
) -> dict[str, Any]:
    """Runs in a Ray worker: opens the environment by name and evaluates."""
    environment = environment_definition(name).open(task, settings)
    return asyncio.run(environment.evaluate(submission, seed=seed)).to_json()


class RayExecutor:
    """Evaluations as Ray tasks (one CPU each by default), for any registered environment."""

    def __init__(self, *, address: str | None = None, num_cpus_per_grading: float = 1.0) -> None:
        try:
            import ray
        except ImportError:
            raise HarnessError("--cluster needs Ray: pip install 'agentinfra[ray]'") from None
        if not ray.is_initialized():
            try:
                ray.init(address=None if address in (None, "local") else address, include_dashboard=False,
                         log_to_driver=False, ignore_reinit_error=True)  # fmt: skip
            except Exception as exc:  # Ray raises many types for an unreachable cluster
                raise HarnessError(f"cannot connect to Ray cluster {address!r}: {exc}") from None
        self._remote = ray.remote(num_cpus=num_cpus_per_grading)(_evaluate_remote)
        self.where = f"ray:{address or 'local'}"

    async def evaluate(self, request: EvaluationRequest) -> Evaluation:
        reference = self._remote.remote(
            request.environment,
            request.task,
            request.settings.model_dump(mode="json"),
            request.submission,
            request.seed,
        )
        result: dict[str, Any] = await asyncio.wrap_future(reference.future())
        return Evaluation.model_validate(result)

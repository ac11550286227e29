"""Grading on a Ray cluster: any environment's evaluations run as Ray tasks.

Ray is the existing distributed engine; agentinfra only ships each evaluation to
it. What travels is the environment's name, its task and the submission as bytes,
and the environment's settings as JSON; the Ray worker opens the environment
through the registry (which validates the settings by the environment's own
model) and evaluates there. Each node needs agentinfra (and the environment's
own requirements: for kernels, ``unshare`` and ``setpriv``). Install with
``pip install 'agentinfra[ray]'``.

Each grading declares what it occupies, so that Ray places it on a node that has it:
``num_cpus_per_grading`` CPUs (None: the settings' ``threads``, the cores a kernels
grading pins), ``num_gpus_per_grading`` GPUs when the settings ask for CUDA
(``device == "cuda"``; CPU gradings declare none), and any custom ``resources``
(``{"grading": 1}`` keeps gradings on nodes a user set apart for them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

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

    def __init__(
        self,
        *,
        address: str | None = None,
        num_cpus_per_grading: float | None = 1.0,
        num_gpus_per_grading: float = 1.0,
        resources: Mapping[str, float] | None = None,
    ) -> None:
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
        self._remote = ray.remote(_evaluate_remote)
        self._cpus = num_cpus_per_grading
        self._gpus = num_gpus_per_grading
        self._resources = dict(resources or {})
        self.where = f"ray:{address or 'local'}"

    @staticmethod
    def resources_of(
        settings: BaseModel,
        *,
        num_cpus: float | None = 1.0,
        num_gpus: float = 1.0,
        resources: Mapping[str, float] | None = None,
    ) -> dict[str, float]:
        """What one grading under ``settings`` declares, in Ray's names (``CPU``, ``GPU``, custom)."""
        threads = getattr(settings, "threads", 1)
        cpus = (
            num_cpus if num_cpus is not None else float(threads if isinstance(threads, int) else 1)
        )
        need = {"CPU": cpus, **(resources or {})}
        if getattr(settings, "device", "cpu") == "cuda" and num_gpus > 0:
            need["GPU"] = num_gpus
        return need

    def options_of(self, settings: BaseModel) -> dict[str, Any]:
        """Ray's task options for one grading under ``settings`` (`resources_of`)."""
        need = self.resources_of(settings, num_cpus=self._cpus, num_gpus=self._gpus,
                                 resources=self._resources)  # fmt: skip
        custom = {k: v for k, v in need.items() if k not in ("CPU", "GPU")}
        return {"num_cpus": need["CPU"], "num_gpus": need.get("GPU", 0.0), "resources": custom}

    async def evaluate(self, request: EvaluationRequest) -> Evaluation:
        reference = self._remote.options(**self.options_of(request.settings)).remote(
            request.environment,
            request.task,
            request.settings.model_dump(mode="json"),
            request.submission,
            request.seed,
        )
        result: dict[str, Any] = await asyncio.wrap_future(reference.future())
        return Evaluation.model_validate(result)

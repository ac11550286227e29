"""The seam between the harness and an environment's grader.

The harness is generic: it stores, queues and journals submissions and keeps
verdicts as JSON objects with at least ``outcome``, ``correct``, ``speedup``
(the score; None when not measured) and ``findings``. An environment turns a
submission file into such a verdict, and says what the agent may see of it
(never hidden seeds or the audit schedule).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from agentinfra.environments.kernels import GRADER_VERSION, GradeOptions, grade_async
from agentinfra.errors import HarnessError
from agentinfra.harness._spec import GraderSettings, RunSpec

__all__ = ["Environment", "KernelEnvironment", "make_environment"]


class Environment(Protocol):
    """Grades submissions for one task."""

    name: str
    grader_version: str

    async def evaluate(self, submission: Path, *, seed: int | None = None) -> dict[str, Any]:
        """The verdict for ``submission`` as a JSON object."""

    def agent_view(self, verdict: dict[str, Any]) -> dict[str, Any]:
        """What the agent is told about ``verdict``."""


class KernelEnvironment:
    """KernelBench-format problems graded by `agentinfra.environments.kernels`."""

    name = "kernels"
    grader_version = GRADER_VERSION

    def __init__(self, task: Path, settings: GraderSettings) -> None:
        if not task.is_file():
            raise HarnessError(f"task {task} does not exist or is not a file")
        self.task = task
        self.settings = settings

    async def evaluate(self, submission: Path, *, seed: int | None = None) -> dict[str, Any]:
        options = GradeOptions(
            threads=self.settings.threads,
            timeout_s=self.settings.timeout_s,
            timing_pairs=self.settings.timing_pairs,
            correctness_seeds=self.settings.correctness_seeds,
            seed=seed,
        )
        verdict = await grade_async(self.task, submission, options)
        return verdict.model_dump(mode="json")

    def agent_view(self, verdict: dict[str, Any]) -> dict[str, Any]:
        return {
            "outcome": verdict.get("outcome"),
            "correct": verdict.get("correct"),
            "speedup": verdict.get("speedup"),
            "error": verdict.get("error"),
            "findings": [
                {"check": f["check"], "severity": f["severity"], "message": f["message"]}
                for f in verdict.get("findings", [])
            ],
        }


def make_environment(
    spec: RunSpec, *, base: Path | None = None, cluster: str | None = None
) -> Environment:
    """The environment of ``spec``; a relative task path is resolved against ``base``.

    ``cluster`` grades on Ray: ``"local"`` starts a local Ray instance, an address
    such as ``"ray://head:10001"`` or ``"auto"`` connects to a running cluster.
    """
    task = Path(spec.task)
    if not task.is_absolute() and base is not None:
        task = base / task
    if spec.environment != "kernels":
        raise HarnessError(f"unknown environment {spec.environment!r}")
    environment = KernelEnvironment(task, spec.grader)
    if cluster is None:
        return environment
    from agentinfra.harness._ray import RayKernelEnvironment

    return RayKernelEnvironment(environment, address=cluster)

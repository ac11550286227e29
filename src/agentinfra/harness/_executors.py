"""How the harness reaches environments: by name through the registry, never by import.

`open_environment` turns a run's spec into an `Environment` (the registry
resolves ``spec.environment``; the environment loads ``spec.task``). An
`Executor` runs evaluations: it is handed one `EvaluationRequest`, exactly what
it ships (the environment's name, its task, its settings, the submission and the
seed), and returns the `Evaluation`. `LocalExecutor` evaluates in this process's
event loop, `RayExecutor` (``_ray``) on a cluster. The harness imports no environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from agentinfra.environments import (
    Environment,
    Evaluation,
    Submission,
    Task,
    environment_definition,
)
from agentinfra.harness._spec import RunSpec

__all__ = ["EvaluationRequest", "Executor", "LocalExecutor", "make_executor", "open_environment"]


def open_environment(spec: RunSpec, *, base: Path | None = None) -> Environment:
    """The environment of ``spec`` with its task loaded; a relative task path is resolved against ``base``.

    Raises:
        ConfigError: the environment is not registered (the message lists those
            that are), or the task cannot be loaded.
    """
    definition = environment_definition(spec.environment)
    task = Path(spec.task)
    if not task.is_absolute() and base is not None:
        task = base / task
    return definition.open(definition.load_task(task), spec.settings)


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluationRequest:
    """One evaluation, as an executor ships it: everything the far side needs, nothing else.

    ``environment`` is the registered name the far side opens; ``seed`` None means
    fresh secret seeds there (the harness never derives them from the run's seed).
    """

    environment: str
    task: Task
    settings: BaseModel
    submission: Submission
    seed: int | None = None

    @classmethod
    def of(
        cls, environment: Environment, submission: Submission, *, seed: int | None = None
    ) -> EvaluationRequest:
        """The request to evaluate ``submission`` as ``environment`` would."""
        return cls(environment=environment.name, task=environment.task,
                   settings=environment.settings, submission=submission, seed=seed)  # fmt: skip

    def is_for(self, environment: Environment) -> bool:
        """Whether ``environment`` is the one this request names (name, task and settings)."""
        return (environment.name, environment.task, environment.settings) == (
            self.environment, self.task, self.settings,
        )  # fmt: skip


class Executor(Protocol):
    """Runs one evaluation request somewhere."""

    @property
    def where(self) -> str: ...

    async def evaluate(self, request: EvaluationRequest) -> Evaluation: ...


class LocalExecutor:
    """Evaluates in this process (the environment decides how: kernels use sandboxed subprocesses).

    A request is evaluated by the environment given here when it names that one
    (the run's own: `RunHarness` passes it), else by one opened through the
    registry from the request, as a Ray worker would, and kept for later requests.
    """

    where = "local"

    def __init__(self, *environments: Environment) -> None:
        self._environments = list(environments)

    def _environment_for(self, request: EvaluationRequest) -> Environment:
        for environment in self._environments:
            if request.is_for(environment):
                return environment
        opened = environment_definition(request.environment).open(request.task, request.settings)
        self._environments.append(opened)
        return opened

    async def evaluate(self, request: EvaluationRequest) -> Evaluation:
        environment = self._environment_for(request)
        return await environment.evaluate(request.submission, seed=request.seed)


def make_executor(cluster: str | None = None) -> Executor:
    """`LocalExecutor`, or a `RayExecutor` for ``cluster``: ``"local"`` starts a local Ray
    instance, an address such as ``"ray://head:10001"`` or ``"auto"`` joins a running one."""
    if cluster is None:
        return LocalExecutor()
    from agentinfra.harness._ray import RayExecutor

    return RayExecutor(address=cluster)

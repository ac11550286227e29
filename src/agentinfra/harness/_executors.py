"""How the harness reaches environments: by name through the registry, never by import.

`open_environment` turns a run's spec into an `Environment` (the registry
resolves ``spec.environment``; the environment loads ``spec.task``). An
`Executor` runs evaluations: `LocalExecutor` in this process's event loop,
`RayExecutor` (``_ray``) on a cluster. The harness imports no environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from agentinfra.environments import Environment, Evaluation, Submission, environment_definition
from agentinfra.harness._spec import RunSpec

__all__ = ["Executor", "LocalExecutor", "make_executor", "open_environment"]


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
    return definition.create(definition.load_task(task), spec.grader)


class Executor(Protocol):
    """Runs one evaluation of an environment somewhere."""

    @property
    def where(self) -> str: ...

    async def evaluate(
        self, environment: Environment, submission: Submission, *, seed: int | None = None
    ) -> Evaluation: ...


class LocalExecutor:
    """Evaluates in this process (the environment decides how: kernels use sandboxed subprocesses)."""

    where = "local"

    async def evaluate(
        self, environment: Environment, submission: Submission, *, seed: int | None = None
    ) -> Evaluation:
        return await environment.evaluate(submission, seed=seed)


def make_executor(cluster: str | None = None) -> Executor:
    """`LocalExecutor`, or a `RayExecutor` for ``cluster``: ``"local"`` starts a local Ray
    instance, an address such as ``"ray://head:10001"`` or ``"auto"`` joins a running one."""
    if cluster is None:
        return LocalExecutor()
    from agentinfra.harness._ray import RayExecutor

    return RayExecutor(address=cluster)

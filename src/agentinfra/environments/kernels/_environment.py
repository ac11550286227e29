"""The kernels environment behind the seam: KernelBench-format tasks, scored by speedup.

`ENVIRONMENT` is what the registry hands out for ``--env kernels``. Each
evaluation grades the task's and the submission's bytes (`grade_async` takes
bytes), so the same code runs on this machine or on a Ray node that has only the bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentinfra.environments import (
    AgentHooks,
    AgentSetup,
    EnvironmentDefinition,
    Evaluation,
    ScoreSpec,
    Submission,
    Task,
)
from agentinfra.environments.kernels._agent_tools import (
    AGENT_VISIBLE_SEED,
    KERNEL_SYSTEM_PROMPT,
    kernel_task_prompt,
    kernel_tools,
)
from agentinfra.environments.kernels._grader import GRADER_VERSION, GradeOptions, grade_async
from agentinfra.environments.kernels._settings import (
    KernelSettings,
    kernel_settings,
    quick_settings,
    strict_settings,
)
from agentinfra.environments.kernels._verdict import Verdict
from agentinfra.errors import ConfigError

__all__ = ["ENVIRONMENT", "SCORE", "KernelEnvironment", "evaluation_of", "load_kernel_task"]

SCORE = ScoreSpec(
    unit="speedup", thresholds=(1.0, 2.0, 5.0, 10.0), scale="log", remeasure_best=True, suffix="x"
)
_MAX_TASK_BYTES = 1 << 20


def load_kernel_task(path: Path) -> Task:
    """A KernelBench problem file as a task.

    Raises:
        ConfigError: the path is not a readable file of at most 1 MiB.
    """
    if not path.is_file():
        raise ConfigError(f"task {path} does not exist or is not a file (--task)")
    data = path.read_bytes()
    if len(data) > _MAX_TASK_BYTES:
        raise ConfigError(
            f"task {path} has {len(data)} bytes; a problem file may have at most {_MAX_TASK_BYTES}"
        )
    return Task(name=path.name, data=data, source=str(path.resolve()))


def evaluation_of(verdict: Verdict) -> Evaluation:
    """The seam's evaluation of a kernel verdict: score = speedup, kernel figures in details."""
    return Evaluation(
        environment="kernels", outcome=verdict.outcome, correct=verdict.correct, score=verdict.speedup,
        score_unit=SCORE.unit, score_ci=verdict.speedup_ci, findings=list(verdict.findings),
        provenance=verdict.provenance.model_dump(mode="json"), error=verdict.error,
        details={"speedup": verdict.speedup, "candidate_ms": verdict.candidate_ms,
                 "baseline_ms": verdict.baseline_ms, "verdict_schema_version": verdict.schema_version,
                 "utilisation": verdict.utilisation.model_dump(mode="json") if verdict.utilisation else None},
    )  # fmt: skip


class KernelEnvironment:
    """One KernelBench-format problem, graded by `agentinfra.environments.kernels`."""

    name = "kernels"
    grader_version = GRADER_VERSION
    score = SCORE

    def __init__(self, task: Task, settings: KernelSettings) -> None:
        self.task = task
        self.settings = settings
        self.device = settings.device
        """Where this run grades; the harness samples this device while the run serves."""

    async def evaluate(self, submission: Submission, *, seed: int | None = None) -> Evaluation:
        options = GradeOptions.from_settings(self.settings, seed=seed)
        return evaluation_of(
            await grade_async(self.task.data, submission.data, options, problem_name=self.task.name)
        )

    def agent_view(self, evaluation: Evaluation) -> dict[str, Any]:
        return {
            "outcome": evaluation.outcome.value,
            "correct": evaluation.correct,
            "speedup": evaluation.score,
            "error": evaluation.error,
            "findings": [
                {"check": f.check, "severity": f.severity, "message": f.message}
                for f in evaluation.findings
            ],
        }

    async def check(self, submission: Submission) -> Evaluation:
        """The agent's `check`: agent-visible seeds and quick timing (a hint, not the score)."""
        options = GradeOptions.from_settings(
            self.settings.model_copy(update={"correctness_seeds": 1, "timing_pairs": 5}),
            seed=AGENT_VISIBLE_SEED,
        )
        return evaluation_of(
            await grade_async(self.task.data, submission.data, options, problem_name=self.task.name)
        )

    def agent_setup(self, workspace: Path, hooks: AgentHooks) -> AgentSetup:
        return AgentSetup(
            tools=kernel_tools(self.task, workspace, hooks, self.check),
            system_prompt=KERNEL_SYSTEM_PROMPT,
            task_prompt=kernel_task_prompt(self.task.name),
        )


ENVIRONMENT = EnvironmentDefinition(
    name="kernels",
    description="KernelBench-format PyTorch problems; the score is the measured speedup",
    grader_version=GRADER_VERSION,
    score=SCORE,
    load_task=load_kernel_task,
    settings=KernelSettings,
    create=KernelEnvironment,
    settings_from=kernel_settings,
    strict_settings=strict_settings,
    quick_settings=quick_settings,
)

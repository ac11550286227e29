"""The kernels taskset, its task and its reward (see the package docstring)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from agentinfra_verifiers import (
    AgentinfraService,
    ServiceError,
    ServiceTaskConfig,
    python_submission,
)

__all__ = [
    "KernelsData",
    "KernelsTask",
    "KernelsTaskConfig",
    "KernelsTaskset",
    "KernelsTasksetConfig",
    "kernel_reward",
]

SYSTEM_PROMPT = """\
You optimise PyTorch programs. You are given a reference `Model` (a torch.nn.Module with
`get_inputs()` and `get_init_inputs()`). Write a Python file that defines `ModelNew` with the
same constructor arguments and the same outputs, faster. It is graded on its own with secret
inputs; outputs must match the reference within tolerance, and tricks that fake speed
(caching results, skipping work, touching the timer) are detected and scored zero.
Reply with the complete file in one ```python block."""

_EXAMPLES = Path(__file__).resolve().parents[4] / "examples" / "kernels" / "problems"


class KernelsTaskConfig(ServiceTaskConfig):
    """Each task's grading (`--env.taskset.task.*`): the rollout service, its token variable."""


class KernelsTasksetConfig(vf.TasksetConfig):
    problems_dir: Path | None = None
    """Directory of KernelBench-format problem files (searched recursively, sorted by path);
    default: agentinfra's examples/kernels/problems."""
    task: KernelsTaskConfig = KernelsTaskConfig()


class KernelsData(vf.TaskData):
    problem_path: str
    """Absolute path of the problem file; the rollout service grades against it."""


def kernel_reward(verdict: dict[str, Any]) -> float:
    """agentinfra's reward of one verdict: its score (the speedup) when it passed, else 0; 0 when hack-flagged."""
    if verdict.get("hack_flagged") or verdict.get("outcome") != "passed":
        return 0.0
    return float(verdict.get("score") or 0.0)


class KernelsTask(vf.Task[KernelsData, vf.State, KernelsTaskConfig]):
    @vf.reward
    async def speedup(self, task: KernelsData, trace: vf.Trace[Any]) -> float:
        """Grades the reply's file through the service; an infra failure raises (an errored rollout)."""
        service = AgentinfraService.of(self.config)
        verdict = await service.grade("kernels", task.problem_path, python_submission(trace.last_reply),
                                      name="solution.py")  # fmt: skip
        trace.info["agentinfra_grade"] = {
            k: verdict.get(k) for k in ("key", "outcome", "score", "hack_flagged", "graded")
        }
        failure = verdict.get("infra_failure")
        if failure:
            raise ServiceError(
                f"agentinfra's grader failed ({failure.get('kind')}: {failure.get('message')}); "
                "the rollout is an infra failure, not a reward of 0 (resume the run to grade it again)"
            )
        return kernel_reward(verdict)


class KernelsTaskset(vf.Taskset[KernelsTask, KernelsTasksetConfig]):
    def load(self) -> Iterator[KernelsTask]:
        folder = (self.config.problems_dir or _EXAMPLES).expanduser().resolve()
        if not folder.is_dir():
            raise ValueError(f"no problem directory at {folder} (--env.taskset.problems-dir)")
        problems = sorted(p for p in folder.rglob("*.py") if not p.name.startswith("_"))
        if not problems:
            raise ValueError(f"{folder} holds no .py problem files (--env.taskset.problems-dir)")
        AgentinfraService.of(self.config.task).check()
        for path in problems:
            source = path.read_text(errors="replace")
            yield KernelsTask(
                KernelsData(
                    id=str(path.relative_to(folder)),
                    name=path.stem,
                    problem_path=str(path),
                    system_prompt=SYSTEM_PROMPT,
                    prompt=f"Make this reference faster (`{path.name}`):\n\n```python\n{source}\n```",
                ),
                self.config.task,
            )

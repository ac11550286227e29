"""The desktop taskset and its task (see the package docstring)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from agentinfra_verifiers import (
    AgentinfraService,
    RolloutTaskData,
    ServiceTaskConfig,
    rollout_reward,
)
from pydantic import Field

__all__ = [
    "DesktopData",
    "DesktopTask",
    "DesktopTaskConfig",
    "DesktopTaskset",
    "DesktopTasksetConfig",
]

_EXAMPLES = Path(__file__).resolve().parents[4] / "examples" / "desktop" / "tasks"


class DesktopTaskConfig(ServiceTaskConfig):
    """Each rollout's service and agent settings (`--env.taskset.task.*`)."""

    max_turns: int = 30
    """The agent loop's turn budget (``agentinfra run --max-turns``)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The desktop's agent options, e.g. ``{"observation": "a11y"}`` (``--env-option``)."""


class DesktopTasksetConfig(vf.TasksetConfig):
    tasks_dir: Path | None = None
    """Directory of OSWorld-format task JSON files (sorted by name); default: agentinfra's
    examples/desktop/tasks."""
    task: DesktopTaskConfig = DesktopTaskConfig()


class DesktopData(RolloutTaskData):
    pass


class DesktopTask(vf.Task[DesktopData, vf.State, DesktopTaskConfig]):
    @vf.reward
    async def reward(self, trace: vf.Trace[Any]) -> float:
        """The trajectory's reward; an infra failure raises (an errored rollout)."""
        return rollout_reward(trace)


class DesktopTaskset(vf.Taskset[DesktopTask, DesktopTasksetConfig]):
    def load(self) -> Iterator[DesktopTask]:
        folder = (self.config.tasks_dir or _EXAMPLES).expanduser().resolve()
        if not folder.is_dir():
            raise ValueError(f"no desktop task directory at {folder} (--env.taskset.tasks-dir)")
        paths = sorted(folder.glob("*.json"))
        if not paths:
            raise ValueError(f"{folder} holds no .json task files (--env.taskset.tasks-dir)")
        task = self.config.task
        AgentinfraService.of(task).check()
        for path in paths:
            document = json.loads(path.read_text())
            yield DesktopTask(
                DesktopData(
                    id=str(document.get("id") or path.stem), name=path.stem,
                    prompt=str(document.get("instruction", "")), environment="desktop",
                    task_path=str(path), service_url=task.service_url, token_var=task.token_var,
                    timeout_s=task.grade_timeout_s, max_turns=task.max_turns, options=task.options,
                ),
                task,
            )  # fmt: skip

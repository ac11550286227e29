"""A tool that fails inside agentinfra is journalled with a structured ``internal_error``; the model's mistakes are not."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentinfra.agent import (
    AgentLoop,
    Completion,
    LoopConfig,
    ModelClient,
    Tool,
    Transcript,
    Usage,
    profile_for,
)
from agentinfra.errors import HarnessError, SandboxError, TaskEnvironmentError, ToolError


class _ControllerError(TaskEnvironmentError):
    """Like the desktop's controller error: a subclass, recognised by its base."""


class _CallsOnce(ModelClient):
    def __init__(self) -> None:
        super().__init__(base_url="http://127.0.0.1:9/v1", model="m", api_key="k", api_key_env="K",
                         profile=profile_for("m"))  # fmt: skip
        self.turns = 0

    async def complete(self, messages: Any, tools: Any, *, stream: bool, on_retry: Any = None,
                       capture_tokens: bool = False) -> Completion:  # fmt: skip
        self.turns += 1
        if self.turns == 1:
            call = {"id": "c1", "type": "function", "function": {"name": "act", "arguments": "{}"}}
            return Completion(
                {"role": "assistant", "content": "", "tool_calls": [call]},
                Usage(1, 1),
                "stop",
                0.01,
                1,
                None,
            )
        return Completion(
            {"role": "assistant", "content": "done"}, Usage(1, 1), "stop", 0.01, 1, None
        )


def _result_of(tmp_path: Path, exc: Exception) -> dict[str, Any]:
    async def act(arguments: dict[str, Any]) -> str:
        raise exc

    transcript = Transcript.open(tmp_path / "t.jsonl")
    loop = AgentLoop(config=LoopConfig(model="m", base_url="http://127.0.0.1:9/v1"), client=_CallsOnce(),
                     tools=[Tool("act", "acts", {"type": "object", "properties": {}}, act)],
                     system_prompt="s", task_prompt="t", transcript=transcript)  # fmt: skip
    assert asyncio.run(loop.run()).stop_reason == "done"  # the run goes on past the failure
    transcript.close()
    return next(e.data for e in Transcript.read(tmp_path / "t.jsonl") if e.type == "tool_result")


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (_ControllerError("desktop controller is gone"), "environment_died"),
        (SandboxError("the jail died"), "environment_died"),
        (HarnessError("cannot write the run's journal"), "internal"),
        (KeyError("x"), "internal"),
    ],
)
def test_a_tool_failing_inside_agentinfra_is_journalled_with_its_kind(
    tmp_path: Path, exc: Exception, kind: str
) -> None:
    result = _result_of(tmp_path, exc)
    assert result["is_error"] is True
    assert result["internal_error"] == {
        "kind": kind,
        "type": type(exc).__name__,
        "message": str(exc),
    }
    assert "failed inside agentinfra" in result["content"]  # what the model reads is unchanged


def test_the_models_mistake_has_no_internal_error(tmp_path: Path) -> None:
    result = _result_of(tmp_path, ToolError("no such file"))
    assert result["content"] == "error: no such file"
    assert "internal_error" not in result

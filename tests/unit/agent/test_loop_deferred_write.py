"""The turn's last tool result is written while the next model request goes out; order and failures hold."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
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
from agentinfra.errors import AgentError


class _SlowResults(ThreadPoolExecutor):
    """Journal writes, those of ``slow`` events 0.3 s late (a busy machine), or failing."""

    def __init__(self, fail: bool = False, slow: str = "tool_result") -> None:
        super().__init__(max_workers=2)
        self.fail = fail
        self.slow = slow

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if args and args[0] == self.slow:

            def slow(*a: Any) -> Any:
                time.sleep(0.3)
                if self.fail:
                    raise AgentError("cannot write journal: disk full")
                return fn(*a)

            return super().submit(slow, *args)
        return super().submit(fn, *args, **kwargs)


class _Scripted(ModelClient):
    """Turn 1 calls ``noop`` (or ``finish``); turn 2 answers in prose."""

    def __init__(self, transcript: Transcript, tool: str = "noop") -> None:
        super().__init__(base_url="http://127.0.0.1:9/v1", model="m", api_key="k", api_key_env="K",
                         profile=profile_for("m"))  # fmt: skip
        self.transcript = transcript
        self.tool = tool
        self.results_seen: list[int] = []

    async def complete(self, messages: Any, tools: Any, *, stream: bool, on_retry: Any = None,
                       capture_tokens: bool = False) -> Completion:  # fmt: skip
        self.results_seen.append(sum(e.type == "tool_result" for e in self.transcript.events))
        if len(self.results_seen) == 1:
            call = {
                "id": "c1",
                "type": "function",
                "function": {"name": self.tool, "arguments": "{}"},
            }
            message = {"role": "assistant", "content": "", "tool_calls": [call]}
        else:
            message = {"role": "assistant", "content": "all done"}
        return Completion(message, Usage(5, 1), "stop", 0.01, 1, None)


def _loop(tmp_path: Path, executor: ThreadPoolExecutor, tool: str = "noop") -> AgentLoop:
    transcript = Transcript.open(tmp_path / "t.jsonl", executor=executor)
    _TRANSCRIPTS.append(transcript)
    tools = [Tool("noop", "does nothing", {"type": "object", "properties": {}}, _ok),
             Tool("finish", "ends the run", {"type": "object", "properties": {}}, _ok, ends_run=True)]  # fmt: skip
    config = LoopConfig(model="m", base_url="http://127.0.0.1:9/v1", max_turns=5)
    return AgentLoop(config=config, client=_Scripted(transcript, tool), tools=tools,
                     system_prompt="s", task_prompt="t", transcript=transcript)  # fmt: skip


_STARTS_SEEN: list[int] = []


async def _ok(arguments: dict[str, Any]) -> str:
    transcript = _TRANSCRIPTS[-1]
    _STARTS_SEEN.append(sum(e.type == "tool_started" for e in transcript.events))
    return "ok"


_TRANSCRIPTS: list[Transcript] = []


def test_the_next_request_leaves_while_the_last_result_is_written_and_order_holds(
    tmp_path: Path,
) -> None:
    loop = _loop(tmp_path, _SlowResults())
    outcome = asyncio.run(loop.run())
    assert outcome.stop_reason == "done"
    assert isinstance(loop.client, _Scripted)
    assert loop.client.results_seen == [0, 0]  # the 2nd request did not wait for the slow write
    loop.transcript.close()
    types = [e.type for e in Transcript.read(tmp_path / "t.jsonl")]
    assert types == ["loop_started", "model_response", "tool_started", "tool_result",
                     "model_response", "stopped"]  # fmt: skip


def test_a_result_that_ends_the_run_is_durable_before_it_stops(tmp_path: Path) -> None:
    loop = _loop(tmp_path, _SlowResults(), tool="finish")
    assert asyncio.run(loop.run()).stop_reason == "done"
    assert isinstance(loop.client, _Scripted)
    assert loop.client.results_seen == [0]
    types = [e.type for e in loop.transcript.events]
    assert types[-2:] == ["tool_result", "stopped"]


def test_a_failed_deferred_write_ends_the_run_and_no_later_reply_is_journalled(
    tmp_path: Path,
) -> None:
    loop = _loop(tmp_path, _SlowResults(fail=True))
    with pytest.raises(AgentError, match="disk full"):
        asyncio.run(loop.run())
    types = [e.type for e in loop.transcript.events]
    assert types == ["loop_started", "model_response", "tool_started", "failed"]
    assert "disk full" in loop.transcript.events[-1].data["error"]


def test_a_tool_runs_while_its_start_is_written(tmp_path: Path) -> None:
    _STARTS_SEEN.clear()
    loop = _loop(tmp_path, _SlowResults(slow="tool_started"))
    assert asyncio.run(loop.run()).stop_reason == "done"
    assert _STARTS_SEEN == [0]  # the handler did not wait for the slow write
    types = [e.type for e in loop.transcript.events]
    assert types[1:4] == ["model_response", "tool_started", "tool_result"]
    result = loop.transcript.events[3].data
    assert 0 <= result["tool_s"] < 0.3  # the tool's own time, not the write's

"""The transcript's replay: the history, usage and unfinished calls rebuilt from its events."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentinfra.agent import ToolCall, Transcript, Usage
from agentinfra.agent._context import DropTurns, ShortenToolOutput
from agentinfra.agent._transcript import History, last_result_of_turn, nudges_used, replay

SHA = "d" * 64
IMAGE = {"type": "image", "sha256": SHA, "media_type": "image/png"}
START = [{"role": "system", "content": "s"}, {"role": "user", "content": "t"}]


def reply(turn: int, *call_ids: str) -> dict[str, Any]:
    calls = [{"call_id": c, "name": "look", "arguments": "{}", "error": None} for c in call_ids]
    message = {"role": "assistant", "content": f"turn {turn}", "reasoning_content": "why"}
    return {"turn": turn, "message": message, "calls": calls,
            "usage": {"prompt_tokens": 10 * turn, "completion_tokens": turn}}  # fmt: skip


def result(turn: int, call_id: str, content: Any) -> dict[str, Any]:
    return {"turn": turn, "call_id": call_id, "name": "look", "content": content, "is_error": False}


def transcript_of(tmp_path: Path, events: list[tuple[str, dict[str, Any]]]) -> Transcript:
    transcript = Transcript.open(tmp_path / "t.jsonl")

    async def write() -> None:
        for type_, data in events:
            await transcript.append_async(type_, data)

    asyncio.run(write())
    return transcript


def test_replay_rebuilds_history_usage_and_the_calls_still_to_run(tmp_path: Path) -> None:
    transcript = transcript_of(tmp_path, [
        ("loop_started", {"config": {}, "messages": START, "tools": []}),
        ("model_response", reply(1, "c1", "c2")),
        ("tool_result", result(1, "c1", [{"type": "text", "text": "screen"}, IMAGE])),
        ("tool_result", result(1, "c2", "x" * 500)),
        ("feedback", {"turn": 1, "kind": "no_tool_call", "text": "use the tools"}),
        ("model_response", reply(2, "c3", "c4")),
        ("tool_started", {"turn": 2, "call_id": "c3", "name": "look", "arguments": "{}", "error": None}),
        ("tool_result", result(2, "c3", "ok")),
    ])  # fmt: skip
    history = History([], keeps_reasoning=False)
    state = replay(transcript.events, history, started_wall_s=0.0)
    transcript.close()
    assert state.turn == 2
    assert state.usage == Usage(30, 3)
    assert state.last_prompt_tokens == 20
    assert state.started_wall_s == transcript.events[0].wall_s
    assert state.pending == [ToolCall("c4", "look", "{}")]
    assert history.messages == [
        *START,
        {"role": "assistant", "content": "turn 1"},  # reasoning dropped: the profile does not keep it
        {"role": "tool", "tool_call_id": "c1", "content": f"screen\n[image {SHA[:12]}: attached in the next message]"},
        {"role": "tool", "tool_call_id": "c2", "content": "x" * 500},
        {"role": "user", "content": "use the tools"},
        {"role": "user", "content": [{"type": "text", "text": "[images returned by tool call(s) c1]"}, IMAGE]},
        {"role": "assistant", "content": "turn 2"},
        {"role": "tool", "tool_call_id": "c3", "content": "ok"},
    ]  # fmt: skip
    assert nudges_used(transcript.events) == 1
    assert last_result_of_turn(transcript.events) == result(2, "c3", "ok")


def test_replay_applies_journalled_trims(tmp_path: Path) -> None:
    changes = [ShortenToolOutput(3, "short", 500).to_json(), DropTurns(2).to_json()]
    transcript = transcript_of(tmp_path, [
        ("loop_started", {"config": {}, "messages": START, "tools": []}),
        ("model_response", reply(1, "c1")),
        ("tool_result", result(1, "c1", "x" * 500)),
        ("model_response", reply(2)),
        ("context_trimmed", {"turn": 2, "changes": changes, "estimated_tokens": 9, "context_tokens": 99}),
    ])  # fmt: skip
    history = History([], keeps_reasoning=True)
    state = replay(transcript.events, history, started_wall_s=0.0)
    transcript.close()
    assert state.pending == []
    assert history.messages == [*START, reply(2)["message"]]
    assert last_result_of_turn(transcript.events) is None

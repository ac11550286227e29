"""Token capture from vLLM-shaped replies (JSON and SSE chunks), as vLLM 0.32 sends them: ids exactly as returned."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentinfra.agent import (
    AgentLoop,
    CallTokens,
    Completion,
    LoopConfig,
    ModelClient,
    Transcript,
    Usage,
    call_tokens_of,
    profile_for,
    split_segments,
)
from agentinfra.agent._model import _Assembly


def _lp(*values: float) -> dict[str, Any]:
    return {
        "content": [
            {"token": "t", "logprob": v, "bytes": [116], "top_logprobs": []} for v in values
        ]
    }


def test_a_whole_response_gives_the_prompt_and_choice_ids() -> None:
    assembly = _Assembly(want_tokens=True)
    assembly.add_response({
        "prompt_token_ids": [1, 2, 3], "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        "choices": [{"message": {"role": "assistant", "content": "hi", "reasoning": None, "tool_calls": []},
                     "finish_reason": "stop", "token_ids": [7, 8], "logprobs": _lp(-0.5, -0.25)}],
    })  # fmt: skip
    reply = assembly.reply()
    assert reply.tokens == CallTokens([1, 2, 3], [7, 8], [-0.5, -0.25])
    assert reply.message == {"role": "assistant", "content": "hi"}
    assert (reply.finish_reason, reply.usage.prompt_tokens, reply.usage.completion_tokens) == (
        "stop",
        3,
        2,
    )


def test_chunks_give_the_first_chunks_prompt_and_every_delta_in_order() -> None:
    assembly = _Assembly(want_tokens=True)
    chunks = [
        {"prompt_token_ids": [1, 2], "choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"reasoning": "hm"}, "token_ids": [5], "logprobs": _lp(-1.0)}]},
        {"choices": [{"delta": {}, "token_ids": [6], "logprobs": _lp(-2.0)}]},  # text held back: ids still come
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "read", "arguments": "{"}}]},
                      "token_ids": [7, 8], "logprobs": _lp(-3.0, -4.0)}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}, "token_ids": [9],
                      "logprobs": _lp(-5.0), "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 5}},
    ]  # fmt: skip
    for chunk in chunks:
        assembly.add_chunk(chunk)
    reply = assembly.reply()
    assert reply.tokens == CallTokens([1, 2], [5, 6, 7, 8, 9], [-1.0, -2.0, -3.0, -4.0, -5.0])
    assert reply.message["reasoning_content"] == "hm"
    assert reply.message["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    ]
    assert reply.finish_reason == "tool_calls"


def test_no_ids_no_tokens_and_misaligned_logprobs_are_dropped() -> None:
    plain = _Assembly(want_tokens=True)
    plain.add_chunk({"choices": [{"delta": {"content": "x"}, "logprobs": _lp(-1.0)}]})
    assert plain.reply().tokens is None  # a hosted API: no ids, nothing re-tokenized
    misaligned = _Assembly(want_tokens=True)
    misaligned.add_response({"prompt_token_ids": [1], "choices": [{"message": {"content": "x"}, "token_ids": [4, 5],
                                                                   "logprobs": _lp(-1.0)}]})  # fmt: skip
    assert misaligned.reply().tokens == CallTokens([1], [4, 5], None)
    unasked = _Assembly(want_tokens=False)
    unasked.add_response(
        {"prompt_token_ids": [1], "choices": [{"message": {"content": "x"}, "token_ids": [4]}]}
    )
    assert unasked.reply().tokens is None


class _EngineLike(ModelClient):
    """A `ModelClient` whose engine extends each prompt with the last call's ids and 2 new tokens."""

    def __init__(self) -> None:
        super().__init__(base_url="http://127.0.0.1:9/v1", model="m", api_key="k", api_key_env="K",
                         profile=profile_for("m"))  # fmt: skip
        self.ids: list[int] = [1, 2, 3]
        self.asked: list[bool] = []

    async def complete(self, messages: Any, tools: Any, *, stream: bool, on_retry: Any = None,
                       capture_tokens: bool = False) -> Completion:  # fmt: skip
        self.asked.append(capture_tokens)
        prompt = [*self.ids, 50 + len(self.asked)]
        completion = [100 + len(self.asked)]
        self.ids = prompt + completion
        tokens = CallTokens(prompt, completion, [-0.5]) if capture_tokens else None
        return Completion(
            {"role": "assistant", "content": "thinking"},
            Usage(len(prompt), 1),
            "stop",
            0.01,
            1,
            tokens,
        )


def _loop(path: Path, client: _EngineLike, max_turns: int) -> AgentLoop:
    config = LoopConfig(model="m", base_url="http://127.0.0.1:9/v1", max_turns=max_turns, nudges=50,
                        capture_tokens=True, policy_version="p1")  # fmt: skip
    return AgentLoop(config=config, client=client, tools=[], system_prompt="s", task_prompt="t",
                     transcript=Transcript.open(path))  # fmt: skip


def test_ids_are_journalled_as_deltas_and_survive_a_resume(tmp_path: Path) -> None:
    client = _EngineLike()
    first = _loop(tmp_path / "t.jsonl", client, max_turns=2)
    asyncio.run(first.run())
    first.transcript.close()
    resumed = _loop(
        tmp_path / "t.jsonl", client, max_turns=4
    )  # a new process would rebuild the same way
    asyncio.run(resumed.run())
    events = resumed.transcript.events
    resumed.transcript.close()
    replies = [e.data for e in events if e.type == "model_response"]
    assert client.asked == [True] * 4
    assert [r["tokens"]["prompt_new"] for r in replies] == [[1, 2, 3, 51], [52], [53], [54]]
    assert [r["policy_version"] for r in replies] == ["p1"] * 4
    calls, causes = call_tokens_of(events)
    assert [list(c.prompt_ids) for c in calls if c is not None][-1] == [
        1,
        2,
        3,
        51,
        101,
        52,
        102,
        53,
        103,
        54,
    ]
    assert causes[2] == ["resume"]
    (segment,) = split_segments(calls, causes)  # the resume kept the prefix: no break
    assert segment.loss_mask == [0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 1]

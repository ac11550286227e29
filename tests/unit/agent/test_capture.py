"""Token capture from vLLM-shaped replies (JSON and SSE chunks), as vLLM 0.32 sends them: ids exactly as returned."""

from __future__ import annotations

from typing import Any

from agentinfra.agent import CallTokens
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

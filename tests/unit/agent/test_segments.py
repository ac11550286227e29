"""Segments by construction: hand-built call records, exact token sequences, masks and breaks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from agentinfra.agent import CallTokens, call_tokens_of, split_segments
from agentinfra.agent._segments import decode_tokens, encode_tokens

SYSTEM = [1, 2, 3]


def _call(prompt: list[int], completion: list[int]) -> CallTokens:
    return CallTokens(prompt, completion, [-0.5 - i for i in range(len(completion))])


def test_an_extending_episode_is_one_segment_with_completions_masked_in() -> None:
    first = _call([*SYSTEM, 10], [20, 21])
    second = _call([*SYSTEM, 10, 20, 21, 30, 31], [22])  # tool result 30, 31 then the reply
    third = _call([*SYSTEM, 10, 20, 21, 30, 31, 22, 40], [23, 24])
    (segment,) = split_segments([first, second, third], [[], [], []])
    assert segment.token_ids == [*SYSTEM, 10, 20, 21, 30, 31, 22, 40, 23, 24]
    assert segment.loss_mask == [0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    assert segment.logprobs == [None] * 4 + [-0.5, -1.5, None, None, -0.5, None, -0.5, -1.5]
    assert segment.calls == [0, 1, 2]
    assert segment.break_reason is None
    assert segment.break_position is None


def test_a_journalled_trim_that_breaks_the_prefix_starts_a_segment_with_its_cause() -> None:
    first = _call([*SYSTEM, 10], [20])
    second = _call([*SYSTEM, 10, 20, 30, 31, 32], [21])  # a long tool result
    third = _call([*SYSTEM, 10, 20, 30, 99, 21, 40], [22])  # the result shortened: 31, 32 -> 99
    one, two = split_segments([first, second, third], [[], [], ["context_trim"]])
    assert one.calls == [0, 1]
    assert two.calls == [2]
    assert two.break_reason == "context_trim"
    assert two.break_position == 6  # where 31 became 99
    assert two.token_ids == [*SYSTEM, 10, 20, 30, 99, 21, 40, 22]
    assert two.loss_mask == [0] * 9 + [1]  # the earlier reply is context now, not trained on


def test_an_unexplained_break_is_a_template_rerender_and_a_resume_is_named() -> None:
    first = _call([*SYSTEM, 10], [20, 21])  # 20 = reasoning the template strips next time
    second = _call([*SYSTEM, 10, 21, 30], [22])
    third = _call([*SYSTEM, 7], [23])
    one, two, three = split_segments([first, second, third], [[], [], ["resume"]])
    assert (two.break_reason, two.break_position) == ("template_rerender", 4)
    assert (three.break_reason, three.break_position) == ("resume", 3)
    assert one.calls == [0]


def test_causes_are_not_assumed_a_trim_that_keeps_the_prefix_makes_no_break() -> None:
    first = _call([*SYSTEM, 10], [20])
    second = _call([*SYSTEM, 10, 20, 30], [21])
    (segment,) = split_segments([first, second], [[], ["context_trim", "resume"]])
    assert segment.calls == [0, 1]


def test_a_call_without_ids_breaks_the_next_one() -> None:
    first = _call(SYSTEM, [20])
    third = _call([*SYSTEM, 20, 30], [21])
    _one, two = split_segments([first, None, third], [[], [], []])
    assert two.break_reason == "tokens_missing"
    assert two.calls == [2]
    assert split_segments([None, None], [[], []]) == []
    with pytest.raises(ValueError, match="2 cause lists for 1 calls"):
        split_segments([first], [[], []])


def test_missing_logprobs_stay_none_and_never_shift_alignment() -> None:
    (segment,) = split_segments([CallTokens(SYSTEM, [20, 21], None)], [[]])
    assert segment.logprobs == [None] * 5
    assert segment.loss_mask == [0, 0, 0, 1, 1]


@dataclass
class _Event:
    type: str
    data: dict[str, Any] = field(default_factory=dict)


def test_causes_come_from_the_transcript_between_two_calls() -> None:
    tokens = {"prompt_ids": SYSTEM, "completion_ids": [20], "completion_logprobs": [-1.0]}
    events = [
        _Event("loop_started"),
        _Event("model_response", {"tokens": tokens}),
        _Event("context_trimmed", {"changes": [{"op": "drop_images", "index": 4}]}),
        _Event("context_trimmed", {"changes": [{"op": "shorten", "index": 3}]}),
        _Event("model_response", {"tokens": None}),
        _Event("loop_resumed"),
        _Event("model_response", {}),
    ]
    calls, causes = call_tokens_of(events)
    assert calls == [CallTokens(SYSTEM, [20], [-1.0]), None, None]
    assert causes == [[], ["image_dropped", "context_trim"], ["resume"]]


def test_journalled_ids_are_deltas_that_decode_exactly() -> None:
    first = CallTokens([1, 2, 3], [4, 5], [-0.1, -0.2])
    second = CallTokens([1, 2, 3, 4, 5, 6], [7], None)
    rerendered = CallTokens([1, 2, 9, 9], [8], [-0.3])
    records = []
    previous = None
    for call in (first, second, rerendered):
        records.append(encode_tokens(call, previous))
        previous = call.all_ids
    assert records[1] == {
        "prompt_shared": 5,
        "prompt_new": [6],
        "completion_ids": [7],
        "completion_logprobs": None,
    }
    assert records[2]["prompt_shared"] == 2
    events = [_Event("model_response", {"tokens": r}) for r in records]
    calls, _ = call_tokens_of(events)
    assert [list(c.prompt_ids) for c in calls if c is not None] == [
        [1, 2, 3],
        [1, 2, 3, 4, 5, 6],
        [1, 2, 9, 9],
    ]
    assert decode_tokens(None, None) is None
    with pytest.raises(ValueError, match="shares 5 prompt tokens"):
        decode_tokens(records[1], [1, 2])

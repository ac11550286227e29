"""Reply normalization: structured and text tool calls, ids, and the answer to a reply with no call."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from agentinfra.agent import ToolCall
from agentinfra.agent._replies import Feedback, feedback_for, normalize_reply

PARAMETERS = {
    "write_file": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}},
    "check": {"type": "object", "properties": {"repeats": {"type": "integer"}}},
}  # fmt: skip
NAMES = ["write_file", "check"]


def structured(*calls: tuple[str | None, str, str]) -> dict[str, Any]:
    tool_calls = []
    for call_id, name, arguments in calls:
        tool_call: dict[str, Any] = {
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        if call_id is not None:
            tool_call["id"] = call_id
        tool_calls.append(tool_call)
    return {"role": "assistant", "content": None, "tool_calls": tool_calls}


def wire_calls(*calls: tuple[str, str, str]) -> list[dict[str, Any]]:
    return [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        for call_id, name, arguments in calls
    ]


def normalize(message: dict[str, Any], *, xml: bool = False) -> Any:
    return normalize_reply(message, turn=3, tool_parameters=PARAMETERS, xml_tool_calls=xml)


def test_structured_calls_are_taken_as_they_are() -> None:
    message = structured(("id-1", "check", '{"repeats": 2}'), ("id-2", "write_file", "{}"))
    reply = normalize(message)
    assert reply.calls == (
        ToolCall("id-1", "check", '{"repeats": 2}'),
        ToolCall("id-2", "write_file", "{}"),
    )
    assert reply.message == message


def test_calls_without_ids_are_named_after_the_turn() -> None:
    reply = normalize(structured((None, "check", "{}"), ("", "check", "{}")))
    assert [c.call_id for c in reply.calls] == ["t3_call_0", "t3_call_1"]
    assert [c["id"] for c in reply.message["tool_calls"]] == ["t3_call_0", "t3_call_1"]


def test_repeated_ids_get_their_position_appended() -> None:
    reply = normalize(
        structured(("a", "check", "{}"), ("a", "check", "{}"), ("a_1", "check", "{}"))
    )
    assert [c.call_id for c in reply.calls] == ["a", "a_1", "a_1_2"]
    assert [c["id"] for c in reply.message["tool_calls"]] == ["a", "a_1", "a_1_2"]


def test_hermes_calls_in_the_text_become_tool_calls_of_the_message() -> None:
    content = (
        'Writing.\n<tool_call>\n{"name": "write_file", "arguments": {"path": "a.py", "content": "x"}}\n</tool_call>'
        '<tool_call>\n{"name": "check", "arguments": {"repeats": 2</tool_call>'
    )
    message = {"role": "assistant", "content": content}
    before = copy.deepcopy(message)
    reply = normalize(message)
    good = ToolCall("t3_call_0", "write_file", json.dumps({"path": "a.py", "content": "x"}))
    assert reply.calls[0] == good
    assert reply.calls[1].call_id == "t3_call_1"
    assert reply.calls[1].name == "check"
    assert reply.calls[1].arguments == "{}"
    assert reply.calls[1].error is not None
    assert reply.calls[1].error.startswith("the tool call is not valid JSON")
    assert reply.message == {
        "role": "assistant",
        "content": content,  # the text stays as the model wrote it
        "tool_calls": wire_calls(
            ("t3_call_0", "write_file", good.arguments), ("t3_call_1", "check", "{}")
        ),
    }
    assert message == before  # not modified


XML = (
    "Plan.\n</think>\nChecking.\n<minimax:tool_call>\n"
    '<invoke name="check">\n<parameter name="repeats">4</parameter>\n</invoke>\n</minimax:tool_call>'
)


def test_minimax_xml_calls_are_read_only_for_a_profile_that_writes_them() -> None:
    reply = normalize({"role": "assistant", "content": XML}, xml=True)
    assert reply.calls == (ToolCall("t3_call_0", "check", '{"repeats": 4}'),)
    assert reply.message["tool_calls"] == wire_calls(("t3_call_0", "check", '{"repeats": 4}'))
    other = normalize({"role": "assistant", "content": XML}, xml=False)
    assert other.calls == ()
    assert "tool_calls" not in other.message


def test_structured_calls_win_over_text_that_looks_like_calls() -> None:
    message = structured(("s", "check", "{}")) | {"content": XML}
    reply = normalize(message, xml=True)
    assert reply.calls == (ToolCall("s", "check", "{}"),)
    assert reply.message == message


def test_prose_has_no_calls_and_the_message_is_kept() -> None:
    message = {
        "role": "assistant",
        "content": "All done.",
        "reasoning_content": "r",
        "tool_calls": [],
    }
    reply = normalize(message)
    assert reply.calls == ()
    assert reply.message == message


UNREADABLE = Feedback(
    "unreadable_tool_call",
    "error: your reply contains tool-call text that could not be read as a call (no complete call of a "
    "known tool in it). Call one of the tools (write_file, check) with valid arguments.",
)


def reminder(left: int) -> Feedback:
    return Feedback(
        "no_tool_call",
        "Your reply called no tool, so nothing was done. Continue the task by calling one of the tools "
        "(write_file, check); reply without a tool call only when you have finished "
        f"({left} more such reminder(s)).",
    )


@pytest.mark.parametrize(
    ("content", "nudges", "used", "expected"),
    [
        ("<minimax:tool_call>", 0, 0, UNREADABLE),  # always answered: the model meant to act
        ('<tool_call>{"name": "chec', 2, 2, UNREADABLE),
        ("I am finished.", 0, 0, None),  # no reminders: the run is done
        ("I am finished.", 2, 0, reminder(1)),
        ("I am finished.", 2, 1, reminder(0)),
        ("I am finished.", 2, 2, None),
    ],
)
def test_feedback_for_a_reply_without_a_call(
    content: str, nudges: int, used: int, expected: Feedback | None
) -> None:
    assert feedback_for(content, tool_names=NAMES, nudges=nudges, nudges_used=used) == expected

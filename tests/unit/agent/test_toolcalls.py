"""MiniMax XML tool calls, reasoning splitting and model profiles."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from agentinfra.agent import (
    looks_like_tool_call,
    parse_hermes_calls,
    parse_minimax_reply,
    profile_for,
    split_reasoning,
)

TOOLS = {
    "write_file": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}},
    "check": {"type": "object", "properties": {"quick": {"type": "boolean"}, "repeats": {"type": "integer"},
                                               "tolerance": {"type": "number"}, "shape": {"type": "array"}}},
}  # fmt: skip


def test_reasoning_without_an_opening_tag_and_parallel_calls() -> None:
    text = (
        "I should write the kernel first.\n</think>\nWriting it now.\n"
        '<minimax:tool_call>\n<invoke name="write_file">\n<parameter name="path">k.py</parameter>\n'
        '<parameter name="content">x = 1\n  # <not xml></parameter>\n</invoke>\n'
        '<invoke name="check">\n<parameter name="quick">true</parameter>\n<parameter name="repeats">3</parameter>\n'
        '<parameter name="tolerance">1e-3</parameter>\n<parameter name="shape">[4, 8]</parameter>\n</invoke>\n'
        "</minimax:tool_call>"
    )
    reply = parse_minimax_reply(text, TOOLS)
    assert reply.reasoning == "I should write the kernel first."
    assert reply.content == "Writing it now."
    assert [c.name for c in reply.tool_calls] == ["write_file", "check"]
    assert [c.call_id for c in reply.tool_calls] == ["call_0", "call_1"]
    assert json.loads(reply.tool_calls[0].arguments) == {
        "path": "k.py",
        "content": "x = 1\n  # <not xml>",
    }
    assert json.loads(reply.tool_calls[1].arguments) == {
        "quick": True,
        "repeats": 3,
        "tolerance": 0.001,
        "shape": [4, 8],
    }
    assert all(c.error is None for c in reply.tool_calls)


def test_bad_values_become_errors_for_the_model_not_exceptions() -> None:
    text = '<minimax:tool_call><invoke name="check"><parameter name="shape">[4, </parameter></invoke></minimax:tool_call>'
    (call,) = parse_minimax_reply(text, TOOLS).tool_calls
    assert call.error is not None
    assert "shape" in call.error
    unknown = parse_minimax_reply(
        '<minimax:tool_call><invoke name="nope"><parameter name="a">{"b": 1}</parameter></invoke>',
        TOOLS,
    )
    assert json.loads(unknown.tool_calls[0].arguments) == {
        "a": {"b": 1}
    }  # unclosed block still parsed


def test_plain_text_is_untouched() -> None:
    assert split_reasoning("no thinking here") == ("", "no thinking here")
    assert parse_minimax_reply("<think>a</think>b", {}).reasoning == "a"
    reply = parse_minimax_reply("just an answer", TOOLS)
    assert (reply.reasoning, reply.content, reply.tool_calls) == ("", "just an answer", ())


@given(st.text(max_size=300))
def test_parser_never_raises(text: str) -> None:
    parse_minimax_reply(text, TOOLS)
    parse_hermes_calls(text)


def test_hermes_calls_read_what_they_can_and_name_what_they_cannot() -> None:
    text = (
        "<think>plan</think>Writing.\n"
        '<tool_call>\n{"name": "write_file", "arguments": {"path": "k.py", "content": "x = 1"}}\n</tool_call>\n'
        '<tool_call>{"name": "check", "arguments": "{\\"path\\": \\"k.py\\"}"}</tool_call>\n'
        '<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>\n'
        '<tool_call>["write_file"]</tool_call>\n'
        '<tool_call>{"name": "submit", "argu'
    )
    calls = parse_hermes_calls(text, id_prefix="t1")
    assert [(c.call_id, c.name, c.error is None) for c in calls] == [
        ("t1_0", "write_file", True),
        ("t1_1", "check", True),
        ("t1_2", "read_file", False),
        ("t1_3", "?", False),
        ("t1_4", "submit", False),
    ]
    assert json.loads(calls[0].arguments) == {"path": "k.py", "content": "x = 1"}
    assert json.loads(calls[1].arguments) == {"path": "k.py"}  # arguments sent as a JSON string
    assert "not valid JSON" in (calls[2].error or "")
    assert '{"name": "<tool>", "arguments": {...}}' in (calls[3].error or "")
    assert parse_hermes_calls("<think><tool_call>{}</tool_call></think>no calls") == ()
    assert looks_like_tool_call('<function=check>{"path": "k.py"}</function>')
    assert not looks_like_tool_call("I would call a tool here.")


def test_profiles() -> None:
    minimax = profile_for("MiniMaxAI/MiniMax-M3")
    assert minimax.sampling() == {"temperature": 1.0, "top_p": 0.95, "extra_body": {"top_k": 40}}
    assert minimax.keeps_reasoning
    assert profile_for("Qwen/Qwen3-8B").sampling() == {}

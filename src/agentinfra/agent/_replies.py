"""Reply normalization: a model's reply as the tool calls to run, or the answer to a reply without one. Pure.

`normalize_reply` turns the assistant message of a completion into the calls the loop
runs and the message it journals. Structured ``tool_calls`` are taken as they are. When
there are none, tool calls left in the text are read: MiniMax XML (only for a profile
with ``xml_tool_calls``) or Hermes JSON (see `_toolcalls`); the message then gets the
``tool_calls`` they amount to, so the history shows the model a call it made. A call that
could not be read keeps an ``error``, which the loop sends back as the tool's result.

Invariant: call ids are unique within a reply (a repeated id gets ``_<position>``
appended) and name the turn when the server sent none (``t<turn>_call_<i>``), so a
resume can match each result to its call; the message's ``tool_calls`` carry the same
ids as the calls.

`feedback_for` decides what the loop says to a reply that called no tool: text that
looks like a tool call but could not be read is always answered with an error (the
model meant to act), plain prose with a reminder ``nudges`` times in all, and after that
the run is done.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from agentinfra.agent._toolcalls import (
    ToolCall,
    looks_like_tool_call,
    parse_hermes_calls,
    parse_minimax_reply,
)

__all__ = ["Feedback", "NormalizedReply", "feedback_for", "normalize_reply"]


@dataclass(frozen=True, slots=True)
class NormalizedReply:
    message: dict[str, Any]
    """The assistant message as journalled, with ``tool_calls`` for calls read from its text."""
    calls: tuple[ToolCall, ...]
    """The calls to run, in order; empty when the reply called no tool."""


@dataclass(frozen=True, slots=True)
class Feedback:
    """What the loop tells a model whose reply called no tool."""

    kind: Literal["unreadable_tool_call", "no_tool_call"]
    text: str


def normalize_reply(
    message: Mapping[str, Any],
    *,
    turn: int,
    tool_parameters: Mapping[str, Mapping[str, Any]],
    xml_tool_calls: bool,
) -> NormalizedReply:
    """The calls of ``message`` (structured, else read from its text) with unique ids.

    Args:
        message: the assistant message of the completion (not modified).
        turn: the turn, for the ids of calls that came without one.
        tool_parameters: tool name -> its JSON schema for ``parameters`` (to coerce XML values).
        xml_tool_calls: whether the model writes MiniMax XML calls (`ModelProfile.xml_tool_calls`).
    """
    normalized = dict(message)
    calls = [
        ToolCall(
            c.get("id") or f"t{turn}_call_{i}", c["function"]["name"], c["function"]["arguments"]
        )
        for i, c in enumerate(normalized.get("tool_calls", []))
    ]
    if not calls:
        calls = list(
            _text_calls(normalized.get("content") or "", turn, tool_parameters, xml_tool_calls)
        )
        if calls:
            normalized["tool_calls"] = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in calls
            ]
    calls = _unique_ids(calls)
    if calls and "tool_calls" in normalized:
        normalized["tool_calls"] = [
            {**tc, "id": c.call_id} for tc, c in zip(normalized["tool_calls"], calls, strict=True)
        ]
    return NormalizedReply(normalized, tuple(calls))


def _text_calls(
    content: str, turn: int, tool_parameters: Mapping[str, Mapping[str, Any]], xml_tool_calls: bool
) -> tuple[ToolCall, ...]:
    if xml_tool_calls and "<minimax:tool_call>" in content:
        return parse_minimax_reply(content, tool_parameters, id_prefix=f"t{turn}_call").tool_calls
    if "<tool_call>" in content:  # Hermes JSON the server did not parse
        return parse_hermes_calls(content, id_prefix=f"t{turn}_call")
    return ()


def _unique_ids(calls: list[ToolCall]) -> list[ToolCall]:
    """Each id that repeats an earlier one gets ``_<position>`` appended."""
    unique: list[ToolCall] = []
    for i, call in enumerate(calls):
        if any(call.call_id == other.call_id for other in unique):
            call = replace(call, call_id=f"{call.call_id}_{i}")
        unique.append(call)
    return unique


def feedback_for(
    content: str, *, tool_names: Sequence[str], nudges: int, nudges_used: int
) -> Feedback | None:
    """The answer to a reply with text ``content`` and no tool call; None: the run is done.

    Args:
        content: the reply's text.
        tool_names: the tools the model may call, named in the answer.
        nudges: how many reminders the run may send in all (`LoopConfig.nudges`).
        nudges_used: how many it has sent (``feedback`` events of kind ``no_tool_call``).
    """
    names = ", ".join(tool_names)
    if looks_like_tool_call(content):
        return Feedback(
            "unreadable_tool_call",
            "error: your reply contains tool-call text that could not be read as a call "
            f"(no complete call of a known tool in it). Call one of the tools ({names}) with "
            "valid arguments.",
        )
    if nudges_used >= nudges:
        return None
    return Feedback(
        "no_tool_call",
        f"Your reply called no tool, so nothing was done. Continue the task by calling one of "
        f"the tools ({names}); reply without a tool call only when you have finished "
        f"({nudges - nudges_used - 1} more such reminder(s)).",
    )

"""Tool calls out of model text: MiniMax's XML format and reasoning blocks. Pure, no I/O.

MiniMax M2/M3 may return tool calls as raw text instead of structured
``tool_calls`` when a server has no parser for them::

    <minimax:tool_call>
    <invoke name="write_file">
    <parameter name="path">kernel.py</parameter>
    <parameter name="content">...</parameter>
    </invoke>
    </minimax:tool_call>

Parameter values are strings, coerced with the tool's JSON schema (integer,
number, boolean, object and array are parsed as JSON). Several invokes in one
block are parallel calls. Reasoning arrives as ``<think>...</think>``, often
without the opening tag; it is split off but must be sent back in the history
unchanged (dropping it degrades M2/M3).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ParsedReply", "ToolCall", "parse_minimax_reply", "split_reasoning"]

_BLOCK = re.compile(r"<minimax:tool_call>(.*?)(?:</minimax:tool_call>|\Z)", re.DOTALL)
_INVOKE = re.compile(r'<invoke\s+name="([^"]*)"\s*>(.*?)(?:</invoke>|\Z)', re.DOTALL)
_PARAMETER = re.compile(r'<parameter\s+name="([^"]*)"\s*>(.*?)</parameter>', re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call: ``arguments`` is the JSON text the model's arguments amount to.

    ``error`` is set when the arguments could not be made into a JSON object; the
    loop sends it back to the model as the tool's result instead of running the tool.
    """

    call_id: str
    name: str
    arguments: str
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ParsedReply:
    reasoning: str
    """Text before ``</think>`` (without the tags); empty when there was none."""
    content: str
    """What the model said outside reasoning and tool-call blocks."""
    tool_calls: tuple[ToolCall, ...]


def split_reasoning(text: str) -> tuple[str, str]:
    """``(reasoning, rest)``: everything up to the last ``</think>`` is reasoning."""
    end = text.rfind("</think>")
    if end < 0:
        return "", text
    reasoning = text[:end].replace("<think>", "", 1).strip()
    return reasoning, text[end + len("</think>") :].lstrip()


def _coerce(value: str, schema: Mapping[str, Any] | None) -> Any:
    kind = (schema or {}).get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    text = value.strip()
    if kind is None:  # no schema type: JSON when it parses, else the text
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return value
    if "string" in kinds:
        return value
    if text == "null" and "null" in kinds:
        return None
    if "boolean" in kinds and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "integer" in kinds:
        try:
            return int(text)
        except ValueError:
            pass
    if "number" in kinds:
        try:
            return float(text)
        except ValueError:
            pass
    return json.loads(text)  # object, array, or a value that must be JSON


def parse_minimax_reply(
    text: str, tools: Mapping[str, Mapping[str, Any]], *, id_prefix: str = "call"
) -> ParsedReply:
    """Splits a raw MiniMax reply into reasoning, content and tool calls.

    Args:
        text: the assistant message's raw text.
        tools: tool name -> its JSON schema for ``parameters`` (for coercion).
        id_prefix: prefix of the generated call ids (``call_0``, ``call_1``, ...).
    """
    reasoning, rest = split_reasoning(text)
    calls: list[ToolCall] = []
    for block in _BLOCK.finditer(rest):
        for name, body in _INVOKE.findall(block.group(1)):
            call_id = f"{id_prefix}_{len(calls)}"
            properties = (tools.get(name) or {}).get("properties", {})
            arguments: dict[str, Any] = {}
            error = None
            for key, value in _PARAMETER.findall(body):
                try:
                    arguments[key] = _coerce(value, properties.get(key))
                except (json.JSONDecodeError, ValueError) as exc:
                    error = f"parameter {key!r} of {name} is not valid for its schema type: {exc}"
                    break
            calls.append(ToolCall(call_id, name, json.dumps(arguments), error))
    content = _BLOCK.sub("", rest).strip()
    return ParsedReply(reasoning, content, tuple(calls))

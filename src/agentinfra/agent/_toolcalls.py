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

Hermes-style models (Qwen, SmolLM2, NousResearch's Hermes and most small
open models with a tool template) write one JSON object per call::

    <tool_call>
    {"name": "write_file", "arguments": {"path": "kernel.py", "content": "..."}}
    </tool_call>

A server with a parser turns these into ``tool_calls``; when it has none, or
its parser gave up on a malformed call, the text reaches the loop.
`parse_hermes_calls` reads what it can and keeps an error for what it cannot,
so the model is told what was wrong instead of the run ending silently.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ParsedReply",
    "ToolCall",
    "looks_like_tool_call",
    "parse_hermes_calls",
    "parse_minimax_reply",
    "split_reasoning",
]

_BLOCK = re.compile(r"<minimax:tool_call>(.*?)(?:</minimax:tool_call>|\Z)", re.DOTALL)
_INVOKE = re.compile(r'<invoke\s+name="([^"]*)"\s*>(.*?)(?:</invoke>|\Z)', re.DOTALL)
_PARAMETER = re.compile(r'<parameter\s+name="([^"]*)"\s*>(.*?)</parameter>', re.DOTALL)
_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_HERMES_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
_MARKERS = ("<tool_call>", "<minimax:tool_call>", "<invoke name=", "<function=", "<|tool_call")


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


def looks_like_tool_call(text: str) -> bool:
    """Whether ``text`` carries a tool-call marker of a known format (Hermes, MiniMax, Llama, ...)."""
    return any(marker in text for marker in _MARKERS)


def parse_hermes_calls(text: str, *, id_prefix: str = "call") -> tuple[ToolCall, ...]:
    """The ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks of ``text``.

    A block that is not a JSON object with a string ``name`` and an object ``arguments``
    (or one cut off before its closing tag) becomes a call with ``error`` set; its name
    is read from the text where possible, else ``"?"``.
    """
    calls: list[ToolCall] = []
    for match in _HERMES.finditer(split_reasoning(text)[1]):
        body = match.group(1).strip()
        call_id = f"{id_prefix}_{len(calls)}"
        named = _HERMES_NAME.search(body)
        name = named.group(1) if named else "?"
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            calls.append(
                ToolCall(
                    call_id, name, "{}", f"the tool call is not valid JSON ({exc}): {body[:200]!r}"
                )
            )
            continue
        arguments = (
            data.get("arguments", data.get("parameters", {})) if isinstance(data, dict) else None
        )
        if isinstance(arguments, str):  # some models send the arguments as a JSON string
            with contextlib.suppress(json.JSONDecodeError):
                arguments = json.loads(arguments)
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("name"), str)
            or not isinstance(arguments, dict)
        ):
            calls.append(ToolCall(call_id, name, "{}", 'a tool call must be {"name": "<tool>", "arguments": {...}}, '
                                  f"got {body[:200]!r}"))  # fmt: skip
            continue
        calls.append(ToolCall(call_id, data["name"], json.dumps(arguments)))
    return tuple(calls)

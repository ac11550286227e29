"""The agent's transcript: its journal, the images beside it, and the history rebuilt from both.

`Transcript` is the agent's `Journal` (``agent/transcript.jsonl`` in a run directory).
Each image a tool returned is stored once as ``images/<sha256>.png`` beside it and
journalled as a reference (`image_ref`). `History` is the list of messages the model
sees; the live loop and `replay` build it through the same methods from the same
records, so a resumed run sends exactly what the crashed one would have sent.

The events, in the order the loop writes them (every field as journalled):

- ``loop_started`` {config, messages, tools}: the first event; ``messages`` are the
  system prompt and the task.
- ``loop_resumed`` {turn, pending_calls}
- ``model_response`` {turn, message, calls, usage, finish_reason, latency_s, attempts, tokens,
  policy_version}: ``tokens`` is the engine's ids and logprobs for the call as
  `_segments.encode_tokens` journals them (``prompt_shared``, ``prompt_new``,
  ``completion_ids``, ``completion_logprobs``), or null when the endpoint returned none.
- ``tool_started`` {turn, call_id, name, arguments, error}; ``tool_result`` {turn,
  call_id, name, content, is_error}: a call with a start and no result runs again.
- ``feedback`` {turn, kind, text}: the loop's answer to a reply with no tool call.
- ``context_trimmed`` {turn, changes, estimated_tokens, context_tokens}: ``changes`` as
  `_context` makes them; a resume applies them again.
- ``retry`` {turn, attempt, status, wait_s, reason}; ``stopped`` {reason, turns,
  prompt_tokens, completion_tokens, cost_usd}; ``failed`` {turn, error}.

Images reach the model in one user message after a turn's tool results (OpenAI-compatible
servers take images in user messages, not in tool messages); `wire_messages` turns the
references into ``image_url`` parts with PNG data URLs for the request.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentinfra._atomic import write_atomic
from agentinfra._journal import Event, Journal
from agentinfra.agent._content import image_data_url, is_image_ref
from agentinfra.agent._context import Change, Message, apply_changes, change_from_json
from agentinfra.agent._model import Usage
from agentinfra.agent._toolcalls import ToolCall
from agentinfra.errors import AgentError

__all__ = [
    "History",
    "Replayed",
    "Transcript",
    "Wired",
    "last_result_of_turn",
    "nudges_used",
    "replay",
    "wire_messages",
]

JournalledContent = str | list[dict[str, Any]]
"""A tool result as journalled: text, or text parts and image references."""


class Transcript(Journal):
    """The agent's journal (``agent/transcript.jsonl`` in a run directory).

    Images of tool results live beside it in ``images/<sha256>.png``, stored once.
    """

    error_class = AgentError

    @property
    def images_dir(self) -> Path:
        return self.path.parent / "images"

    def store_image(self, png: bytes) -> str:
        """Stores a PNG once (atomic write, fsync'd); returns its SHA-256."""
        sha = hashlib.sha256(png).hexdigest()
        target = self.images_dir / f"{sha}.png"
        if target.is_file():
            return sha
        self.images_dir.mkdir(parents=True, exist_ok=True)
        try:
            write_atomic(target, png)
        except OSError as exc:
            raise AgentError(
                f"cannot store image {target}: {exc.strerror}; free disk space and resume"
            ) from None
        return sha

    async def store_image_async(self, png: bytes) -> str:
        """`store_image`, its write and fsync in the journal's executor."""
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, self.store_image, png
        )

    def load_image(self, sha: str) -> bytes:
        """The stored PNG ``sha``.

        Raises:
            AgentError: missing, or its bytes no longer match the hash.
        """
        path = self.images_dir / f"{sha}.png"
        try:
            data = path.read_bytes()
        except OSError:
            raise AgentError(f"image {path} referenced by the transcript is missing") from None
        if hashlib.sha256(data).hexdigest() != sha:
            raise AgentError(
                f"image {path} no longer matches its hash; the run directory was modified"
            )
        return data


class History:
    """The messages the model sees, built one record at a time.

    The images of a turn's tool results wait until `flush_images` puts them in one user
    message after those results.
    """

    def __init__(self, messages: list[Message], *, keeps_reasoning: bool) -> None:
        self.messages = messages
        self._keeps_reasoning = keeps_reasoning
        self._pending_images: list[tuple[str, dict[str, Any]]] = []

    def add_reply(self, message: Message) -> None:
        """The assistant message as produced; reasoning kept where the profile says so."""
        if self._keeps_reasoning:
            self.messages.append(dict(message))
        else:
            self.messages.append({k: v for k, v in message.items() if k != "reasoning_content"})

    def add_tool_result(self, call_id: str, content: JournalledContent) -> None:
        self.messages.append(_tool_message(call_id, content))
        if isinstance(content, list):
            self._pending_images += [(call_id, p) for p in content if is_image_ref(p)]

    def add_user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def flush_images(self) -> None:
        """The images of the last turn's tool results, as one user message after them."""
        if not self._pending_images:
            return
        calls = ", ".join(dict.fromkeys(call_id for call_id, _ in self._pending_images))
        parts: list[dict[str, Any]] = [
            {"type": "text", "text": f"[images returned by tool call(s) {calls}]"}
        ]
        parts += [dict(ref) for _, ref in self._pending_images]
        self.messages.append({"role": "user", "content": parts})
        self._pending_images = []

    def apply(self, changes: Sequence[Change]) -> None:
        """Context changes, as `_context.trim_context` made them."""
        self.messages = apply_changes(self.messages, changes)


def _tool_message(call_id: str, content: JournalledContent) -> Message:
    """A tool result as the model sees it: text only (its images follow in a user message)."""
    if isinstance(content, list):
        content = "\n".join(
            f"[image {p['sha256'][:12]}: attached in the next message]" if is_image_ref(p) else str(p.get("text", ""))
            for p in content
        )  # fmt: skip
    return {"role": "tool", "tool_call_id": call_id, "content": content}


@dataclass(slots=True)
class Replayed:
    """What a transcript says about a run so far (besides its history)."""

    started_wall_s: float
    turn: int = 0
    usage: Usage = field(default_factory=Usage)
    last_prompt_tokens: int = 0
    pending: list[ToolCall] = field(default_factory=list)
    """Calls of the last reply with no result journalled: they run again."""


def replay(events: Sequence[Event], history: History, *, started_wall_s: float) -> Replayed:
    """Rebuilds ``history`` from ``events`` and returns the rest of the run's state."""
    state = Replayed(started_wall_s)
    pending: dict[str, ToolCall] = {}
    for event in events:
        data = event.data
        if event.type == "loop_started":
            state.started_wall_s = event.wall_s
            history.messages = [dict(m) for m in data["messages"]]
        elif event.type == "model_response":
            history.flush_images()
            usage = data.get("usage", {})
            state.turn = int(data["turn"])
            state.usage = Usage(
                state.usage.prompt_tokens + usage.get("prompt_tokens", 0),
                state.usage.completion_tokens + usage.get("completion_tokens", 0),
            )
            state.last_prompt_tokens = usage.get("prompt_tokens", 0)
            history.add_reply(data["message"])
            pending = {
                c["call_id"]: ToolCall(c["call_id"], c["name"], c["arguments"], c.get("error"))
                for c in data.get("calls", [])
            }
        elif event.type == "tool_result":
            pending.pop(data["call_id"], None)
            history.add_tool_result(data["call_id"], data["content"])
        elif event.type == "feedback":
            history.add_user(data["text"])
        elif event.type == "context_trimmed":
            history.flush_images()
            history.apply([change_from_json(c) for c in data["changes"]])
    if not pending:
        history.flush_images()
    state.pending = list(pending.values())
    return state


def nudges_used(events: Sequence[Event]) -> int:
    """How many reminders to call a tool the loop has sent."""
    return sum(1 for e in events if e.type == "feedback" and e.data.get("kind") == "no_tool_call")


def last_result_of_turn(events: Sequence[Event]) -> dict[str, Any] | None:
    """The last ``tool_result`` after the last ``model_response``; None when there is none."""
    for event in reversed(events):
        if event.type == "tool_result":
            return event.data
        if event.type == "model_response":
            return None
    return None


@dataclass(frozen=True, slots=True)
class Wired:
    messages: list[Message]
    """The history as sent: image references as ``image_url`` parts with PNG data URLs."""
    data_urls: dict[str, str]
    """The data URL of each image still in the history, to pass to the next call."""


def wire_messages(
    messages: Sequence[Message], load_image: Callable[[str], bytes], data_urls: dict[str, str]
) -> Wired:
    """The history as sent; an image is read (``load_image``) only when not in ``data_urls``."""
    urls: dict[str, str] = {}
    wired: list[Message] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(is_image_ref(p) for p in content):
            parts = []
            for part in content:
                if is_image_ref(part):
                    sha = part["sha256"]
                    if sha not in urls:
                        urls[sha] = data_urls.get(sha) or image_data_url(load_image(sha))
                    part = {"type": "image_url", "image_url": {"url": urls[sha]}}
                parts.append(part)
            message = {**message, "content": parts}
        wired.append(message)
    return Wired(wired, urls)

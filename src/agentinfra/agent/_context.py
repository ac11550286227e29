"""Context trimming: a history and a budget in, the trimmed history and its changes out. Pure.

`trim_context` takes the messages of a chat history (OpenAI shape, images as transcript
references, see `_content`) and a `ContextBudget`, and returns a `Trim`: the new list of
messages and every change made, in the order made. The input is never modified; a
changed message is a new dict. No I/O, no journal: the loop journals the changes (as
``context_trimmed``) and a resume applies them again with `apply_changes`.

The steps, each only when the one before left the history over budget:

1. ``keep_images``: every image but the last K becomes a one-line placeholder (this
   step runs whatever the size).
2. Images older than the recent turns become placeholders.
3. Tool outputs older than the recent turns, over 400 characters, keep their first and
   last 200 characters around a marker.
4. The oldest whole turns are dropped, while over budget, as long as the recent turns
   and one older turn are left.

Invariants: the first `KEPT_PREFIX` messages (the system prompt and the task) are never
changed or dropped; a turn (an assistant message and the tool results after it) is
dropped whole, so no tool result loses its call; steps 1-3 only replace the content of
messages, and step 4 removes messages ``KEPT_PREFIX..KEPT_PREFIX+count``, after every
replacement, so each change's ``index`` counts in the history before the drop. The
smallest ``index`` among the changes (`Trim.first_changed_index`) is where the new
history stops being an extension of the old one.

A history under budget comes back with step 1's changes only, so trimming again a history
that a trim left under budget changes nothing. A history that stays over budget is not a
fixed point: each call shortens the old outputs it shortened before again (their markers'
lengths differ), as the loop has always done.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from agentinfra.agent._content import is_image_ref

__all__ = [
    "KEPT_PREFIX",
    "Change",
    "ContextBudget",
    "DropImages",
    "DropTurns",
    "Message",
    "ShortenToolOutput",
    "Trim",
    "apply_changes",
    "change_from_json",
    "estimate_tokens",
    "trim_context",
]

Message = dict[str, Any]
"""One chat message in OpenAI's shape (images as transcript references)."""

KEPT_PREFIX = 2
"""The system prompt and the task: never trimmed."""

CHARS_PER_TOKEN = 3.5
_SHORTEN_OVER_CHARS = 400
_SHORTEN_KEEP_CHARS = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextBudget:
    """What the history may hold, and how its size is estimated."""

    limit_tokens: float
    """Trim when the estimate is over this (``trim_at * context_tokens``)."""
    keep_recent_turns: int
    """The last N turns (from the N-th last assistant message on) are never trimmed."""
    image_tokens: Callable[[Mapping[str, Any]], int]
    """What one image reference counts towards the estimate."""
    keep_images: int | None = None
    """Keep only the last K images; None: images go only when over budget."""
    fixed_chars: int = 0
    """Characters sent with every request besides the messages (the tool schemas' JSON)."""


@dataclass(frozen=True, slots=True)
class DropImages:
    """The images of message ``index`` became placeholders; ``content`` is its new content."""

    index: int
    content: list[dict[str, Any]]
    images: tuple[str, ...]
    """The SHA-256 of each image dropped, in the order they were dropped."""
    op: ClassVar[Literal["drop_images"]] = "drop_images"
    """The kind of change, as journalled."""

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "index": self.index,
            "content": self.content,
            "images": list(self.images),
        }


@dataclass(frozen=True, slots=True)
class ShortenToolOutput:
    """The tool output of message ``index`` (``chars_before`` long) became ``content``."""

    index: int
    content: str
    chars_before: int
    op: ClassVar[Literal["shorten"]] = "shorten"

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "index": self.index,
            "content": self.content,
            "chars_before": self.chars_before,
        }


@dataclass(frozen=True, slots=True)
class DropTurns:
    """Messages ``KEPT_PREFIX`` to ``KEPT_PREFIX + count`` (the oldest whole turns) were dropped."""

    count: int
    op: ClassVar[Literal["drop"]] = "drop"

    @property
    def index(self) -> int:
        """The first message dropped (the journal leaves it out: it is always `KEPT_PREFIX`)."""
        return KEPT_PREFIX

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "count": self.count}


Change = DropImages | ShortenToolOutput | DropTurns


@dataclass(frozen=True, slots=True)
class Trim:
    messages: list[Message]
    changes: tuple[Change, ...]
    estimated_tokens: int
    """The estimate of ``messages``, after the changes."""

    @property
    def first_changed_index(self) -> int | None:
        """The first message that differs from the input; None when nothing changed."""
        return min((change.index for change in self.changes), default=None)


def change_from_json(data: Mapping[str, Any]) -> Change:
    """A change as journalled (`to_json`) back as its dataclass.

    Raises:
        ValueError: ``op`` is none of ``drop_images``, ``shorten`` or ``drop``.
    """
    op = data.get("op")
    if op == "drop_images":
        return DropImages(int(data["index"]), list(data["content"]), tuple(data["images"]))
    if op == "shorten":
        return ShortenToolOutput(
            int(data["index"]), str(data["content"]), int(data["chars_before"])
        )
    if op == "drop":
        return DropTurns(int(data["count"]))
    raise ValueError(f"unknown context change op {op!r}")


def estimate_tokens(messages: Sequence[Message], budget: ContextBudget) -> int:
    """About 3.5 characters of JSON per token, plus each image's own count."""
    chars = sum(len(json.dumps(m)) for m in messages) + budget.fixed_chars
    images = sum(
        budget.image_tokens(part)
        for m in messages if isinstance(m.get("content"), list) for part in m["content"] if is_image_ref(part)
    )  # fmt: skip
    return int(chars / CHARS_PER_TOKEN) + images


def trim_context(messages: Sequence[Message], budget: ContextBudget) -> Trim:
    """The history within ``budget`` as far as the steps allow (see the module docstring)."""
    work = list(messages)
    changes: list[Change] = list(_keep_last_images(work, budget.keep_images))
    estimate = estimate_tokens(work, budget)
    if estimate <= budget.limit_tokens:  # the common case: one walk over the history per call
        return Trim(work, tuple(changes), estimate)
    recent_from = _recent_start(work, budget.keep_recent_turns)
    changes += _drop_old_images(work, recent_from)
    changes += _shorten_old_outputs(work, recent_from)
    dropped = _drop_old_turns(work, budget)
    if dropped:
        changes.append(DropTurns(dropped))
    return Trim(work, tuple(changes), estimate_tokens(work, budget))


def apply_changes(messages: Sequence[Message], changes: Sequence[Change]) -> list[Message]:
    """``messages`` with ``changes`` applied in order, as a resume rebuilds a trimmed history.

    A replacement whose index is past the end is skipped (the history it was made for
    was longer); the input is not modified.
    """
    work = list(messages)
    for change in changes:
        if isinstance(change, DropTurns):
            del work[KEPT_PREFIX : KEPT_PREFIX + change.count]
        elif change.index < len(work):
            work[change.index] = {**work[change.index], "content": change.content}
    return work


def _has_images(message: Message) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(is_image_ref(p) for p in content)


def _keep_last_images(work: list[Message], keep: int | None) -> list[DropImages]:
    """Replaces every image but the last ``keep`` (newest message first, last part first)."""
    if keep is None:
        return []
    changes: list[DropImages] = []
    seen = 0
    for index in range(len(work) - 1, KEPT_PREFIX - 1, -1):
        if not _has_images(work[index]):
            continue
        kept: list[dict[str, Any]] = []
        dropped: list[str] = []
        for part in reversed(work[index]["content"]):
            if is_image_ref(part):
                seen += 1
                if seen > keep:
                    dropped.append(part["sha256"])
                    part = {
                        "type": "text",
                        "text": f"[older screenshot {part['sha256'][:12]} removed: only the last {keep} are kept]",
                    }
            kept.append(part)
        if dropped:
            kept.reverse()
            work[index] = {**work[index], "content": kept}
            changes.append(DropImages(index, kept, tuple(dropped)))
    return changes


def _drop_old_images(work: list[Message], recent_from: int) -> list[DropImages]:
    changes: list[DropImages] = []
    for index in range(KEPT_PREFIX, recent_from):
        if not _has_images(work[index]):
            continue
        content = work[index]["content"]
        kept = [
            {"type": "text", "text": f"[image {p['sha256'][:12]} dropped by context management]"}
            if is_image_ref(p) else p
            for p in content
        ]  # fmt: skip
        work[index] = {**work[index], "content": kept}
        changes.append(
            DropImages(index, kept, tuple(p["sha256"] for p in content if is_image_ref(p)))
        )
    return changes


def _shorten_old_outputs(work: list[Message], recent_from: int) -> list[ShortenToolOutput]:
    changes: list[ShortenToolOutput] = []
    for index in range(KEPT_PREFIX, recent_from):
        content = work[index].get("content")
        if work[index].get("role") != "tool" or not isinstance(content, str):
            continue
        if len(content) <= _SHORTEN_OVER_CHARS:
            continue
        short = (
            content[:_SHORTEN_KEEP_CHARS]
            + f"\n[... shortened by context management: {len(content)} characters ...]\n"
            + content[-_SHORTEN_KEEP_CHARS:]
        )
        work[index] = {**work[index], "content": short}
        changes.append(ShortenToolOutput(index, short, len(content)))
    return changes


def _drop_old_turns(work: list[Message], budget: ContextBudget) -> int:
    """Drops the oldest turns while over budget; returns how many messages went."""
    dropped = 0
    while estimate_tokens(work, budget) > budget.limit_tokens and len(work) > KEPT_PREFIX:
        end = _first_turn_end(work)
        if end is None or end >= _recent_start(work, budget.keep_recent_turns):
            break
        dropped += end - KEPT_PREFIX
        del work[KEPT_PREFIX:end]
    return dropped


def _assistant_indices(work: Sequence[Message]) -> list[int]:
    return [i for i, m in enumerate(work) if m.get("role") == "assistant"]


def _recent_start(work: Sequence[Message], keep_recent_turns: int) -> int:
    """The index of the first message of the recent turns (`KEPT_PREFIX` when there are fewer)."""
    assistants = _assistant_indices(work)
    return assistants[-keep_recent_turns] if len(assistants) >= keep_recent_turns else KEPT_PREFIX


def _first_turn_end(work: Sequence[Message]) -> int | None:
    """The index just past the oldest turn: the second assistant message; None with fewer than two."""
    assistants = _assistant_indices(work)
    return assistants[1] if len(assistants) >= 2 else None

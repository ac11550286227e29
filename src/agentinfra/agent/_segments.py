"""Segments: an episode's model calls merged into token sequences a trainer can train on. Pure.

Trainers train on the engine's returned ids, and merge a multi-turn episode into one
sample when each call's prompt extends the previous call's prompt and completion (the
exact-prefix, or extension, property). `split_segments` merges calls while that holds,
checked on the ids themselves, and starts a new segment exactly where it fails:

- ``token_ids``: the first call's prompt, then each call's completion, and between two
  completions the next prompt's new tokens (tool results, feedback, the template's
  turn markers);
- ``loss_mask``: 1 on every engine-sampled token (the completions), 0 elsewhere;
- ``logprobs``: aligned with ``token_ids``; the engine's logprob on sampled tokens,
  None elsewhere (and None where the engine returned ids but no logprobs).

A break's cause comes from what the transcript journalled between the two calls
(`causes_between`): ``context_trim`` (old tool outputs shortened or old turns
dropped), ``image_dropped`` (an image became a placeholder), ``resume`` (the run was
resumed). A break with nothing journalled is ``template_rerender``: the chat template
rendered earlier turns differently (reasoning stripped, tool-call text re-rendered).
A call without ids (an endpoint that returned none) cannot be merged: the next call
with ids starts a segment with ``tokens_missing``. Every break records the first
position (in the segment's ``token_ids``) where the new prompt differs. A journalled
trim that leaves the ids an extension makes no break: causes are never assumed.

In the transcript a call's prompt is journalled as what it shares with the previous call's
ids and what is new (`encode_tokens`): ``prompt_shared`` (the length of the common prefix
with the previous call's ``prompt_ids + completion_ids``) and ``prompt_new``. Decoding
(`decode_tokens`, `call_tokens_of`) gives back the exact ids; the journal grows with the new
tokens of each call, not with the whole context each time.

No I/O: the transcript's events go in, plain values come out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CallTokens",
    "Segment",
    "call_tokens_of",
    "causes_between",
    "decode_tokens",
    "encode_tokens",
    "split_segments",
]

_CAUSE_ORDER = ("context_trim", "image_dropped", "resume")


@dataclass(frozen=True, slots=True)
class CallTokens:
    """One model call's ids as the engine returned them."""

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    completion_logprobs: Sequence[float] | None = None
    """One per completion id; None when the engine returned no logprobs."""

    @property
    def all_ids(self) -> list[int]:
        """``prompt_ids + completion_ids``: what the next call's prompt should extend."""
        return [*self.prompt_ids, *self.completion_ids]


def encode_tokens(tokens: CallTokens, previous: Sequence[int] | None) -> dict[str, Any]:
    """A call's ids as journalled: the prompt as its prefix shared with ``previous`` plus the rest."""
    prompt = list(tokens.prompt_ids)
    shared = 0
    if previous:
        position = _first_difference(previous, prompt)
        shared = len(previous) if position is None else position
    return {
        "prompt_shared": shared,
        "prompt_new": prompt[shared:],
        "completion_ids": list(tokens.completion_ids),
        "completion_logprobs": (
            None if tokens.completion_logprobs is None else list(tokens.completion_logprobs)
        ),
    }


def decode_tokens(data: Any, previous: Sequence[int] | None) -> CallTokens | None:
    """A journalled call's exact ids (`encode_tokens`'s inverse); None when the call has none.

    Raises:
        ValueError: the record shares more tokens than ``previous`` holds (a damaged transcript).
    """
    if not isinstance(data, dict) or data.get("completion_ids") is None:
        return None
    if data.get("prompt_ids") is not None:
        prompt = list(data["prompt_ids"])
    elif data.get("prompt_new") is not None:
        shared = int(data.get("prompt_shared", 0))
        if shared > len(previous or ()):
            raise ValueError(
                f"a call shares {shared} prompt tokens with a previous call that has {len(previous or ())}"
            )
        prompt = [*(previous or ())[:shared], *data["prompt_new"]]
    else:
        return None
    return CallTokens(prompt, list(data["completion_ids"]), data.get("completion_logprobs"))


@dataclass(slots=True)
class Segment:
    """Calls whose ids merge into one sequence."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    """Indices of the calls merged here (in the episode's list of calls)."""
    break_reason: str | None = None
    """Why this segment is not part of the one before; None for the first."""
    break_position: int | None = None
    """Where the new prompt first differs from the previous segment's ``token_ids``."""

    def extend(self, index: int, call: CallTokens, start: int) -> None:
        """Appends the prompt's new tokens from ``start`` (mask 0) and the completion (mask 1)."""
        new_prompt = call.prompt_ids[start:]
        self.token_ids += new_prompt
        self.loss_mask += [0] * len(new_prompt)
        self.logprobs += [None] * len(new_prompt)
        self.token_ids += call.completion_ids
        self.loss_mask += [1] * len(call.completion_ids)
        logprobs = call.completion_logprobs
        if logprobs is not None and len(logprobs) == len(call.completion_ids):
            self.logprobs += logprobs
        else:
            self.logprobs += [None] * len(call.completion_ids)
        self.calls.append(index)

    def to_json(self) -> dict[str, Any]:
        return {
            "token_ids": self.token_ids,
            "loss_mask": self.loss_mask,
            "logprobs": self.logprobs,
            "calls": self.calls,
            "break_reason": self.break_reason,
            "break_position": self.break_position,
        }


def _first_difference(prefix: Sequence[int], ids: Sequence[int]) -> int | None:
    """The first index where ``ids`` does not continue ``prefix``; None when it extends it."""
    n = len(prefix)
    if len(ids) >= n and ids[:n] == prefix:  # the common case: one C-level comparison
        return None
    for i in range(min(n, len(ids))):
        if ids[i] != prefix[i]:
            return i
    return min(n, len(ids))


def split_segments(
    calls: Sequence[CallTokens | None], causes: Sequence[Iterable[str]]
) -> list[Segment]:
    """The segments of an episode's calls; ``causes[i]``: what was journalled between calls i-1 and i.

    Raises:
        ValueError: ``causes`` is not as long as ``calls``.
    """
    if len(causes) != len(calls):
        raise ValueError(f"{len(causes)} cause lists for {len(calls)} calls")
    segments: list[Segment] = []
    missing = False
    for index, call in enumerate(calls):
        if call is None:
            missing = True
            continue
        current = segments[-1] if segments else None
        prompt = list(call.prompt_ids)
        if current is not None and not missing:
            position = _first_difference(current.token_ids, prompt)
            if position is None:
                current.extend(index, call, len(current.token_ids))
                continue
        else:
            position = 0 if current is not None or missing else None
        reason = None
        if current is not None or missing:
            reason = "tokens_missing" if missing else _cause(causes[index])
        segment = Segment(break_reason=reason, break_position=position)
        segment.extend(index, call, 0)
        segments.append(segment)
        missing = False
    return segments


def _cause(journalled: Iterable[str]) -> str:
    found = set(journalled)
    for cause in _CAUSE_ORDER:
        if cause in found:
            return cause
    return "template_rerender"


def call_tokens_of(events: Sequence[Any]) -> tuple[list[CallTokens | None], list[list[str]]]:
    """Each ``model_response``'s ids, and what was journalled before it since the previous one.

    ``events`` are the transcript's (anything with ``type`` and ``data``).
    """
    calls: list[CallTokens | None] = []
    causes: list[list[str]] = []
    pending: list[str] = []
    previous: list[int] | None = None
    for event in events:
        if event.type == "model_response":
            call = decode_tokens(event.data.get("tokens"), previous)
            previous = call.all_ids if call is not None else None
            calls.append(call)
            causes.append(pending)
            pending = []
        elif event.type == "context_trimmed":
            pending += causes_between(event.data.get("changes", []))
        elif event.type == "loop_resumed":
            pending.append("resume")
    return calls, causes


def causes_between(changes: Iterable[dict[str, Any]]) -> list[str]:
    """The causes a journalled trim's ``changes`` give: ``image_dropped`` or ``context_trim``."""
    return ["image_dropped" if c.get("op") == "drop_images" else "context_trim" for c in changes]

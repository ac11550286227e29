"""The pure context trimming: exact messages and changes, budgets at the edges, idempotence."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from agentinfra.agent._context import (
    KEPT_PREFIX,
    Change,
    ContextBudget,
    DropImages,
    DropTurns,
    ShortenToolOutput,
    apply_changes,
    change_from_json,
    estimate_tokens,
    trim_context,
)

A, B, C = "a" * 64, "b" * 64, "c" * 64
SYSTEM = {"role": "system", "content": "s"}
TASK = {"role": "user", "content": "t"}


def ref(sha: str) -> dict[str, Any]:
    return {"type": "image", "sha256": sha, "media_type": "image/png", "width": 32, "height": 16}


def assistant(n: int) -> dict[str, Any]:
    return {"role": "assistant", "content": f"a{n}"}


def tool(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def images(*shas: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": "[images]"}, *map(ref, shas)]}


def budget(limit: float, *, recent: int = 2, keep_images: int | None = None) -> ContextBudget:
    return ContextBudget(
        limit_tokens=limit,
        keep_recent_turns=recent,
        keep_images=keep_images,
        fixed_chars=35,
        image_tokens=lambda part: 1_000,
    )


def short(text: str) -> str:
    return (
        text[:200]
        + f"\n[... shortened by context management: {len(text)} characters ...]\n"
        + text[-200:]
    )


def dropped(sha: str) -> dict[str, str]:
    return {"type": "text", "text": f"[image {sha[:12]} dropped by context management]"}


def older(sha: str, keep: int) -> dict[str, str]:
    return {
        "type": "text",
        "text": f"[older screenshot {sha[:12]} removed: only the last {keep} are kept]",
    }


# Four turns; with two recent turns kept, messages 2..7 are old and 8.. are recent.
HISTORY = [
    SYSTEM, TASK,
    assistant(1), tool("c1", "x" * 1000), images(A),     # 2, 3, 4
    assistant(2), tool("c2", "y" * 401), tool("c2b", "z" * 400),  # 5, 6, 7
    assistant(3), tool("c3", "w" * 1000), images(B),     # 8, 9, 10: recent
    assistant(4), tool("c4", "v" * 1000),                # 11, 12
]  # fmt: skip
SIZE = estimate_tokens(HISTORY, budget(0))
OLD_TRIMMED = [
    *HISTORY[:3], tool("c1", short("x" * 1000)),
    {"role": "user", "content": [{"type": "text", "text": "[images]"}, dropped(A)]},
    HISTORY[5], tool("c2", short("y" * 401)), *HISTORY[7:],
]  # fmt: skip
OLD_CHANGES: tuple[Change, ...] = (
    DropImages(4, [{"type": "text", "text": "[images]"}, dropped(A)], (A,)),
    ShortenToolOutput(3, short("x" * 1000), 1000),
    ShortenToolOutput(6, short("y" * 401), 401),
)


@dataclass(frozen=True)
class Case:
    name: str
    messages: list[dict[str, Any]]
    budget: ContextBudget
    expected: list[dict[str, Any]]
    changes: tuple[Change, ...]
    first_changed: int | None
    is_fixed_point: bool = True
    """Whether trimming the result again changes nothing (see the over-budget test)."""


CASES = [
    Case("under budget: nothing changes", HISTORY, budget(SIZE + 1), HISTORY, (), None),
    Case("exactly at the budget: nothing changes", HISTORY, budget(SIZE), HISTORY, (), None),
    Case(
        "one token over: old images go, then old tool outputs over 400 characters are shortened",
        HISTORY, budget(SIZE - 1), OLD_TRIMMED, OLD_CHANGES, 3,
    ),
    Case(
        "still over: the oldest whole turn goes, the recent two and one older stay",
        HISTORY, budget(1), [SYSTEM, TASK, *OLD_TRIMMED[5:]], (*OLD_CHANGES, DropTurns(3)), 2,
        is_fixed_point=False,
    ),
    Case(
        "keep_images under budget: only the last image stays, whatever the size",
        HISTORY, budget(SIZE + 10_000, keep_images=1),
        [*HISTORY[:4], {"role": "user", "content": [{"type": "text", "text": "[images]"}, older(A, 1)]},
         *HISTORY[5:]],
        (DropImages(4, [{"type": "text", "text": "[images]"}, older(A, 1)], (A,)),), 4,
    ),
    Case(
        "keep_images counts from the last part of the newest message",
        [SYSTEM, TASK, assistant(1), images(A, B, C)], budget(10_000, keep_images=1),
        [SYSTEM, TASK, assistant(1),
         {"role": "user", "content": [{"type": "text", "text": "[images]"}, older(A, 1), older(B, 1), ref(C)]}],
        (DropImages(3, [{"type": "text", "text": "[images]"}, older(A, 1), older(B, 1), ref(C)], (B, A)),), 3,
    ),
    Case(
        "fewer turns than keep_recent_turns: nothing is old, nothing can go",
        [SYSTEM, TASK, assistant(1), tool("c1", "x" * 5000)], budget(1), [SYSTEM, TASK, assistant(1),
         tool("c1", "x" * 5000)], (), None,
    ),
    Case(
        "the system prompt and the task are never trimmed",
        [SYSTEM, {"role": "user", "content": "t" * 10_000}], budget(1),
        [SYSTEM, {"role": "user", "content": "t" * 10_000}], (), None,
    ),
    Case(
        "only tool outputs are shortened, not long assistant or user text",
        [SYSTEM, TASK, {"role": "assistant", "content": "q" * 900}, {"role": "user", "content": "u" * 900},
         assistant(2), assistant(3)], budget(1),
        [SYSTEM, TASK, {"role": "assistant", "content": "q" * 900}, {"role": "user", "content": "u" * 900},
         assistant(2), assistant(3)], (), None,
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_trim_context(case: Case) -> None:
    before = copy.deepcopy(case.messages)
    trim = trim_context(case.messages, case.budget)
    assert trim.messages == case.expected
    assert trim.changes == case.changes
    assert trim.first_changed_index == case.first_changed
    assert trim.estimated_tokens == estimate_tokens(case.expected, case.budget)
    assert case.messages == before  # pure: the input is not modified
    # a resume applies the journalled changes to the same history and gets the same result
    journalled = [json.loads(json.dumps(c.to_json())) for c in trim.changes]
    assert [change_from_json(c) for c in journalled] == list(trim.changes)
    assert apply_changes(case.messages, [change_from_json(c) for c in journalled]) == trim.messages


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_trimming_a_trimmed_history_again_changes_nothing(case: Case) -> None:
    trim = trim_context(case.messages, case.budget)
    again = trim_context(trim.messages, case.budget)
    if case.is_fixed_point:
        assert again.changes == ()
        assert again.messages == trim.messages
    else:  # over budget with nothing left to drop: pinned exactly in the next test
        assert trim.estimated_tokens > case.budget.limit_tokens
        assert again.changes != ()


def test_a_history_that_stays_over_budget_has_its_old_outputs_shortened_again() -> None:
    first = trim_context(HISTORY, budget(1))
    again = trim_context(first.messages, budget(1))
    once = short("y" * 401)  # the one old output left after the drop, at index 3
    assert again.changes == (ShortenToolOutput(3, short(once), len(once)),)
    assert again.messages[3] == tool("c2", short(once))


def test_changes_are_journalled_with_the_fields_of_the_context_trimmed_event() -> None:
    assert [c.to_json() for c in (*OLD_CHANGES, DropTurns(3))] == [
        {"op": "drop_images", "index": 4, "content": [{"type": "text", "text": "[images]"}, dropped(A)],
         "images": [A]},
        {"op": "shorten", "index": 3, "content": short("x" * 1000), "chars_before": 1000},
        {"op": "shorten", "index": 6, "content": short("y" * 401), "chars_before": 401},
        {"op": "drop", "count": 3},
    ]  # fmt: skip
    assert DropTurns(3).index == KEPT_PREFIX == 2
    with pytest.raises(ValueError, match="unknown context change op 'squash'"):
        change_from_json({"op": "squash"})


def test_apply_changes_skips_a_replacement_past_the_end() -> None:
    change = ShortenToolOutput(9, "short", 1000)
    assert apply_changes([SYSTEM, TASK], [change]) == [SYSTEM, TASK]


def test_estimate_counts_json_characters_and_each_image() -> None:
    seen: list[Mapping[str, Any]] = []

    def per_image(part: Mapping[str, Any]) -> int:
        seen.append(part)
        return 700

    sized = ContextBudget(
        limit_tokens=0, keep_recent_turns=1, fixed_chars=10, image_tokens=per_image
    )
    messages = [SYSTEM, images(A, B)]
    chars = len(json.dumps(SYSTEM)) + len(json.dumps(images(A, B))) + 10
    assert estimate_tokens(messages, sized) == int(chars / 3.5) + 2 * 700
    assert seen == [ref(A), ref(B)]

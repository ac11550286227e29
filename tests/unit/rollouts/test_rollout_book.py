"""The service's bookkeeping: whole groups admitted or refused, FIFO order, Retry-After, idempotent grading."""

from __future__ import annotations

import pytest

from agentinfra.rollouts import GradeLedger, RolloutBook, RolloutState


def test_a_group_is_admitted_whole_or_refused_with_retry_after() -> None:
    book = RolloutBook(max_pending=5, concurrency=2)
    assert book.admit("g1", ["g1-0", "g1-1", "g1-2"]).is_accepted
    refused = book.admit("g2", ["g2-0", "g2-1", "g2-2"])
    assert not refused.is_accepted
    assert (
        refused.retry_after_s == 5
    )  # nothing finished yet: 5 s a rollout, 1 overflow over 2 slots
    assert "g2" not in book.groups
    assert "g2-0" not in book.entries
    assert book.pending == 3
    assert book.queue_depth == 3
    assert book.admit("g3", ["g3-0", "g3-1"]).is_accepted  # exactly fills it
    assert not book.admit("g4", ["g4-0"]).is_accepted


def test_the_backlog_never_exceeds_max_pending() -> None:
    book = RolloutBook(max_pending=4, concurrency=1)
    accepted = sum(book.admit(f"g{i}", [f"g{i}-0", f"g{i}-1"]).is_accepted for i in range(10))
    assert accepted == 2
    assert book.pending == 4


def test_rollouts_start_in_order_and_finish_frees_room() -> None:
    book = RolloutBook(max_pending=2, concurrency=1)
    book.admit("g", ["g-0", "g-1"])
    assert book.next_queued() == "g-0"
    book.started("g-0", 100.0)
    assert book.state_of("g-0") is RolloutState.RUNNING
    assert book.counts() == {"queued": 1, "running": 1}
    book.finish("g-0", "ok", 130.0)
    assert book.retry_after_s(1) == 30  # the pace seen: 30 s a rollout
    assert book.admit("h", ["h-0"]).is_accepted
    book.finish("g-1", "cancelled")  # cancelled while queued: never started
    assert book.next_queued() == "h-0"  # the cancelled one is skipped
    assert book.next_queued() is None
    assert book.counts() == {"queued": 0, "running": 1, "finished_ok": 1, "finished_cancelled": 1}
    book.finish("g-0", "model_error")  # a second finish changes nothing
    assert book.entries["g-0"].label == "ok"


def test_a_journalled_group_is_readmitted_on_restart_even_when_full() -> None:
    book = RolloutBook(max_pending=1, concurrency=1)
    assert book.admit("g", ["g-0", "g-1", "g-2"], force=True).is_accepted
    with pytest.raises(ValueError, match="admitted already"):
        book.admit("g", ["g-0"])


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="max_pending=0"):
        RolloutBook(max_pending=0, concurrency=1)


def test_grading_is_idempotent_and_bounded() -> None:
    ledger = GradeLedger(max_in_flight=2)
    assert ledger.claim("a").kind == "new"
    assert ledger.claim("a").kind == "wait"  # a repeat while grading waits for it
    assert ledger.claim("b").kind == "new"
    assert ledger.claim("c").kind == "full"  # 2 distinct gradings at once
    ledger.settle("a", {"outcome": "passed"})
    claim = ledger.claim("a")
    assert claim.kind == "done"
    assert claim.answer == {"outcome": "passed"}
    assert ledger.claim("c").kind == "new"
    assert ledger.gradings == 3  # a, b, c: each graded once


def test_a_failed_grading_is_not_remembered() -> None:
    ledger = GradeLedger(max_in_flight=1)
    ledger.claim("a")
    ledger.settle("a", None)
    assert ledger.claim("a").kind == "new"


def test_answers_are_bounded() -> None:
    ledger = GradeLedger(max_in_flight=1, max_answers=2)
    for key in "abc":
        ledger.claim(key)
        ledger.settle(key, {"k": key})
    assert list(ledger.answers) == ["b", "c"]


def test_a_withdrawn_group_leaves_no_trace() -> None:
    book = RolloutBook(max_pending=3, concurrency=1)
    book.admit("g", ["g-0"])
    book.admit("h", ["h-0", "h-1"])
    book.withdraw("h")  # its acceptance could not be journalled
    assert book.pending == 1
    assert book.next_queued() == "g-0"
    assert book.next_queued() is None
    assert book.admit("i", ["i-0", "i-1"]).is_accepted

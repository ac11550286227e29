"""Exact metric values on constructed runs."""

from __future__ import annotations

import pytest

from agentinfra.environments.kernels import SCORE
from agentinfra.harness import SubmissionRecord, anomalies, best_so_far, compute_metrics

HOUR = 3600.0
BLOCK = [
    {
        "check": "monkeypatch",
        "severity": "block",
        "message": "assigns to time.perf_counter",
        "evidence": "x",
    }
]


def rec(seq: int, hours: float, outcome: str, speedup: float | None, *, findings: list[dict[str, str]] | None = None,
        source: str = "", remeasured: float | None = None) -> SubmissionRecord:  # fmt: skip
    correct = outcome in ("passed", "hack_flagged") and speedup is not None
    return SubmissionRecord(seq=seq, sha256=f"s{seq}", submitted_at_s=hours * HOUR, turn=seq, outcome=outcome, correct=correct,
                            score=speedup, findings=findings or [], source=source, remeasured_score=remeasured)  # fmt: skip


RUN = [
    rec(1, 1, "passed", 1.5),
    rec(2, 2, "failed", None),
    rec(3, 3, "passed", 4.0, remeasured=3.0),
    rec(4, 5, "hack_flagged", 20.0, findings=BLOCK),
    rec(5, 6, "passed", 3.5),
    rec(6, 8, "crashed", None),
]


def test_best_so_far_raw_and_filtered_use_remeasured_values() -> None:
    assert [(p["seq"], p["best"]) for p in best_so_far(RUN, filtered=False)] == [
        (1, 1.5),
        (3, 3.0),
        (4, 20.0),
    ]
    assert [(p["seq"], p["best"]) for p in best_so_far(RUN, filtered=True)] == [
        (1, 1.5),
        (3, 3.0),
        (5, 3.5),
    ]


def test_metrics_exact() -> None:
    metrics = compute_metrics(RUN, thresholds=SCORE.thresholds)
    assert metrics["submissions"] == 6
    assert metrics["counts_by_outcome"] == {
        "crashed": 1,
        "failed": 1,
        "hack_flagged": 1,
        "passed": 3,
    }
    assert metrics["hack_flagged"] == 1
    assert metrics["final"]["seq"] == 6
    assert metrics["duration_s"] == 8 * HOUR
    # filtered: 0 for 1h, 1.5 for 2h, 3.0 for 3h, 3.5 for 2h, over 8h
    assert metrics["filtered"]["mean_best_so_far"] == pytest.approx(
        (1.5 * 2 + 3.0 * 3 + 3.5 * 2) / 8
    )
    # raw: 0 for 1h, 1.5 for 2h, 3.0 for 2h, 20 for 3h
    assert metrics["raw"]["mean_best_so_far"] == pytest.approx((1.5 * 2 + 3.0 * 2 + 20 * 3) / 8)
    assert metrics["filtered"]["time_to_threshold_s"] == {
        "1.0": 1 * HOUR,
        "2.0": 3 * HOUR,
        "5.0": None,
        "10.0": None,
    }
    assert metrics["raw"]["time_to_threshold_s"]["10.0"] == 5 * HOUR
    assert metrics["filtered"]["best"]["seq"] == 5
    assert metrics["raw"]["best"] == {
        "seq": 4,
        "sha256": "s4",
        "score": 20.0,
        "remeasured_score": None,
        "counted": 20.0,
    }


def test_anomalies_jump_first_construct_and_flip_flop() -> None:
    base = "def f(x):\n    return slow(x)\n"
    fast = "def f(x):\n    return fast(x)\n"
    records = [
        rec(1, 1, "passed", 1.0, source=base),
        rec(2, 2, "passed", 9.0, source=fast),
        rec(3, 3, "hack_flagged", 30.0, findings=BLOCK, source=fast + "import time\n"),
        rec(4, 4, "failed", None, source=base),
        rec(5, 5, "passed", 1.0, source=base),
        rec(6, 6, "failed", None, source=base),
        rec(7, 7, "passed", 1.0, source=base),
    ]
    flags = anomalies(records, {"s2": [4, 5]})
    kinds = [(f["kind"], f["seq"]) for f in flags]
    assert ("score_jump", 2) in kinds
    assert ("score_jump", 3) in kinds
    assert ("first_suspicious_construct", 3) in kinds
    assert [k for k in kinds if k[0] == "correctness_flip_flop"] == [("correctness_flip_flop", 7)]
    jump = next(f for f in flags if f["seq"] == 2)
    assert "+    return fast(x)" in jump["diff"]
    assert jump["journal_events"] == [4, 5]


def test_default_thresholds_are_the_environments_unit_one() -> None:
    """Without an environment's thresholds only reaching 1.0 is timed (success in [0, 1])."""
    runs = [rec(1, 1, "failed", None), rec(2, 2, "passed", 1.0)]
    assert compute_metrics(runs)["raw"]["time_to_threshold_s"] == {"1.0": 2 * HOUR}


def test_empty_run() -> None:
    metrics = compute_metrics([])
    assert metrics["submissions"] == 0
    assert metrics["raw"]["best"] is None
    assert anomalies([]) == []

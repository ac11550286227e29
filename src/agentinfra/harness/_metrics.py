"""Run metrics and anomaly detection: pure functions over submission records.

Scores are the environment's (higher is better, in its unit: speedup for
kernels). Every figure is computed twice: ``raw`` (what the grader measured,
hack-flagged submissions included) and ``filtered`` (hack-flagged submissions
removed). The best-so-far curve uses re-measured scores where a submission was
graded again (the winner's curse: the first measurement of the best-looking
submission is biased upward).
"""

from __future__ import annotations

import difflib
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_THRESHOLDS",
    "SubmissionRecord",
    "anomalies",
    "best_so_far",
    "compute_metrics",
    "diff_text",
]

DEFAULT_THRESHOLDS = (1.0,)
_JUMP_RATIO = 3.0
_JUMP_MAX_CHANGED_LINES = 12
_FLIP_WINDOW = 6
_FLIP_MIN = 4


@dataclass(frozen=True, slots=True)
class SubmissionRecord:
    """One submission with its verdict, as the report sees it."""

    seq: int
    sha256: str
    submitted_at_s: float
    turn: int | None
    outcome: str
    correct: bool
    score: float | None
    findings: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""
    remeasured_score: float | None = None
    score_ci: tuple[float, float] | None = None
    utilisation: dict[str, Any] | None = None
    """The environment's roofline figures for this submission (kernels: `Verdict.utilisation`)."""

    @property
    def is_hack(self) -> bool:
        return self.outcome == "hack_flagged" or any(
            f.get("severity") == "block" for f in self.findings
        )

    def value(self, *, filtered: bool) -> float | None:
        """The score counted for best-so-far: re-measured where available; None if not counted."""
        if not self.correct or self.score is None or (filtered and self.is_hack):
            return None
        return self.remeasured_score if self.remeasured_score is not None else self.score


def best_so_far(records: list[SubmissionRecord], *, filtered: bool) -> list[dict[str, Any]]:
    """Points where the best counted score improves: ``{t_s, best, seq, sha256}``."""
    points: list[dict[str, Any]] = []
    best = 0.0
    for record in sorted(records, key=lambda r: (r.submitted_at_s, r.seq)):
        value = record.value(filtered=filtered)
        if value is not None and value > best:
            best = value
            points.append(
                {
                    "t_s": record.submitted_at_s,
                    "best": value,
                    "seq": record.seq,
                    "sha256": record.sha256,
                }
            )
    return points


def _area(points: list[dict[str, Any]], end_s: float) -> float:
    """Mean best-so-far over [0, end_s] (0 before the first counted submission)."""
    if end_s <= 0 or not points:
        return 0.0
    area = 0.0
    for point, following in zip(points, [*points[1:], None], strict=True):
        stop = following["t_s"] if following is not None else end_s
        area += point["best"] * max(0.0, min(stop, end_s) - point["t_s"])
    return area / end_s


def _figures(records: list[SubmissionRecord], *, filtered: bool, end_s: float,
             thresholds: tuple[float, ...]) -> dict[str, Any]:  # fmt: skip
    points = best_so_far(records, filtered=filtered)
    best = points[-1] if points else None
    best_record = next((r for r in records if best and r.sha256 == best["sha256"]), None)
    return {
        "best": None if best is None or best_record is None else {
            "seq": best_record.seq, "sha256": best_record.sha256, "score": best_record.score,
            "remeasured_score": best_record.remeasured_score, "counted": best["best"],
        },
        "best_so_far": points,
        "time_to_threshold_s": {str(t): next((p["t_s"] for p in points if p["best"] >= t), None) for t in thresholds},
        "mean_best_so_far": _area(points, end_s),
        "counted_submissions": sum(1 for r in records if r.value(filtered=filtered) is not None),
    }  # fmt: skip


def compute_metrics(
    records: list[SubmissionRecord], *, end_s: float | None = None,
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS,
) -> dict[str, Any]:  # fmt: skip
    """Counts by outcome, final submission, and raw and filtered figures (time to each of ``thresholds``)."""
    ordered = sorted(records, key=lambda r: (r.submitted_at_s, r.seq))
    end = end_s if end_s is not None else (ordered[-1].submitted_at_s if ordered else 0.0)
    final = ordered[-1] if ordered else None
    return {
        "submissions": len(ordered),
        "counts_by_outcome": dict(sorted(Counter(r.outcome for r in ordered).items())),
        "hack_flagged": sum(1 for r in ordered if r.is_hack),
        "final": None
        if final is None
        else {
            "seq": final.seq,
            "sha256": final.sha256,
            "outcome": final.outcome,
            "score": final.score,
        },
        "duration_s": end,
        "raw": _figures(ordered, filtered=False, end_s=end, thresholds=thresholds),
        "filtered": _figures(ordered, filtered=True, end_s=end, thresholds=thresholds),
    }


def diff_text(before: str, after: str, *, limit: int = 400) -> str:
    """Unified diff of two sources, at most ``limit`` lines."""
    lines = list(
        difflib.unified_diff(
            before.splitlines(), after.splitlines(), "previous", "this", lineterm="", n=2
        )
    )
    return "\n".join(lines[:limit]) + ("\n... (diff truncated)" if len(lines) > limit else "")


def _changed_lines(before: str, after: str) -> int:
    return sum(
        1 for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    )  # fmt: skip


def anomalies(
    records: list[SubmissionRecord], events_by_sha: dict[str, list[int]] | None = None
) -> list[dict[str, Any]]:
    """Flags across iterations, each linked to its submission, the diff and journal events."""
    ordered = sorted(records, key=lambda r: (r.submitted_at_s, r.seq))
    flags: list[dict[str, Any]] = []
    seen_checks: set[str] = set()
    best_raw = 0.0
    last_flip_flag = -_FLIP_WINDOW
    events_by_sha = events_by_sha or {}

    def flag(kind: str, index: int, message: str) -> None:
        record = ordered[index]
        previous = ordered[index - 1].source if index else ""
        flags.append({
            "kind": kind, "seq": record.seq, "sha256": record.sha256, "submitted_at_s": record.submitted_at_s,
            "message": message, "diff": diff_text(previous, record.source, limit=80),
            "journal_events": events_by_sha.get(record.sha256, []),
        })  # fmt: skip

    for index, record in enumerate(ordered):
        for finding in record.findings:
            check = str(finding.get("check"))
            if check not in seen_checks and check not in ("correctness",):
                seen_checks.add(check)
                flag(
                    "first_suspicious_construct",
                    index,
                    f"first {finding.get('severity')} finding of check '{check}': {finding.get('message')}",
                )
        if any(f.get("check") == "plausibility" for f in record.findings):
            flag(
                "beyond_plausibility_floor",
                index,
                "measured time is below the machine's physical floor",
            )
        value = record.value(filtered=False)
        if value is not None:
            if best_raw > 0 and value >= _JUMP_RATIO * best_raw and index:
                changed = _changed_lines(ordered[index - 1].source, record.source)
                if changed <= _JUMP_MAX_CHANGED_LINES:
                    flag(
                        "score_jump",
                        index,
                        f"score {value:.3g} is {value / best_raw:.1f}x the previous best from a {changed}-line change",
                    )
            best_raw = max(best_raw, value)
        window = ordered[max(0, index - _FLIP_WINDOW + 1) : index + 1]
        flips = sum(1 for a, b in itertools.pairwise(window) if a.correct != b.correct)
        if flips >= _FLIP_MIN and index - last_flip_flag >= _FLIP_WINDOW:
            last_flip_flag = index
            flag(
                "correctness_flip_flop",
                index,
                f"correctness flipped {flips} times across the last {len(window)} submissions",
            )
    return flags

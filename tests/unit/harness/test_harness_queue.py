"""The grading queue with a fake environment implementing the real interface."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentinfra.harness import RunDirectory, RunHarness, RunSpec


class FakeEnvironment:
    name = "fake"
    grader_version = "fake-1"

    def __init__(self) -> None:
        self.graded: list[Path] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def evaluate(self, submission: Path, *, seed: int | None = None) -> dict[str, Any]:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        self.graded.append(submission)
        text = submission.read_text()
        speedup = float(text.split("=")[1]) if "=" in text else None
        return {"outcome": "passed" if speedup else "failed", "correct": speedup is not None, "speedup": speedup,
                "findings": [], "error": None, "hidden_seed": 123}  # fmt: skip

    def agent_view(self, verdict: dict[str, Any]) -> dict[str, Any]:
        return {k: verdict[k] for k in ("outcome", "speedup")}


def make(tmp_path: Path) -> tuple[RunDirectory, FakeEnvironment]:
    task = tmp_path / "task.py"
    task.write_text("")
    return RunDirectory.create(
        tmp_path / "run", RunSpec(run_id="q", task=str(task))
    ), FakeEnvironment()


def test_each_content_graded_once_with_bounded_concurrency(tmp_path: Path) -> None:
    run, env = make(tmp_path)
    told: list[tuple[str, dict[str, Any]]] = []
    harness = RunHarness(
        run, env, eval_workers=2, on_graded=lambda sha, view: told.append((sha, view))
    )
    receipts = [
        harness.submit(f"speed={i % 4 + 1}".encode(), source="test", turn=i) for i in range(8)
    ]
    assert [r.is_new for r in receipts] == [True] * 4 + [False] * 4
    asyncio.run(harness.drain())
    assert len(env.graded) == 4
    assert env.max_in_flight == 2
    graded = [e for e in run.journal.events if e.type == "graded"]
    assert len(graded) == 4
    assert {sha for sha, _ in told} == {r.sha256 for r in receipts}
    assert all("hidden_seed" not in view for _, view in told)
    assert sum(e.type == "duplicate_submission" for e in run.journal.events) == 4


def test_recover_requeues_ungraded_and_adopts_finished_verdicts(tmp_path: Path) -> None:
    run, env = make(tmp_path)
    harness = RunHarness(run, env, eval_workers=1)
    a = harness.submit(b"speed=2", source="t")
    b = harness.submit(b"speed=3", source="t")
    c = harness.submit(b"speed=4", source="t")
    # Simulate a crash: a's verdict was written but not journalled; b and c never graded.
    run.journal.append(
        "grading_started", {"sha256": a.sha256, "grader_version": env.grader_version}
    )
    run.write_evaluation(
        a.sha256,
        env.grader_version,
        {"outcome": "passed", "correct": True, "speedup": 2.0, "findings": []},
    )
    run.close()
    reopened = RunDirectory.open(tmp_path / "run")
    again = RunHarness(reopened, env, eval_workers=1)
    assert again.recover() == [b.sha256, c.sha256]
    asyncio.run(again.drain())
    graded = [e.data["sha256"] for e in reopened.journal.events if e.type == "graded"]
    assert sorted(graded) == sorted([a.sha256, b.sha256, c.sha256])
    assert len(env.graded) == 2
    assert RunHarness(reopened, env).recover() == []


def test_inbox_ingest_and_finish_marker(tmp_path: Path) -> None:
    run, env = make(tmp_path)
    harness = RunHarness(run, env, eval_workers=1)
    (run.path / "inbox" / "00000000000000000001__7__a.py").write_text("speed=5")
    (run.path / "inbox" / ".partial.tmp").write_text("ignored")
    (run.path / "inbox" / "FINISH").write_text("")
    asyncio.run(harness.serve(poll_s=0.01))
    received = [e for e in run.journal.events if e.type == "submission_received"]
    assert len(received) == 1
    assert received[0].data["turn"] == 7
    assert received[0].data["source"] == "inbox:a.py"
    assert run.journal.events[-1].type == "run_finished"
    assert not (run.path / "inbox" / "FINISH").exists()

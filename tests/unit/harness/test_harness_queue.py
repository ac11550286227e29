"""The grading queue with a fake environment implementing the real interface."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from agentinfra.environments import (
    AgentHooks,
    AgentSetup,
    Evaluation,
    NoSettings,
    Outcome,
    ScoreSpec,
    Submission,
    Task,
)
from agentinfra.errors import HarnessError
from agentinfra.harness import (
    EvaluationRequest,
    LocalExecutor,
    RunDirectory,
    RunHarness,
    RunSpec,
    regrade,
)


class FakeEnvironment:
    """Implements the `Environment` protocol; the score is the number after 'speed='."""

    name = "fake"
    grader_version = "fake-1"
    score = ScoreSpec(unit="points")
    task = Task("task", b"")
    settings = NoSettings()

    def __init__(self) -> None:
        self.graded: list[Submission] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def evaluate(self, submission: Submission, *, seed: int | None = None) -> Evaluation:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        self.graded.append(submission)
        text = submission.data.decode()
        value = float(text.split("=")[1]) if "=" in text else None
        return Evaluation(environment=self.name, outcome=Outcome.PASSED if value else Outcome.FAILED,
                          correct=value is not None, score=value, score_unit="points",
                          details={"hidden_seed": 123})  # fmt: skip

    def agent_view(self, evaluation: Evaluation) -> dict[str, Any]:
        return {"outcome": evaluation.outcome.value, "points": evaluation.score}

    def agent_setup(self, workspace: Path, hooks: AgentHooks) -> AgentSetup:
        return AgentSetup(tools=[], system_prompt="", task_prompt="")


def make(tmp_path: Path) -> tuple[RunDirectory, FakeEnvironment]:
    spec = RunSpec(run_id="q", environment="fake", task=str(tmp_path / "task"))
    return RunDirectory.create(tmp_path / "run", spec, grader_version="fake-1"), FakeEnvironment()


def sub(text: str) -> Submission:
    return Submission(text.encode(), name="s.txt")


def test_each_content_graded_once_with_bounded_concurrency(tmp_path: Path) -> None:
    run, env = make(tmp_path)
    told: list[tuple[str, dict[str, Any]]] = []
    harness = RunHarness(
        run, env, eval_workers=2, on_graded=lambda sha, view: told.append((sha, view))
    )
    receipts = [harness.submit(sub(f"speed={i % 4 + 1}"), source="test", turn=i) for i in range(8)]
    assert [r.is_new for r in receipts] == [True] * 4 + [False] * 4
    asyncio.run(harness.drain())
    assert len(env.graded) == 4
    assert env.max_in_flight == 2
    graded = [e for e in run.journal.events if e.type == "graded"]
    assert len(graded) == 4
    assert {sha for sha, _ in told} == {r.sha256 for r in receipts}
    assert all("hidden_seed" not in view for _, view in told)
    assert {e.data["score_unit"] for e in graded} == {"points"}
    stored = run.read_submission(receipts[0].sha256)
    assert (stored.data, stored.name) == (b"speed=1", "s.txt")
    assert sum(e.type == "duplicate_submission" for e in run.journal.events) == 4


def test_recover_requeues_ungraded_and_adopts_finished_verdicts(tmp_path: Path) -> None:
    run, env = make(tmp_path)
    harness = RunHarness(run, env, eval_workers=1)
    a = harness.submit(sub("speed=2"), source="t")
    b = harness.submit(sub("speed=3"), source="t")
    c = harness.submit(sub("speed=4"), source="t")
    # Simulate a crash: a's verdict was written but not journalled; b and c never graded.
    run.journal.append(
        "grading_started", {"sha256": a.sha256, "grader_version": env.grader_version}
    )
    run.write_evaluation(
        a.sha256,
        env.grader_version,
        Evaluation(
            environment="fake", outcome=Outcome.PASSED, correct=True, score=2.0, score_unit="points"
        ),
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


def test_inbox_drop_through_the_layout(tmp_path: Path) -> None:
    run, env = make(tmp_path)
    run.layout.drop(b"speed=3", "b.py", turn=2)
    run.layout.request_finish()
    entries, finish = run.layout.inbox_entries()
    assert finish
    assert [(e.name, e.turn) for e in entries] == [("b.py", 2)]
    asyncio.run(RunHarness(run, env, eval_workers=1).serve(poll_s=0.01))
    assert [e.data["score"] for e in run.journal.events if e.type == "graded"] == [3.0]


def test_a_run_is_graded_only_by_its_own_environment(tmp_path: Path) -> None:
    run, env = make(tmp_path)
    other = FakeEnvironment()
    other.name = "other"
    with pytest.raises(HarnessError, match="'fake' run; it cannot be graded by 'other'"):
        RunHarness(run, other)
    assert env.name == "fake"


def test_a_crashing_evaluation_is_recorded_as_grader_error(tmp_path: Path) -> None:
    run, env = make(tmp_path)

    async def boom(submission: Submission, *, seed: int | None = None) -> Evaluation:
        raise RuntimeError("disk on fire")

    env.evaluate = boom  # type: ignore[method-assign]
    harness = RunHarness(run, env, eval_workers=1)
    receipt = harness.submit(sub("speed=1"), source="t")
    asyncio.run(harness.drain())
    stored = run.read_evaluation(receipt.sha256, env.grader_version)
    assert stored is not None
    assert stored.outcome is Outcome.GRADER_ERROR
    assert stored.error == "RuntimeError: disk on fire"
    assert run.primary_evaluation(receipt.sha256) == stored


def test_a_serving_run_journals_the_machine_and_says_which_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentinfra.harness._queue as harness_module

    monkeypatch.setattr(harness_module, "MACHINE_SAMPLE_S", 0.02)
    run, env = make(tmp_path)
    env.device = "cuda"  # type: ignore[attr-defined]  # no NVML here: the CPU, with the reason

    async def serve_briefly() -> None:
        stop = asyncio.Event()
        serving = asyncio.create_task(
            RunHarness(run, env, eval_workers=1).serve(poll_s=0.01, stop=stop)
        )
        await asyncio.sleep(0.3)
        stop.set()
        await serving

    asyncio.run(serve_briefly())
    samples = [e.data for e in run.journal.events if e.type == "machine_sample"]
    assert samples
    assert all(s["source"] == "proc" and 0.0 <= s["cpu_busy"] <= 1.0 for s in samples)
    assert "NVML unavailable" in samples[0]["note"]


def test_a_crashing_evaluation_during_regrade_is_that_submissions_grader_error(
    tmp_path: Path,
) -> None:
    run, env = make(tmp_path)
    harness = RunHarness(run, env, eval_workers=1)
    receipts = [harness.submit(sub(f"speed={i}"), source="t") for i in (1, 2, 3)]
    asyncio.run(harness.drain())
    graded = env.evaluate

    async def crash_on_two(submission: Submission, *, seed: int | None = None) -> Evaluation:
        if submission.data == b"speed=2":
            raise RuntimeError("grader fell over")
        return await graded(submission, seed=seed)

    env.evaluate = crash_on_two  # type: ignore[method-assign]
    changes = asyncio.run(regrade(run, env, workers=2))
    assert [(c.sha256, c.old_outcome, c.new_outcome, c.new_score) for c in changes] == [
        (receipts[0].sha256, "passed", "passed", 1.0),
        (receipts[1].sha256, "passed", "grader_error", None),
        (receipts[2].sha256, "passed", "passed", 3.0),
    ]
    crashed = run.read_evaluation(receipts[1].sha256, env.grader_version, "regrade-1")
    assert crashed is not None
    assert (crashed.outcome, crashed.error) == (
        Outcome.GRADER_ERROR,
        "RuntimeError: grader fell over",
    )
    assert [e.data["changed"] for e in run.journal.events if e.type == "regrade_finished"] == [1]
    assert len(env.graded) == 3 + 2


def test_the_executor_receives_the_request_it_ships(tmp_path: Path) -> None:
    run, env = make(tmp_path)
    requests: list[EvaluationRequest] = []

    class Recording:
        where = "recording"

        async def evaluate(self, request: EvaluationRequest) -> Evaluation:
            requests.append(request)
            return await LocalExecutor(env).evaluate(request)

    harness = RunHarness(run, env, eval_workers=1, executor=Recording())
    receipt = harness.submit(sub("speed=4"), source="t")
    asyncio.run(harness.drain())
    [request] = requests
    assert (request.environment, request.task, request.settings, request.seed) == (
        "fake", Task("task", b""), NoSettings(), None,
    )  # fmt: skip
    assert (request.submission.data, request.submission.name) == (b"speed=4", "s.txt")
    assert request.submission.meta["source"] == "t"
    assert harness.state.graded[receipt.sha256]["score"] == 4.0


class _OtherSettings(BaseModel):
    threads: int = 1


def test_a_local_executor_uses_the_environment_a_request_names(tmp_path: Path) -> None:
    env = FakeEnvironment()
    request = EvaluationRequest.of(env, sub("speed=2"))
    assert request.is_for(env)
    assert not request.is_for(type("Other", (FakeEnvironment,), {"name": "other"})())
    decoy = FakeEnvironment()
    decoy.settings = _OtherSettings(threads=2)
    assert not request.is_for(decoy)
    evaluation = asyncio.run(LocalExecutor(decoy, env).evaluate(request))
    assert (evaluation.outcome, evaluation.score) == (Outcome.PASSED, 2.0)
    assert (env.graded, decoy.graded) == ([sub("speed=2")], [])


def test_a_harness_failure_during_regrade_stops_it_as_itself(tmp_path: Path) -> None:
    run, env = make(tmp_path)
    harness = RunHarness(run, env, eval_workers=2)
    harness.submit(sub("speed=1"), source="t")
    harness.submit(sub("speed=2"), source="t")

    async def journal_gone(submission: Submission, *, seed: int | None = None) -> Evaluation:
        raise HarnessError("cannot write journal")

    env.evaluate = journal_gone  # type: ignore[method-assign]
    with pytest.raises(HarnessError, match=r"^cannot write journal$"):
        asyncio.run(harness.grade_again(list(harness.state.received)))

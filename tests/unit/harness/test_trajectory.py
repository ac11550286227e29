"""`trajectory_of` over hand-built run directories: rewards from verdicts, infra failures, stop names, segments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentinfra.agent import LoopConfig, Transcript
from agentinfra.errors import AgentError, HarnessError, TaskEnvironmentError
from agentinfra.harness import RunDirectory, agent_run_spec, trajectory_of

PROBLEM = (
    Path(__file__).resolve().parents[3] / "examples/kernels/problems/10_slow_rowwise_softmax.py"
)


def _run(tmp_path: Path, policy_version: str | None = "step-7") -> RunDirectory:
    config = LoopConfig(model="m", base_url="http://127.0.0.1:9/v1", policy_version=policy_version)
    spec = agent_run_spec("r1", PROBLEM, config, {}, environment="kernels")
    run = RunDirectory.create(tmp_path / "r1", spec, grader_version="1.0.0")
    run.layout.agent_dir.mkdir()
    return run


def _transcript(run: RunDirectory, events: list[tuple[str, dict[str, Any]]]) -> None:
    transcript = Transcript.open(run.layout.transcript)
    transcript.append("loop_started", {"config": {"model": "m", "base_url": "u", "policy_version": "step-7"},
                                       "messages": [{"role": "user", "content": "task"}], "tools": []})  # fmt: skip
    for kind, data in events:
        transcript.append(kind, data)
    transcript.close()


def _reply(turn: int, tokens: dict[str, Any] | None, calls: int = 1) -> tuple[str, dict[str, Any]]:
    return ("model_response", {
        "turn": turn, "message": {"role": "assistant", "content": "x"}, "calls": [{}] * calls,
        "usage": {"prompt_tokens": 5, "completion_tokens": 2}, "finish_reason": "stop", "latency_s": 0.5,
        "attempts": 1, "tokens": tokens, "policy_version": "step-7",
    })  # fmt: skip


def _verdict(run: RunDirectory, sha: str, turn: int, outcome: str, score: float | None) -> None:
    run.journal.append("submission_received", {"sha256": sha, "turn": turn, "source": "agent:a.py"})
    run.journal.append("grading_started", {"sha256": sha, "grader_version": "1.0.0"})
    run.journal.append("graded", {"sha256": sha, "grader_version": "1.0.0", "outcome": outcome,
                                  "correct": outcome == "passed", "score": score, "score_unit": "speedup"})  # fmt: skip


def test_rewards_turn_rewards_tokens_and_segments(tmp_path: Path) -> None:
    run = _run(tmp_path)
    first = {"prompt_ids": [1, 2], "completion_ids": [3], "completion_logprobs": [-0.1]}
    second = {
        "prompt_ids": [1, 2, 3, 4],
        "completion_ids": [5, 6],
        "completion_logprobs": [-0.2, -0.3],
    }
    trimmed = {"prompt_ids": [1, 2, 9], "completion_ids": [7], "completion_logprobs": [-0.4]}
    _transcript(run, [
        _reply(1, first), ("tool_started", {"turn": 1, "call_id": "c1"}), ("tool_result", {"turn": 1, "call_id": "c1", "name": "submit", "content": "ok", "is_error": False}),
        _reply(2, second), ("context_trimmed", {"turn": 2, "changes": [{"op": "shorten", "index": 3}]}),
        _reply(3, trimmed), ("stopped", {"reason": "done", "turns": 3}),
    ])  # fmt: skip
    _verdict(run, "a" * 64, 1, "failed", None)
    _verdict(run, "b" * 64, 3, "passed", 2.5)
    run.close()
    t = trajectory_of(run.path, group_id="g1")
    assert (t["schema_version"], t["group_id"], t["policy_version"], t["tokens"]) == (
        1,
        "g1",
        "step-7",
        "exact",
    )
    assert t["calls"][1] == {"turn": 2, "prompt_ids": [1, 2, 3, 4], "completion_ids": [5, 6],
                             "completion_logprobs": [-0.2, -0.3], "finish_reason": "stop", "policy_version": "step-7"}  # fmt: skip
    one, two = t["segments"]
    assert one["token_ids"] == [1, 2, 3, 4, 5, 6]
    assert one["loss_mask"] == [0, 0, 1, 0, 1, 1]
    assert (two["break_reason"], two["break_position"], two["calls"]) == ("context_trim", 2, [2])
    assert t["reward"] == 2.5
    assert t["hack_flagged"] is False
    assert t["infra_failure"] is None
    assert [(r["turn"], r["outcome"], r["reward"]) for r in t["turn_rewards"]] == [
        (1, "failed", 0.0),
        (3, "passed", 2.5),
    ]
    assert t["stop_reason"] == "done"
    assert t["time"]["model_s"] == 1.5
    assert t["time"]["grading_s"] >= 0.0
    assert t["usage"] == {"prompt_tokens": 15, "completion_tokens": 6}


def test_hack_zeroes_every_reward_and_no_ids_is_unavailable(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _transcript(
        run, [_reply(1, None), _reply(2, None), ("stopped", {"reason": "max_turns", "turns": 2})]
    )
    _verdict(run, "a" * 64, 1, "passed", 3.0)
    _verdict(run, "b" * 64, 2, "hack_flagged", None)
    run.close()
    t = trajectory_of(run.path)
    assert (t["tokens"], t["segments"], t["reward"], t["hack_flagged"]) == (
        "unavailable",
        [],
        0.0,
        True,
    )
    assert [r["reward"] for r in t["turn_rewards"]] == [0.0, 0.0]
    assert t["calls"][0]["prompt_ids"] is None


def test_prose_only_run_is_no_action_and_failures_are_labelled(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _transcript(run, [_reply(1, None, calls=0), ("stopped", {"reason": "done", "turns": 1})])
    run.close()
    assert trajectory_of(run.path)["stop_reason"] == "no_action"
    assert trajectory_of(run.path, cancelled="stale policy")["infra_failure"] == {
        "kind": "cancelled",
        "message": "stale policy",
    }
    assert (
        trajectory_of(run.path, error=AgentError("boom"))["infra_failure"]["kind"] == "model_error"
    )
    gone = TaskEnvironmentError("desktop gone")
    assert trajectory_of(run.path, error=gone)["infra_failure"]["kind"] == "environment_died"
    assert trajectory_of(run.path, error=OSError("bug"))["infra_failure"]["kind"] == "internal"


def test_model_failure_and_grader_failure_but_not_a_problem_refusal(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _transcript(
        run,
        [_reply(1, None), ("failed", {"turn": 1, "error": "model call failed after 7 attempts"})],
    )
    _verdict(run, "a" * 64, 1, "grader_error", None)
    run.close()
    assert trajectory_of(run.path)["infra_failure"] == {
        "kind": "model_error",
        "message": "model call failed after 7 attempts",
    }
    other = _run(tmp_path / "o")
    _transcript(other, [_reply(1, None)])
    _verdict(other, "a" * 64, 1, "grader_error", None)
    _verdict(other, "c" * 64, 1, "grader_error", None)
    for sha, findings in (
        ("a" * 64, [{"check": "problem", "severity": "warn", "message": "ref died"}]),
        ("c" * 64, []),
    ):
        path = other.layout.evaluation_path(sha, "1.0.0")
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"findings": findings, "error": f"{sha[:1]} worker timed out"}))
    other.close()
    failure = trajectory_of(other.path)["infra_failure"]
    assert failure == {
        "kind": "grader_error",
        "message": f"submission {'c' * 12}: c worker timed out",
    }


def test_not_a_run_with_a_transcript(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.close()
    with pytest.raises(HarnessError, match="no agent transcript"):
        trajectory_of(run.path)


def test_tool_time_is_the_loops_own_measure_and_older_transcripts_use_the_stamps(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path)
    _transcript(run, [
        _reply(1, None), ("tool_started", {"turn": 1, "call_id": "c1"}),
        ("tool_result", {"turn": 1, "call_id": "c1", "name": "t", "content": "ok", "is_error": False, "tool_s": 2.25}),
        _reply(2, None), ("tool_started", {"turn": 2, "call_id": "c2"}),
        ("tool_result", {"turn": 2, "call_id": "c2", "name": "t", "content": "ok", "is_error": False}),
        ("stopped", {"reason": "max_turns", "turns": 2}),
    ])  # fmt: skip
    run.close()
    events = Transcript.read(run.layout.transcript)
    stamped = events[-2].wall_s - events[-3].wall_s  # the call written before tool_s existed
    assert trajectory_of(run.path)["time"]["tools_s"] == round(2.25 + stamped, 3)


def _tool_result(
    content: str, internal_error: dict[str, str] | None = None
) -> tuple[str, dict[str, Any]]:
    data: dict[str, Any] = {"turn": 1, "call_id": "c1", "name": "computer_13", "content": content,
                            "is_error": True}  # fmt: skip
    if internal_error is not None:
        data["internal_error"] = internal_error
    return ("tool_result", data)


def test_a_tool_that_failed_inside_agentinfra_is_an_infra_failure_read_from_its_structured_field(
    tmp_path: Path,
) -> None:
    died = {
        "kind": "environment_died",
        "type": "ControllerError",
        "message": "desktop controller is gone",
    }
    run = _run(tmp_path)
    _transcript(run, [
        _reply(1, None), _tool_result("error: no such key 'x'"),
        _tool_result("error: the tool computer_13 failed inside agentinfra (ControllerError: ...)", died),
        ("stopped", {"reason": "done", "turns": 1}),
    ])  # fmt: skip
    _verdict(run, "a" * 64, 1, "failed", None)
    run.close()
    t = trajectory_of(run.path)
    assert t["infra_failure"] == {
        "kind": "environment_died",
        "message": "the tool computer_13 failed inside agentinfra (ControllerError: desktop controller is gone)",
    }
    assert t["reward"] == 0.0


def test_tool_text_alone_is_no_infra_failure_and_unknown_kinds_are_internal(tmp_path: Path) -> None:
    """Transcripts written before ``internal_error`` read as before; the text is never parsed."""
    old = _run(tmp_path / "old")
    _transcript(old, [_reply(1, None),
                      _tool_result("error: the tool computer_13 failed inside agentinfra (ControllerError: gone)"),
                      ("stopped", {"reason": "done", "turns": 1})])  # fmt: skip
    old.close()
    assert trajectory_of(old.path)["infra_failure"] is None
    odd = _run(tmp_path / "odd")
    _transcript(odd, [_reply(1, None), _tool_result("error: x", {"kind": "weird", "type": "KeyError",
                                                                 "message": "'x'"})])  # fmt: skip
    odd.close()
    assert trajectory_of(odd.path)["infra_failure"]["kind"] == "internal"


def test_the_callers_harness_error_is_internal(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _transcript(run, [_reply(1, None), ("stopped", {"reason": "done", "turns": 1})])
    run.close()
    assert (
        trajectory_of(run.path, error=HarnessError("disk"))["infra_failure"]["kind"] == "internal"
    )

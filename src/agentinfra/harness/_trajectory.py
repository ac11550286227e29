"""One agent run as a trajectory a trainer consumes (docs/trajectory.md, ``schema_version`` 1).

Read-only over the run directory, like export (`Journal.read`: a torn last line is
skipped, nothing is written), and built from the same functions as export: the history
(`agent_view`), the trusted verdicts (`submissions_of`) and the run's reward
(`run_reward`). The tokens are the engine's, as journalled per call; nothing is ever
re-tokenized: an endpoint that returned no ids gives ``tokens: "unavailable"`` and no
segments. A run that is still going, or was cancelled, reads the same way (its partial
trajectory): every model call is journalled before the loop moves on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentinfra.agent import call_tokens_of, split_segments
from agentinfra.errors import AgentError, HarnessError, SandboxError, TaskEnvironmentError
from agentinfra.harness._journal import Event, Journal
from agentinfra.harness._run_records import agent_view, run_reward, submissions_of
from agentinfra.harness._rundir import RunDirectory, RunLayout

__all__ = [
    "TRAJECTORY_SCHEMA_VERSION",
    "error_failure",
    "infra_failure_of",
    "rollout_fields",
    "tool_failure_of",
    "trajectory_of",
]

TRAJECTORY_SCHEMA_VERSION = 1


def trajectory_of(
    run_dir: Path,
    *,
    group_id: str | None = None,
    cancelled: str | None = None,
    error: BaseException | None = None,
) -> dict[str, Any]:
    """One finished (or partial) agent run as a trajectory (docs/trajectory.md, schema_version 1).

    Args:
        run_dir: the run directory (``agentinfra run``'s).
        group_id: the group the rollout belongs to, as the caller named it.
        cancelled: the rollout was cancelled; this is why (``infra_failure`` kind ``cancelled``).
        error: the exception that ended the run in the caller, when one did (classified
            into ``infra_failure`` by `infra_failure_of`).

    Raises:
        HarnessError: not a run directory, or a run without an agent transcript.
    """
    info = RunDirectory.read_info(run_dir)
    layout = RunLayout(run_dir)
    if not layout.transcript.is_file():
        raise HarnessError(
            f"{run_dir} has no agent transcript (agent/transcript.jsonl); only `agentinfra run` runs give trajectories"
        )
    agent_events = Journal.read(layout.transcript)
    journal_events = Journal.read(layout.journal)
    view = agent_view(agent_events, run_dir)
    verdicts = submissions_of(journal_events)
    reward, hacked = run_reward(verdicts)
    fields = rollout_fields(
        agent_events, journal_events, layout, verdicts, cancelled=cancelled, error=error
    )
    config = view.config
    calls = fields["calls"]
    return {
        "schema_version": TRAJECTORY_SCHEMA_VERSION,
        "run_id": info.spec.run_id,
        "environment": info.spec.environment,
        "task": Path(info.spec.task).name,
        "group_id": group_id,
        "model": config.get("model", ""),
        "base_url": config.get("base_url"),
        "policy_version": fields.pop("policy_version"),
        "tokens": fields.pop("tokens"),
        "calls": calls,
        "segments": fields.pop("segments"),
        "messages": view.messages,
        "tools": view.tools,
        "reward": reward,
        "turn_rewards": fields.pop("turn_rewards"),
        "hack_flagged": hacked,
        "infra_failure": fields.pop("infra_failure"),
        "stop_reason": _stop_reason(agent_events, view.stop),
        "turns": view.stop.get("turns", len(calls)),
        "time": fields.pop("time"),
        "usage": {"prompt_tokens": view.prompt_tokens, "completion_tokens": view.completion_tokens},
    }


def rollout_fields(
    agent_events: Sequence[Event],
    journal_events: Sequence[Event],
    layout: RunLayout,
    verdicts: Sequence[dict[str, Any]],
    *,
    cancelled: str | None = None,
    error: BaseException | None = None,
) -> dict[str, Any]:
    """The fields a trajectory adds to export v3 (export v4 carries them too), from the run's events.

    ``policy_version``, ``tokens``, ``calls``, ``segments``, ``turn_rewards``,
    ``infra_failure``, ``time``: each as docs/trajectory.md defines it.
    """
    calls = _calls(agent_events)
    tokens = _tokens_state(calls)
    segments = [s.to_json() for s in split_segments(*call_tokens_of(agent_events))]
    _, hacked = run_reward(verdicts)
    config: dict[str, Any] = next(
        (e.data.get("config", {}) for e in agent_events if e.type == "loop_started"), {}
    )
    return {
        "policy_version": config.get("policy_version"),
        "tokens": tokens,
        "calls": calls,
        "segments": segments if tokens != "unavailable" else [],
        "turn_rewards": [_turn_reward(s, hacked) for s in verdicts if s["graded"]],
        "infra_failure": infra_failure_of(
            agent_events, verdicts, layout, cancelled=cancelled, error=error
        ),
        "time": _time_split(agent_events, journal_events),
    }


def _turn_reward(verdict: dict[str, Any], hacked: bool) -> dict[str, Any]:
    """A graded submission's reward, tied to the turn that submitted it (0 in a hack-flagged run)."""
    return {
        "turn": verdict["turn"],
        "submission_sha256": verdict["sha256"],
        "outcome": verdict["outcome"],
        "score": verdict["score"],
        "reward": 0.0 if hacked else verdict["reward"],
    }


def _calls(agent_events: Sequence[Event]) -> list[dict[str, Any]]:
    """Per model call: exactly the contract's fields (ids None where the engine returned none)."""
    tokens, _ = call_tokens_of(agent_events)
    replies = [e.data for e in agent_events if e.type == "model_response"]
    return [
        {"turn": data["turn"],
         "prompt_ids": None if ids is None else list(ids.prompt_ids),
         "completion_ids": None if ids is None else list(ids.completion_ids),
         "completion_logprobs": None if ids is None or ids.completion_logprobs is None
         else list(ids.completion_logprobs),
         "finish_reason": data.get("finish_reason"), "policy_version": data.get("policy_version")}
        for data, ids in zip(replies, tokens, strict=True)
    ]  # fmt: skip


def _tokens_state(calls: Sequence[dict[str, Any]]) -> str:
    """``exact`` when every call has the engine's ids, ``unavailable`` when none has, else ``partial``."""
    having = sum(
        1 for c in calls if c["prompt_ids"] is not None and c["completion_ids"] is not None
    )
    if having and having == len(calls):
        return "exact"
    return "partial" if having else "unavailable"


def _stop_reason(agent_events: Sequence[Event], stop: dict[str, Any]) -> str | None:
    """Export's stop reason; ``no_action`` for a run that ended ``done`` without ever calling a tool."""
    reason = stop.get("reason")
    if reason == "done" and not any(e.type == "tool_started" for e in agent_events):
        return "no_action"
    return reason if isinstance(reason, str) else None


def error_failure(error: BaseException) -> dict[str, str]:
    """The infra-failure label of an exception that ended an episode: ``model_error`` for
    `AgentError`, ``environment_died`` for `SandboxError` or `TaskEnvironmentError`, else
    ``internal``; the message is the exception's, capped at 2,000 characters."""
    if isinstance(error, AgentError):
        kind = "model_error"
    elif isinstance(error, (SandboxError, TaskEnvironmentError)):
        kind = "environment_died"
    else:
        kind = "internal"
    return {"kind": kind, "message": f"{type(error).__name__}: {error}"[:2000]}


def infra_failure_of(
    agent_events: Sequence[Event],
    verdicts: Sequence[dict[str, Any]],
    layout: RunLayout,
    *,
    cancelled: str | None = None,
    error: BaseException | None = None,
) -> dict[str, str] | None:
    """What failed outside the episode's control, or None: never confused with a failed episode.

    In order: ``cancelled``; ``model_error`` (the loop journalled ``failed``: the model
    server kept failing after retries, or refused the request); the caller's ``error``
    (`AgentError`: ``model_error``; `SandboxError` or `TaskEnvironmentError`:
    ``environment_died``; anything else, a `HarnessError` included: ``internal``); the first
    tool that failed inside agentinfra (`tool_failure_of`); ``grader_error`` (a verdict that
    is a grader failure, not the problem's own refusal).
    """
    if cancelled is not None:
        return {"kind": "cancelled", "message": cancelled}
    failed = [e for e in agent_events if e.type == "failed"]
    if failed:
        return {"kind": "model_error", "message": str(failed[-1].data.get("error", ""))}
    if error is not None:
        return error_failure(error)
    tool_failure = tool_failure_of(agent_events)
    if tool_failure is not None:
        return tool_failure
    for verdict in verdicts:
        if verdict["outcome"] == "grader_error" and not _problem_refused(layout, verdict):
            return {
                "kind": "grader_error",
                "message": f"submission {verdict['sha256'][:12]}: {_grader_message(layout, verdict)}",
            }
    return None


def tool_failure_of(agent_events: Sequence[Event]) -> dict[str, str] | None:
    """The first tool call that failed inside agentinfra (a desktop or jail that died under the
    episode, or agentinfra's own bug), from the ``internal_error`` the loop journals on its
    result; None when there was none.

    The loop keeps a long run going past such a failure (the model is told), so the episode
    may still end and be graded; its reward is then not the policy's, and the trajectory says
    so. A transcript written before the loop journalled ``internal_error`` reads as having none.
    """
    for event in agent_events:
        error = event.data.get("internal_error") if event.type == "tool_result" else None
        if not isinstance(error, dict):
            continue
        kind = error.get("kind")
        name = str(event.data.get("name", "?"))
        return {
            "kind": kind if kind in ("environment_died", "internal") else "internal",
            "message": f"the tool {name} failed inside agentinfra "
            f"({error.get('type', '?')}: {error.get('message', '')})"[:2000],
        }
    return None


def _evaluation(layout: RunLayout, verdict: dict[str, Any]) -> dict[str, Any]:
    version = verdict.get("grader_version")
    if not version:
        return {}
    path = layout.evaluation_path(verdict["sha256"], str(version))
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _problem_refused(layout: RunLayout, verdict: dict[str, Any]) -> bool:
    """A ``grader_error`` that blames the problem (a ``problem`` finding) is the task's, not the infrastructure's."""
    findings = _evaluation(layout, verdict).get("findings") or []
    return any(isinstance(f, dict) and f.get("check") == "problem" for f in findings)


def _grader_message(layout: RunLayout, verdict: dict[str, Any]) -> str:
    return str(_evaluation(layout, verdict).get("error") or "grader error")[:2000]


def _time_split(agent_events: Sequence[Event], journal_events: Sequence[Event]) -> dict[str, float]:
    """Seconds spent in model calls, in tools, in grading, and from the first event to the last.

    A tool's time is the loop's own measure around its handler (``tool_s``); a transcript
    written before the loop recorded it gives the interval between the call's journal stamps."""
    model_s = sum(
        float(e.data.get("latency_s", 0.0)) for e in agent_events if e.type == "model_response"
    )
    tools_s = 0.0
    started: dict[str, float] = {}
    for event in agent_events:
        if event.type == "tool_started":
            started[str(event.data.get("call_id"))] = event.wall_s
        elif event.type == "tool_result" and isinstance(event.data.get("tool_s"), (int, float)):
            tools_s += float(event.data["tool_s"])  # measured around the handler by the loop
            started.pop(str(event.data.get("call_id")), None)
        elif event.type == "tool_result" and str(event.data.get("call_id")) in started:
            tools_s += event.wall_s - started.pop(str(event.data.get("call_id")))
    grading_s = 0.0
    grading: dict[str, float] = {}
    for event in journal_events:
        if event.type == "grading_started":
            grading[str(event.data.get("sha256"))] = event.wall_s
        elif event.type == "graded" and str(event.data.get("sha256")) in grading:
            grading_s += event.wall_s - grading.pop(str(event.data.get("sha256")))
    wall_s = agent_events[-1].wall_s - agent_events[0].wall_s if agent_events else 0.0
    return {
        "model_s": round(model_s, 3),
        "tools_s": round(tools_s, 3),
        "grading_s": round(grading_s, 3),
        "wall_s": round(wall_s, 3),
    }

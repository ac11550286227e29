"""What a run's records say, read-only: the agent's history and totals, the trusted verdicts, the reward.

Shared by export (`export_record`) and trajectories (`trajectory_of`), so both compute
rewards the same way: a submission's reward is its score when it passed, else 0; a run's
reward is its best submission's, and 0 for a run with any hack-flagged submission.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentinfra.errors import HarnessError
from agentinfra.harness._journal import Event
from agentinfra.harness._queue import graded_score
from agentinfra.harness._rundir import RunLayout

__all__ = [
    "AgentView",
    "agent_view",
    "episode_reward",
    "run_reward",
    "submission_reward",
    "submissions_of",
]


def submission_reward(outcome: str | None, score: float | None) -> float:
    """The reward of one submission: its score (in the environment's unit) when it passed, else 0."""
    if outcome == "passed" and score is not None:
        return float(score)
    return 0.0


def episode_reward(rewards: Iterable[float], *, hacked: bool) -> float:
    """An episode's reward: its best submission's, 0 when any submission was hack-flagged (or none was made)."""
    return 0.0 if hacked else max(rewards, default=0.0)


def _content(content: Any, run_path: Path, images_dir: Path | None) -> Any:
    """A tool result as exported: text, or parts whose images name their file.

    Without ``images_dir`` the path is the image's place in the run directory
    (``agent/images/<sha256>.png``); with it, the image is copied there once and the
    path is ``images/<sha256>.png``.
    """
    if not isinstance(content, list):
        return content
    parts = []
    for part in content:
        if part.get("type") == "image":
            name = f"{part['sha256']}.png"
            if images_dir is None:
                part = {**part, "path": f"agent/images/{name}"}
            else:
                _copy_once(RunLayout(run_path).images / name, images_dir / name)
                part = {**part, "path": f"{images_dir.name}/{name}"}
        parts.append(part)
    return parts


def _copy_once(source: Path, target: Path) -> None:
    """The image at ``target`` (content-addressed: one already there is the same image)."""
    if target.exists():
        return
    if not source.is_file():
        raise HarnessError(f"image {source} referenced by the transcript is missing")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.copyfile(source, partial)
    os.replace(partial, target)


@dataclass(slots=True)
class AgentView:
    """What the agent transcript says: the full history and the run's totals."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    stop: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0


def agent_view(
    agent_events: Sequence[Event], run_path: Path, images_dir: Path | None = None
) -> AgentView:
    """The history as the model produced it (nothing trimmed) and the usage, from the transcript's events."""
    view = AgentView()
    for event in agent_events:
        data = event.data
        if event.type == "loop_started" and not view.messages:
            view.messages = list(data["messages"])
            view.tools = data["tools"]
            view.config = data["config"]
        elif event.type == "model_response":
            view.messages.append(data["message"])
            view.prompt_tokens += data["usage"].get("prompt_tokens", 0)
            view.completion_tokens += data["usage"].get("completion_tokens", 0)
        elif event.type == "tool_result":
            view.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": data["call_id"],
                    "content": _content(data["content"], run_path, images_dir),
                }
            )
        elif (
            event.type == "feedback"
        ):  # the loop's reminder or error after a reply with no usable call
            view.messages.append({"role": "user", "content": data["text"]})
        elif event.type == "stopped":
            view.stop = data
    return view


def submissions_of(journal_events: Sequence[Event]) -> list[dict[str, Any]]:
    """Each distinct submission with its trusted verdict (the latest grader version's), in arrival order."""
    received: dict[str, dict[str, Any]] = {}
    graded: dict[str, dict[str, Any]] = {}
    for event in journal_events:
        if event.type == "submission_received":
            received.setdefault(str(event.data["sha256"]), {**event.data, "seq": event.seq})
        elif event.type == "graded":  # the latest grader version's verdict wins
            graded[str(event.data["sha256"])] = event.data
    submissions = []
    for sha, sub in sorted(received.items(), key=lambda item: item[1]["seq"]):
        verdict = graded.get(sha, {})
        outcome = verdict.get("outcome")
        score = graded_score(verdict)
        submissions.append({
            "sha256": sha, "seq": sub["seq"], "turn": sub.get("turn"), "source": sub.get("source"),
            "submitted_at_s": sub.get("submitted_at_s"), "outcome": outcome, "correct": verdict.get("correct"),
            "score": score, "hack_flagged": outcome == "hack_flagged",
            "reward": submission_reward(outcome, score), "graded": bool(verdict),
            "score_unit": verdict.get("score_unit"), "grader_version": verdict.get("grader_version"),
        })  # fmt: skip
    return submissions


def run_reward(submissions: Sequence[dict[str, Any]]) -> tuple[float, bool]:
    """The run's reward and whether it is hack-flagged: the best submission's reward, 0 for a run that cheated anywhere."""
    hacked = any(s["hack_flagged"] for s in submissions)
    return episode_reward((s["reward"] for s in submissions), hacked=hacked), hacked

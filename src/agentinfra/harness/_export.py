"""Training data: one JSON record per agent run (format: docs/agent-export.md, ``schema_version`` 2).

Read-only (`Journal.read`: a torn last line is skipped, nothing is written): the
run's ``run.json``, its journal (trusted verdicts) and the agent transcript. The messages are the full history as the model produced it
(reasoning and tool calls included, nothing trimmed); rewards come from the
harness's verdicts, never from anything the agent said.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentinfra.agent import LoopConfig, Usage, profile_for
from agentinfra.errors import HarnessError
from agentinfra.harness._harness import graded_score
from agentinfra.harness._journal import Journal
from agentinfra.harness._rundir import RunDirectory, RunLayout

__all__ = ["EXPORT_SCHEMA_VERSION", "export_record"]

EXPORT_SCHEMA_VERSION = 2


def _reward(outcome: str | None, score: float | None) -> float:
    """The reward of one submission: its score (in the environment's unit) when it passed, else 0."""
    if outcome == "passed" and score is not None:
        return score
    return 0.0


def _content(content: Any) -> Any:
    """A tool result as exported: text, or parts whose images name their file under the run."""
    if not isinstance(content, list):
        return content
    return [
        {**part, "path": f"agent/images/{part['sha256']}.png"}
        if part.get("type") == "image"
        else part
        for part in content
    ]


def export_record(run_path: Path) -> dict[str, Any]:
    """The training record of one run.

    Raises:
        HarnessError: not a run directory, or a run without an agent transcript.
    """
    info = RunDirectory.read_info(run_path)
    layout = RunLayout(run_path)
    transcript_path = layout.transcript
    if not transcript_path.is_file():
        raise HarnessError(
            f"{run_path} has no agent transcript (agent/transcript.jsonl); only `agentinfra run` runs export"
        )
    journal_events = Journal.read(layout.journal)
    agent_events = Journal.read(transcript_path)
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    stop: dict[str, Any] = {}
    prompt = completion = 0
    for event in agent_events:
        data = event.data
        if event.type == "loop_started" and not messages:
            messages = list(data["messages"])
            tools = data["tools"]
            config = data["config"]
        elif event.type == "model_response":
            messages.append(data["message"])
            prompt += data["usage"].get("prompt_tokens", 0)
            completion += data["usage"].get("completion_tokens", 0)
        elif event.type == "tool_result":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": data["call_id"],
                    "content": _content(data["content"]),
                }
            )
        elif event.type == "stopped":
            stop = data
    received: dict[str, dict[str, Any]] = {}
    graded: dict[str, dict[str, Any]] = {}
    for event in journal_events:
        if event.type == "submission_received":
            received.setdefault(str(event.data["sha256"]), {**event.data, "seq": event.seq})
        elif event.type == "graded":  # the latest grader version's verdict wins
            graded[str(event.data["sha256"])] = event.data
    submissions = []
    units = {str(v.get("score_unit")) for v in graded.values() if v.get("score_unit")}
    for sha, sub in sorted(received.items(), key=lambda item: item[1]["seq"]):
        verdict = graded.get(sha, {})
        outcome = verdict.get("outcome")
        score = graded_score(verdict)
        submissions.append({
            "sha256": sha, "seq": sub["seq"], "turn": sub.get("turn"), "source": sub.get("source"),
            "submitted_at_s": sub.get("submitted_at_s"), "outcome": outcome, "correct": verdict.get("correct"),
            "score": score, "hack_flagged": outcome == "hack_flagged",
            "reward": _reward(outcome, score), "graded": bool(verdict),
        })  # fmt: skip
    model = config.get("model", "")
    cost = LoopConfig.from_json(config).cost(Usage(prompt, completion)) if config else None
    return {
        "schema_version": EXPORT_SCHEMA_VERSION,
        "run_id": info.spec.run_id,
        "environment": info.spec.environment,
        "task": Path(info.spec.task).name,
        "score_unit": units.pop() if len(units) == 1 else None,
        "model": model,
        "base_url": config.get("base_url"),
        "sampling": profile_for(model).sampling() if model else {},
        "tools": tools,
        "messages": messages,
        "submissions": submissions,
        "reward": max((s["reward"] for s in submissions), default=0.0),
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
        "cost_usd": cost,
        "turns": stop.get("turns"),
        "stop_reason": stop.get("reason"),
    }

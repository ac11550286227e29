"""Training data: one JSON record per agent run (format: docs/agent-export.md, ``schema_version`` 1).

Read-only: the run's ``run.json``, its journal (trusted verdicts) and the agent
transcript. The messages are the full history as the model produced it
(reasoning and tool calls included, nothing trimmed); rewards come from the
harness's verdicts, never from anything the agent said.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentinfra.agent import profile_for
from agentinfra.errors import HarnessError
from agentinfra.harness._rundir import RunDirectory

__all__ = ["EXPORT_SCHEMA_VERSION", "export_record"]

EXPORT_SCHEMA_VERSION = 1


def _reward(outcome: str | None, speedup: float | None) -> float:
    """The reward of one submission: its measured speedup when it passed, else 0."""
    if outcome == "passed" and isinstance(speedup, (int, float)):
        return float(speedup)
    return 0.0


def export_record(run_path: Path) -> dict[str, Any]:
    """The training record of one run.

    Raises:
        HarnessError: not a run directory, or a run without an agent transcript.
    """
    info = RunDirectory.read_info(run_path)
    transcript_path = run_path / "agent" / "transcript.jsonl"
    if not transcript_path.is_file():
        raise HarnessError(
            f"{run_path} has no agent transcript (agent/transcript.jsonl); only `agentinfra run` runs export"
        )
    journal_events = _read_events(run_path / "journal.jsonl")
    agent_events = _read_events(transcript_path)
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
                {"role": "tool", "tool_call_id": data["call_id"], "content": data["content"]}
            )
        elif event.type == "stopped":
            stop = data
    received: dict[str, dict[str, Any]] = {}
    graded: dict[str, dict[str, Any]] = {}
    for event in journal_events:
        sha = event.data.get("sha256")
        if event.type == "submission_received":
            received.setdefault(sha, {**event.data, "seq": event.seq})
        elif event.type == "graded":
            graded[sha] = event.data  # the latest grader version's verdict wins
    submissions = []
    for sha, sub in sorted(received.items(), key=lambda item: item[1]["seq"]):
        verdict = graded.get(sha, {})
        outcome = verdict.get("outcome")
        submissions.append({
            "sha256": sha, "seq": sub["seq"], "turn": sub.get("turn"), "source": sub.get("source"),
            "submitted_at_s": sub.get("submitted_at_s"), "outcome": outcome, "correct": verdict.get("correct"),
            "speedup": verdict.get("speedup"), "hack_flagged": outcome == "hack_flagged",
            "reward": _reward(outcome, verdict.get("speedup")), "graded": bool(verdict),
        })  # fmt: skip
    model = config.get("model", "")
    price_in, price_out = config.get("price_in_per_mtok"), config.get("price_out_per_mtok")
    return {
        "schema_version": EXPORT_SCHEMA_VERSION,
        "run_id": info.spec.run_id,
        "environment": info.spec.environment,
        "task": Path(info.spec.task).name,
        "model": model,
        "base_url": config.get("base_url"),
        "sampling": profile_for(model).sampling() if model else {},
        "tools": tools,
        "messages": messages,
        "submissions": submissions,
        "reward": max((s["reward"] for s in submissions), default=0.0),
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
        "cost_usd": None
        if price_in is None or price_out is None
        else (prompt * price_in + completion * price_out) / 1e6,
        "turns": stop.get("turns"),
        "stop_reason": stop.get("reason"),
    }


def _read_events(path: Path) -> list[Any]:
    if not path.exists():
        raise HarnessError(f"{path} does not exist")
    # Not Journal.open: it repairs a torn last line in place, and exporting must not write.
    lines = path.read_bytes().split(b"\n")
    events = []
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            body = json.loads(line)
        except ValueError:
            if number >= len(lines) - 1:
                break  # a torn last line: ignore it, as the journal itself would
            raise HarnessError(f"{path}:{number}: not JSON") from None
        events.append(_Event(body["seq"], body["type"], body["data"]))
    return events


class _Event:
    __slots__ = ("data", "seq", "type")

    def __init__(self, seq: int, type_: str, data: dict[str, Any]) -> None:
        self.seq, self.type, self.data = seq, type_, data

"""Training data: one JSON record per agent run (format: docs/agent-export.md, ``schema_version`` 4).

Read-only (`Journal.read`: a torn last line is skipped, nothing is written): the
run's ``run.json``, its journal (trusted verdicts) and the agent transcript. The messages are the full history as the model produced it
(reasoning and tool calls included, nothing trimmed); rewards come from the
harness's verdicts, never from anything the agent said; a run with any
hack-flagged submission is zeroed as a whole and marked. With ``images_dir``,
each image is copied there once under its content hash and referenced as
``images/<sha256>.png`` (relative to the export file). Version 4 adds the trajectory's
fields (`rollout_fields`: the engine's ids per call, segments, per-turn rewards, infra
failure, time split), computed by the same code as `trajectory_of`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentinfra.agent import LoopConfig, Usage, profile_for
from agentinfra.environments import Anomaly
from agentinfra.errors import HarnessError
from agentinfra.harness._journal import Journal
from agentinfra.harness._run_records import agent_view, run_reward, submissions_of
from agentinfra.harness._rundir import RunDirectory, RunLayout
from agentinfra.harness._trajectory import rollout_fields

__all__ = ["EXPORT_SCHEMA_VERSION", "export_record"]

EXPORT_SCHEMA_VERSION = 4


def export_record(
    run_path: Path, *, images_dir: Path | None = None, anomalies: Sequence[Anomaly] = ()
) -> dict[str, Any]:
    """The training record of one run (``anomalies``: those found for it across runs, listed as they are).

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
    agent_events = Journal.read(transcript_path)
    journal_events = Journal.read(layout.journal)
    view = agent_view(agent_events, run_path, images_dir)
    config, stop = view.config, view.stop
    prompt, completion = view.prompt_tokens, view.completion_tokens
    verdicts = submissions_of(journal_events)
    units = {str(s["score_unit"]) for s in verdicts if s["score_unit"]}
    submissions = [
        {k: v for k, v in s.items() if k not in ("score_unit", "grader_version")} for s in verdicts
    ]
    reward, hacked = run_reward(submissions)
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
        "tools": view.tools,
        "messages": view.messages,
        "submissions": submissions,
        "reward": reward,
        "hack_flagged": hacked,
        "anomalies": [a.to_json() | {"run": Path(a.run).name} for a in anomalies],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
        "cost_usd": cost,
        "turns": stop.get("turns"),
        "stop_reason": stop.get("reason"),
        **rollout_fields(agent_events, journal_events, layout, verdicts),
    }

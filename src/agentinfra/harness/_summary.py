"""The multi-run summary: one page over many agent runs (``summary.html`` and ``summary.json``).

One row per run: task, score (best passed), final outcome, turns and tool
calls, wall time, stop reason, and the flags: the grader's findings (each check
once, from every verdict) and the environment's anomalies across runs
(`EnvironmentDefinition.find_anomalies`: for the desktop, success after FAIL, a
graded file written in one step, identical action sequences across tasks, a
task a do-nothing episode passes). Each anomaly links to the run's report at the
turn where it starts (``report.html#turn-N``).

Read-only except for the reports it (re)writes for runs nobody holds: run.json,
journals, stored evaluations and transcripts.
"""

from __future__ import annotations

import html
import json
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentinfra.environments import Anomaly, RunView, environment_definition
from agentinfra.errors import AgentInfraError, HarnessError
from agentinfra.harness._journal import Journal
from agentinfra.harness._migrations import read_evaluation
from agentinfra.harness._queue import graded_score
from agentinfra.harness._rundir import RunDirectory, RunLayout, atomic_write

__all__ = ["SUMMARY_SCHEMA_VERSION", "find_anomalies", "run_view", "summarize", "write_summary"]

SUMMARY_SCHEMA_VERSION = 1


def _submissions(layout: RunLayout) -> list[dict[str, Any]]:
    """Per received submission, in order: source, outcome, score, the latest grader version."""
    received: dict[str, dict[str, Any]] = {}
    for event in Journal.read(layout.journal):
        sha = str(event.data.get("sha256", ""))
        if event.type == "submission_received" and sha not in received:
            received[sha] = {"sha256": sha, "source": event.data.get("source"), "outcome": None,
                             "score": None, "grader_version": None, "seq": event.seq}  # fmt: skip
        elif event.type == "graded" and sha in received:
            outcome = event.data.get("outcome")
            received[sha] |= {"outcome": outcome, "grader_version": event.data.get("grader_version"),
                              "score": graded_score(event.data) if outcome == "passed" else None}  # fmt: skip
    return list(received.values())


def run_view(path: Path) -> RunView:
    """What an environment's anomaly finder sees of the run at ``path``."""
    info = RunDirectory.read_info(path)
    layout = RunLayout(path)
    return RunView(path=path, task=Path(info.spec.task), workspace=layout.workspace,
                   submissions=tuple(_submissions(layout)),
                   options=dict(info.spec.agent.get("options") or {}))  # fmt: skip


def _findings(
    layout: RunLayout, submissions: list[dict[str, Any]], environment: str
) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for sub in submissions:
        if sub["grader_version"] is None:
            continue
        path = layout.evaluation_path(sub["sha256"], str(sub["grader_version"]))
        try:
            evaluation = read_evaluation(json.loads(path.read_bytes()), environment=environment)
        except (OSError, ValueError):
            continue
        for finding in evaluation.findings:
            seen.setdefault(finding.check, {"check": finding.check, "severity": finding.severity,
                                            "message": finding.message})  # fmt: skip
    return list(seen.values())


def _agent_facts(layout: RunLayout) -> dict[str, Any]:
    if not layout.transcript.is_file():
        return {"turns": None, "tool_calls": None, "stop_reason": None, "wall_s": None}
    events = Journal.read(layout.transcript)
    stopped = next((e.data for e in reversed(events) if e.type == "stopped"), {})
    return {
        "turns": stopped.get("turns", sum(1 for e in events if e.type == "model_response")),
        "tool_calls": sum(1 for e in events if e.type == "tool_result"),
        "stop_reason": stopped.get("reason"),
        "wall_s": round(events[-1].wall_s - events[0].wall_s, 1) if events else None,
    }


def _find(views: dict[str, list[RunView]], audit: Path | None) -> list[Anomaly]:
    found: list[Anomaly] = []
    for name, group in views.items():
        try:
            finder = environment_definition(name).find_anomalies
        except AgentInfraError:
            continue  # an environment no longer installed: its runs still show, without anomalies
        if finder is not None:
            found += finder(group, audit)
    return found


def find_anomalies(paths: Sequence[Path], audit: Path | None = None) -> list[Anomaly]:
    """Every environment's anomalies across the runs at ``paths`` (of any environments)."""
    views: dict[str, list[RunView]] = defaultdict(list)
    for path in paths:
        views[RunDirectory.read_info(path).spec.environment].append(run_view(path))
    return _find(views, audit)


def summarize(paths: Sequence[Path], audit: Path | None = None) -> dict[str, Any]:
    """The summary of the runs at ``paths`` (``audit``: an environment's task audit, for its anomalies).

    Raises:
        HarnessError: a path is not a run directory.
    """
    rows: list[dict[str, Any]] = []
    views: dict[str, list[RunView]] = defaultdict(list)
    for path in paths:
        info = RunDirectory.read_info(path)
        layout = RunLayout(path)
        submissions = _submissions(layout)
        scores = [s["score"] for s in submissions if s["score"] is not None]
        final = submissions[-1] if submissions else {}
        rows.append({
            "run_id": info.spec.run_id, "path": str(path), "environment": info.spec.environment,
            "task": Path(info.spec.task).name, "score": max(scores, default=None),
            "final_outcome": final.get("outcome"), "submissions": len(submissions),
            "hack_flagged": any(s["outcome"] == "hack_flagged" for s in submissions),
            **_agent_facts(layout), "findings": _findings(layout, submissions, info.spec.environment),
            "anomalies": [],
        })  # fmt: skip
        views[info.spec.environment].append(run_view(path))
    anomalies = _find(views, audit)
    by_path = {row["path"]: row for row in rows}
    for anomaly in anomalies:
        if anomaly.run in by_path:
            by_path[anomaly.run]["anomalies"].append(anomaly.to_json())
    passed = [r for r in rows if r["score"] is not None]
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "runs": rows,
        "totals": {
            "runs": len(rows),
            "passed": len(passed),
            "mean_score": round(sum(r["score"] or 0.0 for r in rows) / len(rows), 4)
            if rows
            else None,
            "hack_flagged": sum(r["hack_flagged"] for r in rows),
            "with_anomalies": sum(bool(r["anomalies"]) for r in rows),
        },
    }


def _write_reports(paths: Sequence[Path]) -> None:
    """Each run's report (its filmstrip is what the summary links into); a run held elsewhere keeps its old one."""
    from agentinfra.harness._executors import open_environment
    from agentinfra.harness._report import write_report

    for path in paths:
        try:
            run = RunDirectory.open(path)
        except HarnessError:
            continue
        try:
            environment = open_environment(run.spec)
            write_report(run, environment.grader_version, environment.score)
        except AgentInfraError:
            continue
        finally:
            run.close()


def render_summary(summary: dict[str, Any], out_dir: Path) -> str:
    esc = html.escape
    rows = []
    for row in summary["runs"]:
        report = os.path.relpath(Path(row["path"]) / "report.html", out_dir)
        flags = [
            f"<span class='{esc(f['severity'])}'>{esc(f['check'])}</span>" for f in row["findings"]
        ]
        for a in row["anomalies"]:
            anchor = f"#turn-{a['turn']}" if a.get("turn") is not None else ""
            where = f" (step {a['step']})" if a.get("step") is not None else ""
            flags.append(f"<a class='anomaly' href='{esc(report + anchor)}' title='{esc(a['message'])}'>"
                         f"{esc(a['check'])}{esc(where)}</a>")  # fmt: skip
        score = "-" if row["score"] is None else f"{row['score']:g}"
        wall = "-" if row["wall_s"] is None else f"{row['wall_s']:.0f} s"
        rows.append(
            f"<tr class='{'hack' if row['hack_flagged'] else ''}'><td><a href='{esc(report)}'>{esc(row['task'])}</a>"
            f"<br><small>{esc(row['run_id'])}</small></td><td>{score}</td><td>{esc(str(row['final_outcome']))}</td>"
            f"<td>{row['turns'] if row['turns'] is not None else '-'}</td>"
            f"<td>{row['tool_calls'] if row['tool_calls'] is not None else '-'}</td><td>{wall}</td>"
            f"<td>{esc(str(row['stop_reason']))}</td><td>{' '.join(flags)}</td></tr>"
        )
    details = "".join(
        f"<li><b>{esc(a['check'])}</b> in <code>{esc(Path(row['path']).name)}</code>: {esc(a['message'])}</li>"
        for row in summary["runs"]
        for a in row["anomalies"]
    )
    t = summary["totals"]
    mean = "-" if t["mean_score"] is None else f"{t['mean_score']:.3f}"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>agentinfra summary of {t["runs"]} runs</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ddd; padding: 4px 8px; font-size: 13px; vertical-align: top; }}
th {{ background: #f3f3f3; }} tr.hack {{ background: #fdecea; }}
span.block {{ color: #d7191c; font-weight: bold; }} span.warn {{ color: #b35806; }} a.anomaly {{ color: #5e3c99; font-weight: bold; }}
</style></head><body>
<h1>{t["runs"]} runs</h1>
<p>{t["passed"]} passed; mean score {mean}; {t["hack_flagged"]} hack-flagged; {t["with_anomalies"]} with anomalies.
Flags: the grader's findings (red: blocking) and anomalies across runs (purple, linked to the step where they start;
leads for a person, not verdicts).</p>
<table><tr><th>task / run</th><th>score</th><th>final</th><th>turns</th><th>tool calls</th><th>time</th><th>stop</th><th>flags</th></tr>
{"".join(rows)}</table>
<h2>Anomalies</h2><ul>{details or "<li>none</li>"}</ul>
</body></html>
"""


def write_summary(
    paths: Sequence[Path], out_dir: Path, *, audit: Path | None = None, reports: bool = True
) -> tuple[Path, Path]:
    """Writes ``summary.json`` and ``summary.html`` into ``out_dir`` (and each run's report first)."""
    if reports:
        _write_reports(paths)
    summary = summarize(paths, audit)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out_dir / "summary.json", out_dir / "summary.html"
    atomic_write(json_path, json.dumps(summary, indent=1).encode())
    atomic_write(html_path, render_summary(summary, out_dir).encode())
    return json_path, html_path

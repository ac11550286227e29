"""Reports: ``report.json`` (schema version 1) and a self-contained ``report.html``.

The HTML needs no network: the chart is inline SVG drawn here, the styles are
inline. Scores are labelled with the environment's unit (`ScoreSpec`). It shows a
timeline of every submission (score and outcome, hack flags marked), the best-so-far curves raw and filtered, a table of submissions with
findings and evidence, the anomalies, and the diff between consecutive submissions.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from agentinfra.environments import ScoreSpec
from agentinfra.harness._filmstrip import filmstrip_frames, render_filmstrip
from agentinfra.harness._journal import Journal
from agentinfra.harness._metrics import SubmissionRecord, anomalies, compute_metrics, diff_text
from agentinfra.harness._rundir import RunDirectory, atomic_write
from agentinfra.harness._walltime import wall_time_breakdown

__all__ = ["REPORT_SCHEMA_VERSION", "build_report", "load_records", "render_html", "write_report"]

REPORT_SCHEMA_VERSION = 3
"""3: ``utilisation`` (where the wall time went, the grading pool's and the machine's activity)
and each submission's ``utilisation`` (its roofline position)."""
_COLOURS = {"passed": "#1a9641", "failed": "#f39c12", "hack_flagged": "#d7191c", "crashed": "#7f7f7f",
            "timeout": "#5e3c99", "invalid": "#999999", "grader_error": "#000000"}  # fmt: skip


def load_records(run: RunDirectory, grader_version: str) -> list[SubmissionRecord]:
    """One record per received submission, in arrival order, with its verdict (if graded)."""
    records: list[SubmissionRecord] = []
    received = [e for e in run.journal.events if e.type == "submission_received"]
    for number, event in enumerate(received, start=1):
        sha = str(event.data["sha256"])
        evaluation = run.read_evaluation(sha, grader_version)
        again = run.read_evaluation(sha, grader_version, "remeasure")
        records.append(
            SubmissionRecord(
                seq=number, sha256=sha, submitted_at_s=float(event.data.get("submitted_at_s", 0.0)),
                turn=event.data.get("turn"), outcome=evaluation.outcome.value if evaluation else "pending",
                correct=bool(evaluation and evaluation.correct), score=evaluation.score if evaluation else None,
                findings=[f.model_dump() for f in evaluation.findings] if evaluation else [],
                source=run.submission_text(sha),
                remeasured_score=again.score if again and again.correct else None,
                score_ci=evaluation.score_ci if evaluation else None,
                utilisation=evaluation.details.get("utilisation") if evaluation else None,
            )
        )  # fmt: skip
    return records


def _transcript_events(run: RunDirectory) -> list[Any]:
    """The agent's transcript events (an `agentinfra run` run), or none."""
    path = run.layout.transcript
    if not path.is_file():
        return []
    return list(Journal.read(path))


def _events_by_sha(run: RunDirectory) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for event in run.journal.events:
        sha = event.data.get("sha256")
        if isinstance(sha, str):
            found.setdefault(sha, []).append(event.seq)
    return found


def build_report(run: RunDirectory, grader_version: str, score: ScoreSpec) -> dict[str, Any]:
    records = load_records(run, grader_version)
    metrics = compute_metrics(records, thresholds=score.thresholds)
    flags = anomalies(records, _events_by_sha(run))
    best = metrics["filtered"]["best"]
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "run_id": run.spec.run_id,
        "task": run.spec.task,
        "environment": run.spec.environment,
        "grader_version": grader_version,
        "score_unit": score.unit,
        "submissions": [
            {"seq": r.seq, "sha256": r.sha256, "submitted_at_s": r.submitted_at_s, "turn": r.turn, "outcome": r.outcome,
             "correct": r.correct, "score": r.score, "score_ci": list(r.score_ci) if r.score_ci else None,
             "remeasured_score": r.remeasured_score, "is_hack": r.is_hack, "findings": r.findings,
             "utilisation": r.utilisation}
            for r in records
        ],
        "utilisation": wall_time_breakdown(run.journal.events, _transcript_events(run)),
        "best": best,
        "metrics": metrics,
        "anomalies": flags,
        "steps": filmstrip_frames(run.layout.transcript),
        "_images_dir": run.layout.transcript.parent / "images",
        "_records": records,
        "_score": score,
    }  # fmt: skip


def _chart(records: list[SubmissionRecord], metrics: dict[str, Any], score: ScoreSpec) -> str:
    width, height, left, right, top, bottom = 960, 380, 60, 20, 44, 50
    end_h = max([r.submitted_at_s for r in records] + [1.0]) / 3600 * 1.03
    values = [v for r in records for v in (r.score, r.remeasured_score) if v]
    log = score.scale == "log"
    high = max([*values, 2.0]) * 1.5 if log else max([*values, 1.0]) * 1.1
    low = min([*values, 0.5]) / 1.5 if log else 0.0

    def x(t_s: float) -> float:
        return left + (t_s / 3600) / end_h * (width - left - right)

    def y(value: float) -> float:
        if not log:
            return top + (high - max(value, low)) / (high - low) * (height - top - bottom)
        span = math.log(high) - math.log(low)
        return top + (math.log(high) - math.log(max(value, low))) / span * (height - top - bottom)

    def label(value: float) -> str:
        return f"{value:g}{score.suffix}"

    parts = [f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
             f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" fill="#fafafa" stroke="#ccc"/>']  # fmt: skip
    ticks = []
    tick = 0.25 if log else 0.0
    while tick <= high:
        if tick >= low:
            ticks.append(tick)
        tick = tick * 2 if log else tick + max(high / 5, 1e-9)
    for tick in ticks:
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#e3e3e3"/><text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{label(tick)}</text>'
        )
    parts.append(
        f'<text x="14" y="{(top + height - bottom) / 2:.0f}" transform="rotate(-90 14 {(top + height - bottom) / 2:.0f})" text-anchor="middle">{html.escape(score.unit)}</text>'
    )
    step = max(1, math.ceil(end_h / 8))
    for hour in range(0, int(end_h) + 1, step):
        parts.append(
            f'<text x="{x(hour * 3600):.1f}" y="{height - bottom + 16}" text-anchor="middle">{hour}h</text>'
        )
    parts.append(
        f'<text x="{(left + width) / 2}" y="{height - 8}" text-anchor="middle">run time (hours)</text>'
    )
    for key, colour, dash in (("raw", "#d7191c", "6,4"), ("filtered", "#1a9641", "")):
        points = metrics[key]["best_so_far"]
        if points:
            path = [f"M{x(points[0]['t_s']):.1f},{y(points[0]['best']):.1f}"]
            for point in points[1:]:
                path.append(f"H{x(point['t_s']):.1f}V{y(point['best']):.1f}")
            path.append(f"H{x(end_h * 3600):.1f}")
            parts.append(
                f'<path class="best-{key}" d="{"".join(path)}" fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/>'
            )
    for record in records:
        colour = _COLOURS.get(record.outcome, "#333")
        cx = x(record.submitted_at_s)
        cy = y(record.score) if record.score is not None else height - bottom - 8
        title = html.escape(
            f"#{record.seq} {record.outcome} "
            + (score.format(record.score) if record.score is not None else "")
        )
        if record.is_hack:
            parts.append(
                f'<g class="submission hack"><title>{title}</title><path d="M{cx - 6:.1f},{cy - 6:.1f}L{cx + 6:.1f},{cy + 6:.1f}M{cx - 6:.1f},{cy + 6:.1f}L{cx + 6:.1f},{cy - 6:.1f}" stroke="{colour}" stroke-width="3"/></g>'
            )
        else:
            parts.append(
                f'<circle class="submission" cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{colour}"><title>{title}</title></circle>'
            )
    legend = [
        ("passed", "passed"),
        ("failed", "failed"),
        ("hack_flagged", "hack flagged (x)"),
        ("crashed", "crashed / invalid / timeout"),
    ]
    for index, (key, name) in enumerate(legend):
        lx = left + 10 + index * 150
        parts.append(
            f'<circle cx="{lx}" cy="12" r="5" fill="{_COLOURS[key]}"/><text x="{lx + 9}" y="16">{name}</text>'
        )
    parts.append(
        f'<line x1="{left + 640}" x2="{left + 670}" y1="12" y2="12" stroke="#1a9641" stroke-width="2"/><text x="{left + 674}" y="16">best, hacks removed</text>'
    )
    parts.append(
        f'<line x1="{left + 640}" x2="{left + 670}" y1="30" y2="30" stroke="#d7191c" stroke-width="2" stroke-dasharray="6,4"/><text x="{left + 674}" y="34">best, hacks included</text>'
    )
    parts.append("</svg>")
    return "\n".join(parts)


def _lanes_svg(util: dict[str, Any]) -> str:
    """Model calls, tool calls and gradings on one time axis (a lane each)."""
    span = float(util.get("span_s") or 0.0)
    lanes = util.get("lanes", {})
    if span <= 0 or not any(lanes.values()):
        return ""
    width, left, lane_h = 960, 70, 18
    colours = {"model": "#2b83ba", "tools": "#fdae61", "grading": "#1a9641"}
    parts = []
    for row, name in enumerate(("model", "tools", "grading")):
        y = 8 + row * (lane_h + 6)
        parts.append(f'<text x="4" y="{y + 13}" font-size="11">{name}</text>')
        for start, end in lanes.get(name, []):
            x = left + (width - left - 10) * start / span
            w = max((width - left - 10) * (end - start) / span, 0.8)
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{lane_h}" fill="{colours[name]}">'
                f"<title>{name} {start:.1f}-{end:.1f} s</title></rect>"
            )
    height = 8 + 3 * (lane_h + 6) + 14
    parts.append(
        f'<text x="{left}" y="{height - 2}" font-size="10">0 s</text>'
        f'<text x="{width - 60}" y="{height - 2}" font-size="10">{span:.0f} s</text>'
    )
    return f'<svg width="{width}" height="{height}" role="img" aria-label="timeline">{"".join(parts)}</svg>'


def _roofline_svg(records: list[SubmissionRecord]) -> str:
    """The best correct, unflagged submissions on a log-log roofline (those with a FLOP count)."""
    best = sorted(
        (
            r
            for r in records
            if r.correct and not r.is_hack and r.utilisation and r.score is not None
        ),
        key=lambda r: -(r.score or 0.0),
    )[:5]
    points = [r for r in best if (r.utilisation or {}).get("arithmetic_intensity")]
    if not points:
        return ""
    first = points[0].utilisation or {}
    peak_f, peak_b = float(first["peak_flops_per_s"]), float(first["peak_bytes_per_s"])
    xs = [float((r.utilisation or {})["arithmetic_intensity"]) for r in points]
    ridge = peak_f / peak_b
    x_lo, x_hi = min([*xs, ridge]) / 10, max([*xs, ridge]) * 10
    y_hi = peak_f * 2
    y_lo = min(float((r.utilisation or {})["flops_per_s"]) for r in points) / 10
    width, height, left, bottom = 420, 260, 60, 30

    def x(value: float) -> float:
        return left + (width - left - 10) * math.log(value / x_lo) / math.log(x_hi / x_lo)

    def y(value: float) -> float:
        return 10 + (height - bottom - 10) * (1 - math.log(value / y_lo) / math.log(y_hi / y_lo))

    roof = " ".join(
        f"{x(v):.1f},{y(min(peak_f, v * peak_b)):.1f}"
        for v in (x_lo, ridge, x_hi)
        if min(peak_f, v * peak_b) > y_lo
    )
    dots = "".join(
        f'<circle cx="{x(float(u["arithmetic_intensity"])):.1f}" cy="{y(float(u["flops_per_s"])):.1f}" r="4" fill="#d7191c">'
        f"<title>#{r.seq}: {float(u['flops_per_s']) / 1e9:.2f} GFLOP/s, {float(u['roofline_fraction']):.0%} of the roof</title></circle>"
        f'<text x="{x(float(u["arithmetic_intensity"])) + 6:.1f}" y="{y(float(u["flops_per_s"])) + 4:.1f}" font-size="10">#{r.seq}</text>'
        for r in points
        for u in [r.utilisation or {}]
    )
    return (
        f'<svg width="{width}" height="{height}" role="img" aria-label="roofline">'
        f'<polyline points="{roof}" fill="none" stroke="#555" stroke-width="1.5"/>{dots}'
        f'<text x="{left}" y="{height - 8}" font-size="10">arithmetic intensity (FLOP/byte), log</text>'
        f'<text x="4" y="12" font-size="10">FLOP/s, log (peak {peak_f / 1e9:.0f} GFLOP/s, {peak_b / 1e9:.0f} GB/s)</text></svg>'
    )


def _wall_time_html(util: dict[str, Any], records: list[SubmissionRecord]) -> str:
    if not util or not util.get("span_s"):
        return ""
    agent, grading, machine = (
        util.get("agent", {}),
        util.get("grading", {}),
        util.get("machine", {}),
    )
    span = float(util["span_s"])

    def share(seconds: float, whole: float) -> str:
        return f"{seconds:.1f} s ({seconds / whole:.0%})" if whole > 0 else f"{seconds:.1f} s"

    agent_span = float(agent.get("span_s") or 0.0)
    agent_row = (
        f"<tr><th>agent ({agent_span:.0f} s)</th><td>model calls {share(agent['model_s'], agent_span)}, "
        f"{agent['model_calls']} calls</td><td>tool calls {share(agent['tools_s'], agent_span)}, {agent['tool_calls']} calls</td>"
        f"<td>idle {share(agent['idle_s'], agent_span)}</td></tr>"
        if agent_span > 0
        else ""
    )
    machine_text = (
        f"{machine.get('metric')} mean {float(machine['mean']):.0%} over {machine['samples']} samples ({html.escape(str(machine['source']))})"
        if machine.get("mean") is not None
        else "not sampled"
    )
    return f"""<h2>Where the time went</h2>
<table>{agent_row}
<tr><th>grading ({grading.get("workers", 1)} worker(s))</th><td>{grading.get("gradings", 0)} gradings, {float(grading.get("grading_s", 0.0)):.1f} s</td>
<td>waiting in the queue {float(grading.get("queue_s", 0.0)):.1f} s</td><td>workers busy {float(grading.get("busy_fraction", 0.0)):.0%} of {span:.0f} s</td></tr>
<tr><th>machine</th><td colspan="3">{machine_text}</td></tr></table>
{_lanes_svg(util)}
{_roofline_svg(records)}"""


def render_html(report: dict[str, Any]) -> str:
    records: list[SubmissionRecord] = report["_records"]
    score: ScoreSpec = report["_score"]
    metrics = report["metrics"]
    esc = html.escape
    rows = []
    for index, record in enumerate(records):
        findings = "<br>".join(
            f"<b>{esc(str(f.get('check')))}</b> [{esc(str(f.get('severity')))}] {esc(str(f.get('message')))}<br><code>{esc(str(f.get('evidence', '')))}</code>"
            for f in record.findings
        )
        speed = score.format(record.score)
        roof = record.utilisation or {}
        if roof.get("roofline_fraction") is not None:
            speed += f"<br><small>{float(roof['roofline_fraction']):.0%} of the roof ({esc(str(roof.get('bound')))}-bound)</small>"
        if record.score_ci:
            speed += f" <small>[{record.score_ci[0]:.2f}, {record.score_ci[1]:.2f}]</small>"
        if record.remeasured_score is not None:
            speed += f"<br><small>re-measured {score.format(record.remeasured_score)}</small>"
        previous = records[index - 1].source if index else ""
        diff = esc(diff_text(previous, record.source))
        rows.append(
            f'<tr class="{esc(record.outcome)}"><td>{record.seq}</td><td>{record.submitted_at_s / 3600:.2f}h</td>'
            f'<td style="color:{_COLOURS.get(record.outcome, "#333")}"><b>{esc(record.outcome)}</b></td><td>{speed}</td>'
            f"<td>{findings}</td><td><details><summary>diff</summary><pre>{diff}</pre></details><code>{record.sha256[:12]}</code></td></tr>"
        )
    flags = "".join(
        f"<li><b>{esc(a['kind'])}</b> at #{a['seq']} ({a['submitted_at_s'] / 3600:.2f}h): {esc(a['message'])} "
        f"<small>journal events {a['journal_events']}</small><details><summary>diff</summary><pre>{esc(a['diff'])}</pre></details></li>"
        for a in report["anomalies"]
    )

    def figure(key: str) -> str:
        best = metrics[key]["best"]
        best_text = f"{score.format(best['counted'])} (#{best['seq']})" if best else "none"
        return (f"<td>{best_text}</td><td>{score.format(metrics[key]['mean_best_so_far'])}</td>"
                + "".join(f"<td>{'-' if v is None else f'{v / 3600:.2f}h'}</td>" for v in metrics[key]["time_to_threshold_s"].values()))  # fmt: skip

    thresholds = "".join(
        f"<th>time to {esc(score.format(float(t)))}</th>"
        for t in metrics["raw"]["time_to_threshold_s"]
    )
    counts = ", ".join(f"{esc(k)}: {v}" for k, v in metrics["counts_by_outcome"].items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>agentinfra run {esc(report["run_id"])}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; margin: 12px 0; }} td, th {{ border: 1px solid #ddd; padding: 4px 8px; vertical-align: top; font-size: 13px; }}
th {{ background: #f3f3f3; }} pre {{ font-size: 11px; max-width: 720px; overflow: auto; }} code {{ font-size: 11px; }}
tr.hack_flagged {{ background: #fdecea; }}
</style></head><body>
<h1>Run {esc(report["run_id"])}</h1>
<p>Task <code>{esc(report["task"])}</code> ({esc(report["environment"])}), grader {esc(report["grader_version"])}.
{metrics["submissions"]} submissions over {metrics["duration_s"] / 3600:.2f} hours; {counts}; {metrics["hack_flagged"]} hack-flagged.</p>
{_chart(records, metrics, score)}
<h2>Summary</h2>
<table><tr><th></th><th>best (counted)</th><th>mean best-so-far</th>{thresholds}</tr>
<tr><th>raw (hacks included)</th>{figure("raw")}</tr><tr><th>filtered (hacks removed)</th>{figure("filtered")}</tr></table>
<h2>Anomalies</h2><ul>{flags or "<li>none</li>"}</ul>
<h2>Submissions</h2>
<table><tr><th>#</th><th>time</th><th>outcome</th><th>{esc(score.unit)} [95% CI]</th><th>findings and evidence</th><th>change</th></tr>
{"".join(rows)}</table>
{_wall_time_html(report.get("utilisation", {}), records)}
{render_filmstrip(report.get("steps", []), report["_images_dir"])}
</body></html>
"""


def write_report(
    run: RunDirectory, grader_version: str, score: ScoreSpec, out_dir: Path | None = None
) -> tuple[Path, Path]:
    """Writes ``report.json`` and ``report.html`` into the run directory (or ``out_dir``)."""
    report = build_report(run, grader_version, score)
    target = out_dir or run.path
    target.mkdir(parents=True, exist_ok=True)
    body = {k: v for k, v in report.items() if not k.startswith("_")}
    json_path, html_path = target / "report.json", target / "report.html"
    atomic_write(json_path, json.dumps(body, indent=1).encode())
    atomic_write(html_path, render_html(report).encode())
    return json_path, html_path

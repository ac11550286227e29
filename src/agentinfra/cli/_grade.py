"""`agentinfra grade PROBLEM SUBMISSION`: grade one kernel submission in isolation.

With ``--json`` stdout carries exactly one JSON object, the verdict. Exit status
0 whenever a verdict was produced (whatever it says); 2 for a usage error (a
missing file, an unreadable problem), with a one-line message on stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from agentinfra._settings import load_settings
from agentinfra.environments.kernels import GradeOptions, KernelSettings, Verdict, grade
from agentinfra.errors import ConfigError, TaskEnvironmentError

__all__ = ["grade_command"]


def _read(label: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TaskEnvironmentError(f"cannot read {label} {path}: {exc.strerror}") from None


def _show(verdict: Verdict) -> None:
    console = Console()
    colour = {"passed": "green", "hack_flagged": "red", "failed": "yellow"}.get(
        verdict.outcome.value, "magenta"
    )
    console.print(f"[bold {colour}]{verdict.outcome.value}[/]  correct={verdict.correct}")
    if verdict.speedup is not None and verdict.speedup_ci is not None:
        low, high = verdict.speedup_ci
        console.print(
            f"speedup {verdict.speedup:.2f}x (95% CI {low:.2f}-{high:.2f}); "
            f"candidate {verdict.candidate_ms:.4f} ms, baseline {verdict.baseline_ms:.4f} ms"
        )
    if verdict.utilisation is not None:
        use = verdict.utilisation
        flops = f"{use.flops_per_s / 1e9:.1f} GFLOP/s, " if use.flops_per_s is not None else ""
        console.print(
            f"utilisation {use.roofline_fraction:.0%} of the {use.bound} roof: {flops}"
            f"{use.bytes_per_s / 1e9:.1f} GB/s ({use.bytes_source}); peaks "
            f"{use.peak_flops_per_s / 1e9:.1f} GFLOP/s, {use.peak_bytes_per_s / 1e9:.1f} GB/s"
        )
    if verdict.error:
        console.print(f"error: {verdict.error}", highlight=False)
    if verdict.findings:
        table = Table("check", "severity", "message", "evidence")
        for finding in verdict.findings:
            table.add_row(finding.check, finding.severity, finding.message, finding.evidence)
        console.print(table)
    console.print(
        f"[dim]sandbox {verdict.provenance.sandbox}, grader {verdict.provenance.grader_version}[/]"
    )


def grade_command(
    problem: Annotated[Path, typer.Argument(help="Problem file (KernelBench format).")],
    submission: Annotated[Path, typer.Argument(help="Submission file defining ModelNew.")],
    device: Annotated[
        str | None,
        typer.Option("--device", help="cpu or cuda (default: AGENTINFRA_GRADER_DEVICE, else cpu)."),
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", help="Torch threads for both sides.")
    ] = None,
    timeout_s: Annotated[
        float | None, typer.Option("--timeout-s", help="Candidate wall-clock budget.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print exactly one JSON object, the verdict.")
    ] = False,
) -> None:
    """Grade SUBMISSION against PROBLEM: correctness on hidden inputs, audited timing, hack checks."""
    for label, path in (("problem", problem), ("submission", submission)):
        if not path.is_file():
            raise ConfigError(f"{label} {path} does not exist or is not a file")
    settings = KernelSettings.from_config(
        load_settings().grader, threads=threads, timeout_s=timeout_s
    )
    options = GradeOptions.from_settings(settings, device=device)
    sources = (_read("problem", problem), _read("submission", submission))
    if as_json:
        verdict = grade(*sources, options, problem_name=str(problem))
        typer.echo(verdict.model_dump_json())
        return
    with Console(stderr=True).status(f"grading {submission.name} against {problem.name}"):
        verdict = grade(*sources, options, problem_name=str(problem))
    _show(verdict)

"""Run commands: start, submit, finish, resume, regrade, report, replay-run.

A live run (``start`` or ``resume``) holds the run directory's lock and grades
whatever arrives in ``RUN/inbox`` (where ``submit`` drops files atomically) or a
``--watch`` directory, with a live progress display, until its budget ends or
``finish`` is called.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from agentinfra._settings import Settings, load_settings
from agentinfra.cli._progress import progress_view
from agentinfra.environments import environment_definition
from agentinfra.errors import ConfigError
from agentinfra.harness import (
    Budget,
    RunDirectory,
    RunHarness,
    RunLayout,
    RunSpec,
    graded_score,
    load_recording,
    make_executor,
    open_environment,
    regrade,
    remeasure_best,
    replay_recording,
    write_report,
)

__all__ = ["DEFAULT_ENVIRONMENT", "EnvOption", "register", "start_spec"]

err = Console(stderr=True)

DEFAULT_ENVIRONMENT = "kernels"
"""The environment of ``start`` and ``run`` without ``--env``: the one default, here in the CLI."""
EnvOption = Annotated[
    str,
    typer.Option("--env", help=f"Environment (a registered name; default {DEFAULT_ENVIRONMENT})."),
]


def _status(harness: RunHarness) -> Table:
    graded = harness.state.graded
    scores = [
        s
        for d in graded.values()
        if d.get("outcome") == "passed" and (s := graded_score(d)) is not None
    ]
    flags = sum(1 for d in graded.values() if d.get("outcome") == "hack_flagged")
    table = Table(title=f"run {harness.run.spec.run_id}", show_header=False)
    table.add_row("elapsed", f"{harness.run_time_s() / 3600:.2f} h")
    table.add_row("budget left", f"{max(0.0, harness.budget_left_s()) / 3600:.2f} h")
    table.add_row(
        "graded / queued / grading",
        f"{len(graded)} / {harness.queue.qsize()} / {len(harness.in_flight)}",
    )
    best = harness.environment.score.format(max(scores)) if scores else "-"
    table.add_row(f"best {harness.environment.score.unit} so far (passed)", best)
    table.add_row("hack flags", str(flags))
    return table


_CLUSTER_HELP = (
    "Grade on Ray: 'local' starts one here, or a cluster address (ray://host:10001, auto)."
)


def _serve(run: RunDirectory, eval_workers: int, watch: Path | None, cluster: str | None) -> None:
    harness = RunHarness(run, open_environment(run.spec), eval_workers=eval_workers,
                         executor=make_executor(cluster) if cluster else None)  # fmt: skip
    requeued = harness.recover()
    if requeued:
        err.print(f"resuming: {len(requeued)} submission(s) re-queued for grading")
    with Live(_status(harness), console=err, refresh_per_second=2, transient=False) as live:
        asyncio.run(harness.serve(watch=watch, tick=lambda: live.update(_status(harness))))
    err.print(
        f"run finished: {len(harness.state.graded)} graded; `agentinfra report {run.path}` writes the report"
    )


def start_spec(run_id: str, env: str, task: Path, hours: float, settings: Settings) -> RunSpec:
    """The spec `start` creates: the environment's settings from ``settings`` (``AGENTINFRA_*``)."""
    stored = environment_definition(env).new_settings(settings).model_dump(mode="json")
    return RunSpec(run_id=run_id, environment=env, task=str(task.resolve()), budget=Budget(wall_hours=hours),
                   settings=stored)  # fmt: skip


def start(
    run_dir: Annotated[Path, typer.Argument(help="New run directory.")],
    task: Annotated[Path, typer.Option("--task", help="Task file (a problem file for kernels).")],
    env: EnvOption = DEFAULT_ENVIRONMENT,
    hours: Annotated[float, typer.Option("--hours", help="Wall-clock budget.")] = 12.0,
    eval_workers: Annotated[
        int | None, typer.Option("--eval-workers", help="Submissions graded at once.")
    ] = None,
    watch: Annotated[
        Path | None, typer.Option("--watch", help="Also grade files that appear here.")
    ] = None,
    run_id: Annotated[str | None, typer.Option("--run-id")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help=_CLUSTER_HELP)] = None,
) -> None:
    """Create a run and grade its submissions as they arrive."""
    definition = environment_definition(env)
    definition.load_task(task)  # a bad task fails here, before a run directory exists
    settings = load_settings()
    spec = start_spec(run_id or run_dir.name, env, task, hours, settings)
    run = RunDirectory.create(run_dir, spec, grader_version=definition.grader_version)
    try:
        _serve(run, eval_workers or settings.harness.eval_workers, watch, cluster)
    finally:
        run.close()


def resume(
    run_dir: Annotated[Path, typer.Argument(help="Existing run directory.")],
    eval_workers: Annotated[int | None, typer.Option("--eval-workers")] = None,
    watch: Annotated[Path | None, typer.Option("--watch")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help=_CLUSTER_HELP)] = None,
) -> None:
    """Continue a run after a crash: replay the journal, grade what was not graded, keep serving.

    A run started by `agentinfra run` also resumes its agent from its last completed turn.
    """
    run = RunDirectory.open(run_dir)
    try:
        if isinstance(run.spec.agent.get("loop"), dict):
            from agentinfra.cli._agent import resume_agent

            resume_agent(run)
        else:
            _serve(run, eval_workers or load_settings().harness.eval_workers, watch, cluster)
    finally:
        run.close()


def submit(
    run_dir: Annotated[Path, typer.Argument(help="Run directory.")],
    file: Annotated[Path, typer.Argument(help="Submission file.")],
    turn: Annotated[int | None, typer.Option("--turn", help="Agent turn that produced it.")] = None,
) -> None:
    """Hand a submission to a run (graded now if the run is live, else on resume)."""
    RunDirectory.read_info(run_dir)
    if not file.is_file():
        raise ConfigError(f"submission {file} does not exist or is not a regular file")
    RunLayout(run_dir).drop(file.read_bytes(), file.name, turn)
    typer.echo(f"queued {file.name} for run {run_dir}")


def finish(run_dir: Annotated[Path, typer.Argument(help="Run directory.")]) -> None:
    """Ask the live run to grade what it has and stop."""
    RunDirectory.read_info(run_dir)
    RunLayout(run_dir).request_finish()
    typer.echo(f"asked run {run_dir} to finish")


def regrade_command(
    run_dir: Annotated[Path, typer.Argument(help="Run directory.")],
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="The environment's stricter grading (kernels: twice the seeds and timing pairs).",
        ),
    ] = False,
    eval_workers: Annotated[
        int | None,
        typer.Option("--eval-workers", help="Gradings at once (AGENTINFRA_EVAL_WORKERS)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Grade every submission again under the current (or a stricter) grader; report what changed."""
    run = RunDirectory.open(run_dir)
    try:
        spec = run.spec
        if strict:
            spec = spec.model_copy(update={"settings": _strict_settings(spec)})
        environment = open_environment(spec)
        with progress_view(err) as on_progress:
            changes = asyncio.run(
                regrade(
                    run,
                    environment,
                    workers=eval_workers or load_settings().harness.eval_workers,
                    on_progress=on_progress,
                )
            )
    finally:
        run.close()
    if as_json:
        typer.echo(json.dumps([{"seq": c.seq, "sha256": c.sha256, "old_outcome": c.old_outcome, "new_outcome": c.new_outcome,
                                "old_score": c.old_score, "new_score": c.new_score, "score_unit": environment.score.unit,
                                "changed": c.is_changed} for c in changes]))  # fmt: skip
        return
    unit, fmt = environment.score.unit, environment.score.format
    table = Table("#", "sha", "old", "new", f"old {unit}", f"new {unit}")
    for change in changes:
        style = "bold red" if change.is_changed else ""
        table.add_row(
            str(change.seq),
            change.sha256[:12],
            str(change.old_outcome),
            change.new_outcome,
            fmt(change.old_score),
            fmt(change.new_score),
            style=style,
        )
    Console().print(table)
    Console().print(f"{sum(c.is_changed for c in changes)} of {len(changes)} outcomes changed")


def _strict_settings(spec: RunSpec) -> dict[str, Any]:
    """The run's settings under its environment's strict-regrade rule (unchanged where it has none)."""
    definition = environment_definition(spec.environment)
    settings = definition.settings_of(spec.settings)
    if definition.strict_settings is None:
        err.print(
            f"note: {spec.environment} has no stricter grading; regrading as the run was graded"
        )
        return spec.settings
    strict: dict[str, Any] = definition.strict_settings(settings).model_dump(mode="json")
    return strict


def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory.")],
    remeasure: Annotated[
        bool,
        typer.Option(
            "--remeasure/--no-remeasure", help="Grade the best-so-far submissions again first."
        ),
    ] = True,
    out: Annotated[
        Path | None, typer.Option("--out", help="Directory for report.html and report.json.")
    ] = None,
) -> None:
    """Write report.html (self-contained) and report.json for a run."""
    run = RunDirectory.open(run_dir)
    try:
        environment = open_environment(run.spec)
        if remeasure:
            with progress_view(err) as on_progress:
                asyncio.run(remeasure_best(run, environment, on_progress=on_progress))
        json_path, html_path = write_report(run, environment.grader_version, environment.score, out)
    finally:
        run.close()
    typer.echo(f"wrote {html_path} and {json_path}")


def replay_run(
    recording: Annotated[
        Path, typer.Argument(help="A recorded run (directory with recording.json).")
    ],
    out: Annotated[Path, typer.Option("--out", help="New run directory.")],
    eval_workers: Annotated[
        int | None,
        typer.Option("--eval-workers", help="Gradings at once (AGENTINFRA_EVAL_WORKERS)."),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="The environment's quicker grading (kernels: fewer timing pairs; noisier).",
        ),
    ] = False,
) -> None:
    """Replay a recorded long-horizon run through the real harness and grader, then report."""
    settings = load_settings()
    definition = environment_definition(load_recording(recording)["environment"])
    chosen = definition.new_settings(settings)
    if quick and definition.quick_settings is not None:
        chosen = definition.quick_settings(chosen)
    elif quick:
        err.print(f"note: {definition.name} has no quicker grading; --quick changes nothing")
    eval_workers = eval_workers or settings.harness.eval_workers
    with progress_view(err) as on_progress:
        run = asyncio.run(
            replay_recording(recording, out, eval_workers=eval_workers,
                             settings=chosen.model_dump(mode="json"), on_progress=on_progress)
        )  # fmt: skip
        try:
            environment = open_environment(run.spec)
            asyncio.run(
                remeasure_best(run, environment, workers=eval_workers, on_progress=on_progress)
            )
            json_path, html_path = write_report(run, environment.grader_version, environment.score)
        finally:
            run.close()
    typer.echo(f"wrote {html_path} and {json_path}")


def register(app: typer.Typer) -> None:
    """Adds the run commands to the root app."""
    app.command("start")(start)
    app.command("resume")(resume)
    app.command("submit")(submit)
    app.command("finish")(finish)
    app.command("regrade")(regrade_command)
    app.command("report")(report)
    app.command("replay-run")(replay_run)
    from agentinfra.cli._agent import export_command, run_command, summary_command

    app.command("run")(run_command)
    app.command("export")(export_command)
    app.command("summary")(summary_command)

"""`agentinfra desktop tasks|run|audit`: OSWorld-format tasks on a real desktop.

With ``--json`` stdout carries exactly the documented objects (one per line for
``tasks`` and ``audit``, exactly one for ``run``). Exit 0 whenever a listing or
verdict was produced; 2 for a usage error, with one line on stderr.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from agentinfra._settings import load_settings
from agentinfra.environments.desktop import (
    DesktopConfig,
    audit,
    default_mirror,
    load_actions,
    load_desktop_task,
    run_scripted,
    selected_task_files,
    support,
)
from agentinfra.errors import ConfigError

__all__ = ["desktop_app"]

desktop_app = typer.Typer(help="OSWorld-format desktop tasks: list, run scripted episodes, audit.",
                          no_args_is_help=True)  # fmt: skip

MirrorOption = Annotated[
    Path | None,
    typer.Option(
        "--mirror",
        help="Local file mirror: OSWorld's cache directory as it is (a folder per task) or a flat one "
        "(default: AGENTINFRA_DESKTOP_MIRROR, else mirror/ beside the tasks folder).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output only.")]


def _mirror(option: Path | None) -> Path | None:
    """``--mirror``, else ``AGENTINFRA_DESKTOP_MIRROR`` (None: each task's `default_mirror`)."""
    return option or load_settings().desktop.mirror


TasksOption = Annotated[
    Path | None,
    typer.Option(
        "--tasks",
        help="A task list in OSWorld's format (test_all.json: {domain: [task id]}); PATH is then "
        "an OSWorld checkout or its evaluation_examples/ folder.",
    ),
]


def _task_files(paths: list[Path], selection: Path | None = None) -> list[Path]:
    if selection is not None:
        if len(paths) != 1 or not paths[0].is_dir():
            raise ConfigError(
                f"--tasks {selection} selects from one folder; got {', '.join(map(str, paths))}"
            )
        return selected_task_files(paths[0], selection)
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(path.glob("*.json"))
        elif path.is_file():
            found.append(path)
        else:
            raise ConfigError(f"task path {path} does not exist")
    if not found:
        raise ConfigError(f"no task files (*.json) under {', '.join(map(str, paths))}")
    return found


@desktop_app.command("tasks")
def tasks_command(paths: Annotated[list[Path], typer.Argument(help="Task files or folders.")],
                  mirror: MirrorOption = None, tasks: TasksOption = None,
                  as_json: JsonOption = False) -> None:  # fmt: skip
    """List tasks as supported or unsupported here, with the reason."""
    table = Table("task", "supported", "reason", "path")
    mirror = _mirror(mirror)
    for path in _task_files(paths, tasks):
        try:
            task = load_desktop_task(path)
            verdict = support(task, default_mirror(path, mirror))
            row = {
                "task_id": task.id,
                "path": str(path),
                "supported": verdict.supported,
                "reason": verdict.reason,
            }
        except Exception as exc:
            row = {
                "task_id": None,
                "path": str(path),
                "supported": False,
                "reason": f"refused: {exc}",
            }
        if as_json:
            print(json.dumps(row))
        else:
            table.add_row(
                str(row["task_id"]),
                "yes" if row["supported"] else "no",
                str(row["reason"]),
                str(path),
            )
    if not as_json:
        Console().print(table)


@desktop_app.command("run")
def run_command(
    task_path: Annotated[Path, typer.Argument(metavar="TASK.json", help="One task file.")],
    actions: Annotated[
        Path, typer.Option("--actions", help='ACTIONS.json: {"action_space", "actions"}.')
    ],
    mirror: MirrorOption = None,
    track: Annotated[
        str, typer.Option("--track", help="gui-only or code (pyautogui actions).")
    ] = "gui-only",
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Episode directory (default runs/desktop/<task>-<time>)."),
    ] = None,
    width: Annotated[int, typer.Option("--width")] = 1920,
    height: Annotated[int, typer.Option("--height")] = 1080,
    as_json: JsonOption = False,
) -> None:
    """Run one episode from a scripted action list and grade it."""
    if not actions.is_file():
        raise ConfigError(f"actions file {actions} does not exist (--actions)")
    try:
        document = json.loads(actions.read_text())
    except ValueError as exc:
        raise ConfigError(f"actions file {actions} is not JSON: {exc}") from exc
    space, steps = load_actions(document, source=str(actions))
    task = load_desktop_task(task_path)
    import time

    episode_dir = out or Path("runs") / "desktop" / f"{task.id}-{time.strftime('%Y%m%d-%H%M%S')}"
    verdict = run_scripted(task, space, steps, mirror=default_mirror(task_path, _mirror(mirror)), track=track,
                           episode_dir=episode_dir, config=DesktopConfig(width=width, height=height))  # fmt: skip
    if as_json:
        print(json.dumps(verdict.to_json()))
        return
    console = Console()
    colour = {"passed": "green", "failed": "yellow"}.get(verdict.outcome.value, "magenta")
    console.print(f"[bold {colour}]{verdict.outcome.value}[/]  score {verdict.score:g}  steps {verdict.steps}  "
                  f"track {verdict.track}  action space {verdict.action_space}")  # fmt: skip
    for finding in verdict.findings:
        console.print(f"  {finding.severity} {finding.check}: {finding.message}", highlight=False)
    console.print(f"[dim]episode: {verdict.episode_dir}[/]")


@desktop_app.command("audit")
def audit_command(
    paths: Annotated[list[Path], typer.Argument(help="Task files or folders.")],
    mirror: MirrorOption = None,
    tasks: TasksOption = None,
    desktops: Annotated[int, typer.Option("--desktops", help="Desktops at once.")] = 2,
    as_json: JsonOption = False,
) -> None:
    """Flag tasks a do-nothing or FAIL-only episode passes, or whose scripted solution fails."""
    if desktops < 1:
        raise ConfigError(f"--desktops must be at least 1, got {desktops}")
    rows = audit(_task_files(paths, tasks), _mirror(mirror), workers=desktops)
    table = Table("task", "do-nothing", "FAIL", "solution", "flagged", "reasons")
    for row in rows:
        if as_json:
            print(json.dumps(row.to_json()))
        else:
            table.add_row(row.task_id, *(f"{v:g}" if v is not None else "-" for v in
                          (row.do_nothing_score, row.fail_score, row.solution_score)),
                          "FLAGGED" if row.flagged else "ok", "; ".join(row.reasons))  # fmt: skip
    if not as_json:
        Console().print(table)

"""The root Typer app: global options, logging set-up and the `info` command.

Command groups (``kv``, ``grade``, ``run``, ``report`` ...) are attached here by the
modules that implement them; each command stays thin and calls a component's API.
Errors from agentinfra become a one-line message on stderr and exit status 2.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler

import agentinfra
from agentinfra._settings import load_settings
from agentinfra.cli._desktop import desktop_app
from agentinfra.cli._grade import grade_command
from agentinfra.cli._kv import kv_app
from agentinfra.cli._kv_server import register as register_kv_server
from agentinfra.cli._model_serve import register as register_model
from agentinfra.cli._rollouts import register as register_rollouts
from agentinfra.cli._runs import register as register_runs
from agentinfra.errors import AgentInfraError

__all__ = ["app", "main"]

app = typer.Typer(
    name="agentinfra",
    help="Infrastructure for running AI agents at scale.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"agentinfra {agentinfra.__version__}")
        raise typer.Exit()


def configure_logging(level: str) -> None:
    """Sends log records to stderr through rich; called once per CLI invocation."""
    logging.basicConfig(
        level=level.upper(),
        format="%(message)s",
        handlers=[RichHandler(console=err_console, show_path=False)],
        force=True,
    )


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="Print the version."
        ),
    ] = False,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            help="DEBUG, INFO, WARNING or ERROR (default: $AGENTINFRA_LOG_LEVEL or WARNING).",
        ),
    ] = None,
) -> None:
    """Infrastructure for running AI agents at scale."""
    level = (log_level or load_settings().log_level).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise typer.BadParameter(
            f"{level!r} is not one of DEBUG, INFO, WARNING, ERROR", param_hint="--log-level"
        )
    configure_logging(level)


def _torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


@app.command()
def info(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Show versions, the machine, and the settings read from AGENTINFRA_* variables."""
    settings = load_settings()
    facts = {
        "agentinfra": agentinfra.__version__,
        "python": platform.python_version(),
        "torch": _torch_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "kv_block_size_tokens": settings.kvcache.block_size_tokens,
        "kv_memory_capacity_bytes": settings.kvcache.memory_capacity_bytes,
        "grader_timeout_s": settings.grader.timeout_s,
        "eval_workers": settings.harness.eval_workers,
    }
    if as_json:
        typer.echo(json.dumps(facts))
        return
    console = Console()
    for key, value in facts.items():
        console.print(f"[bold]{key:>26}[/bold]  {value}")


register_kv_server(kv_app)
app.add_typer(kv_app, name="kv")
app.add_typer(desktop_app, name="desktop")
app.command("grade")(grade_command)
register_runs(app)
register_rollouts(app)
register_model(app)


def main() -> None:
    """Console-script entry point: runs the app, turning agentinfra errors into exit 2."""
    try:
        app()
    except AgentInfraError as exc:
        message = " ".join(str(exc).split())  # always one line, never wrapped
        err_console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
        sys.exit(2)

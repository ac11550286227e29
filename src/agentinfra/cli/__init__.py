"""The `agentinfra` command line: one Typer app with thin commands.

Logging is configured here and nowhere else.
"""

from agentinfra.cli._app import app, main

__all__ = ["app", "main"]

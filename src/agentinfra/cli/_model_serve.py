"""`agentinfra model serve`: vLLM's OpenAI server for a model, with the right tool parser, template and connector.

The policy `agentinfra run` and `agentinfra rollouts` talk to, in one command::

    agentinfra model serve                       # SmolLM2-135M-Instruct (`make smollm2`)
    agentinfra model serve --model ./checkpoint  # a Hugging Face checkpoint directory

The tool-call format follows the checkpoint's ``config.json``: a MiniMax M2 family
model gets vLLM's ``minimax_m2`` tool and reasoning parsers (its own template); every
other model gets the Hermes parser with agentinfra's ChatML + Hermes tools template
(`agentinfra.engines.hermes_chat_template`). ``--kv-url HOST:PORT`` loads agentinfra's
KV connector over a running ``agentinfra kv serve``. The server binds to loopback on a
free port (`VllmServer` picks it) and the base URL is printed on stdout.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from agentinfra.engines import SMOLLM2_NAME, VllmServer, smollm2_dir
from agentinfra.errors import ConfigError

__all__ = ["model_app", "tool_format"]

model_app = typer.Typer(help="Serve a model for agents and rollouts (vLLM).", no_args_is_help=True)


def tool_format(checkpoint: Path) -> str:
    """``minimax_m2`` for a MiniMax M2 family checkpoint, else ``hermes`` (from its ``config.json``).

    Raises:
        ConfigError: the directory has no readable ``config.json``.
    """
    try:
        config = json.loads((checkpoint / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{checkpoint} has no readable config.json ({exc}); give a checkpoint directory (--model)"
        ) from None
    names = [str(config.get("model_type", "")), *map(str, config.get("architectures") or [])]
    return "minimax_m2" if any("minimax" in name.lower() for name in names) else "hermes"


@model_app.command("serve")
def serve_command(
    model: Annotated[
        str, typer.Option("--model", help="smollm2, or a checkpoint directory.")
    ] = "smollm2",
    served_name: Annotated[
        str | None,
        typer.Option(
            "--served-name",
            help="The name clients send (default: SmolLM2's hub name, or the directory's).",
        ),
    ] = None,
    kv_url: Annotated[
        str | None,
        typer.Option(
            "--kv-url", help="HOST:PORT of `agentinfra kv serve`: load agentinfra's KV connector."
        ),
    ] = None,
    max_model_len: Annotated[
        int, typer.Option("--max-model-len", help="Context length the engine allows.")
    ] = 8192,
    log: Annotated[Path, typer.Option("--log", help="vLLM's output goes here.")] = Path(
        "vllm-serve.log"
    ),
    startup_timeout_s: Annotated[
        float, typer.Option("--startup-timeout", help="Seconds to wait for /v1/models.")
    ] = 600.0,
) -> None:
    """Start vLLM's OpenAI-compatible server for a model and print its base URL; Ctrl-C stops it."""
    if model == "smollm2":
        checkpoint, name = smollm2_dir(), served_name or SMOLLM2_NAME
    else:
        checkpoint = Path(model)
        if not checkpoint.is_dir():
            raise ConfigError(f"--model {model!r} is neither smollm2 nor a checkpoint directory")
        name = served_name or checkpoint.name
    tools = tool_format(checkpoint)
    typer.echo(
        f"starting vLLM for {checkpoint} ({tools} tool calls{', KV connector at ' + kv_url if kv_url else ''}); log: {log}",
        err=True,
    )
    with VllmServer(checkpoint, log=log, kv_url=kv_url, served_name=name, tools=tools,
                    max_model_len=max_model_len, startup_timeout_s=startup_timeout_s) as server:  # fmt: skip
        typer.echo(server.base_url)
        typer.echo(f"model {server.name!r} served at {server.base_url}; Ctrl-C stops it", err=True)
        stopped = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stopped.set())
        while not stopped.wait(1.0):
            if server.process.poll() is not None:
                raise ConfigError(
                    f"vLLM's server exited with {server.process.returncode}:\n{server.log_tail()}"
                )


def register(app: typer.Typer) -> None:
    """Adds ``agentinfra model`` to the root app."""
    app.add_typer(model_app, name="model")

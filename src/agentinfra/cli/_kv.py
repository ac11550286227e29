"""`agentinfra kv ...`: trace replay and trace generation for the KV-cache store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from agentinfra.errors import ConfigError
from agentinfra.kvcache import (
    DEFAULT_POLICY,
    POLICIES,
    AgentTraceConfig,
    belady_hit_rate,
    capacity_for_fraction,
    generate_agent_trace,
    read_trace,
    replay,
    unique_blocks,
    write_trace,
)

__all__ = ["kv_app"]

kv_app = typer.Typer(
    help="The KV-cache store: replay traces, serve blocks, inspect a server, demo prefill skipped.",
    no_args_is_help=True,
)


@kv_app.command("replay")
def replay_command(
    trace: Annotated[Path, typer.Argument(help="A JSONL trace in Mooncake's format.")],
    capacity_blocks: Annotated[
        int | None,
        typer.Option(
            "--capacity-blocks", help="Cache size in blocks (default: 10% of unique blocks)."
        ),
    ] = None,
    capacity_fraction: Annotated[
        float,
        typer.Option("--capacity-fraction", help="Cache size as a fraction of unique blocks."),
    ] = 0.1,
    policy: Annotated[
        str, typer.Option("--policy", help=f"One of {', '.join(sorted(POLICIES))}.")
    ] = DEFAULT_POLICY,
    block_tokens: Annotated[
        int, typer.Option("--block-tokens", help="Tokens per trace block.")
    ] = 512,
    cache_partial_blocks: Annotated[
        bool,
        typer.Option(
            "--cache-partial-blocks", help="Also cache a request's trailing partial block."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Replay a trace through one cache and compare with Belady's offline optimum."""
    if not trace.is_file():
        raise ConfigError(f"trace {trace} does not exist or is not a file")
    if policy not in POLICIES:
        raise ConfigError(
            f"unknown policy {policy!r}; choose one of {', '.join(sorted(POLICIES))} (--policy)"
        )
    requests = read_trace(trace)
    capacity = (
        capacity_blocks
        if capacity_blocks is not None
        else capacity_for_fraction(requests, capacity_fraction)
    )
    result = replay(
        requests,
        capacity_blocks=capacity,
        policy=policy,
        block_tokens=block_tokens,
        cache_partial_blocks=cache_partial_blocks,
    ).to_json()
    if as_json:
        typer.echo(json.dumps(result))
        return
    table = Table(title=f"replay of {trace.name}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("requests", "blocks", "unique_blocks", "capacity_blocks", "policy", "hit_rate",
                "belady_hit_rate", "ratio_to_belady", "evicted_blocks", "prefill_s_saved"):  # fmt: skip
        value = result[key]
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    Console().print(table)


@kv_app.command("compare")
def compare_command(
    trace: Annotated[Path, typer.Argument(help="A JSONL trace in Mooncake's format.")],
    capacity_fraction: Annotated[
        list[float] | None,
        typer.Option(
            "--capacity-fraction", help="Cache size(s) as fractions of unique blocks (repeatable)."
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per line.")
    ] = False,
) -> None:
    """Replay a trace under every shipped policy and Belady's optimum, side by side."""
    if not trace.is_file():
        raise ConfigError(f"trace {trace} does not exist or is not a file")
    requests = read_trace(trace)
    fractions = capacity_fraction or [0.05, 0.1, 0.2]
    table = Table(
        title=f"{trace.name}: {len(requests)} requests, {unique_blocks(requests)} unique blocks"
    )
    table.add_column("capacity")
    table.add_column("belady", justify="right")
    for name in sorted(POLICIES):
        table.add_column(name + (" (default)" if name == DEFAULT_POLICY else ""), justify="right")
    with Progress(transient=True, console=Console(stderr=True)) as progress:
        task = progress.add_task("replaying", total=len(fractions) * (len(POLICIES) + 1))
        for fraction in fractions:
            capacity = capacity_for_fraction(requests, fraction)
            optimum = belady_hit_rate(requests, capacity)
            progress.advance(task)
            cells = [f"{fraction:.0%} ({capacity} blocks)", f"{optimum:.3f}"]
            for name in sorted(POLICIES):
                hit = replay(
                    requests, capacity_blocks=capacity, policy=name, with_belady=False
                ).hit_rate
                progress.advance(task)
                cells.append(f"{hit:.3f} ({hit / optimum:.0%} of opt)" if optimum else f"{hit:.3f}")
                if as_json:
                    typer.echo(json.dumps({"capacity_fraction": fraction, "capacity_blocks": capacity,
                                           "policy": name, "hit_rate": hit, "belady_hit_rate": optimum}))  # fmt: skip
            table.add_row(*cells)
    if not as_json:
        Console().print(table)


@kv_app.command("gen-trace")
def gen_trace_command(
    output: Annotated[Path, typer.Argument(help="Where to write the JSONL trace.")],
    sessions: Annotated[int, typer.Option("--sessions", help="Agent sessions to generate.")] = 200,
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """Generate a synthetic agent-session trace (growing contexts, tool pauses, sub-agents)."""
    rows = generate_agent_trace(AgentTraceConfig(sessions=sessions, seed=seed))
    write_trace(rows, output)
    typer.echo(f"wrote {len(rows)} requests from {sessions} sessions to {output}")

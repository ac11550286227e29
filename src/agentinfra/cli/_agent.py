"""`agentinfra run` (agents on many tasks at once) and `agentinfra export` (training data)."""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import json
import re
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from agentinfra._settings import load_settings
from agentinfra.agent import EndpointLimiter, LoopConfig, preflight, probe_tokens
from agentinfra.cli._runs import DEFAULT_ENVIRONMENT, EnvOption
from agentinfra.environments import (
    Anomaly,
    EnvironmentDefinition,
    environment_definition,
    environment_names,
)
from agentinfra.errors import AgentInfraError, ConfigError
from agentinfra.harness import (
    AgentRunState,
    RunDirectory,
    agent_run_spec,
    api_key_from_env,
    export_record,
    find_anomalies,
    run_agents,
    write_summary,
)

__all__ = ["export_command", "resume_agent", "run_command", "summary_command"]

err = Console(stderr=True)


def _table(states: list[AgentRunState]) -> Table:
    table = Table(title=f"{len(states)} agent runs")
    for column in ("run", "status", "turn", "tokens", "submitted", "graded", "best"):
        table.add_column(column)
    for s in states:
        best = "-" if s.best_score is None else f"{s.best_score:.2f}{s.score_suffix}"
        status = s.status if s.error is None else f"failed: {s.error[:60]}"
        table.add_row(
            s.run_id,
            status[:70],
            str(s.turn),
            str(s.tokens),
            str(s.submissions),
            str(s.graded),
            best,
        )
    return table


def _prices(path: Path | None, model: str) -> tuple[float | None, float | None]:
    if path is None:
        return None, None
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read prices from {path}: {exc} (--prices)") from None
    entry = table.get(model)
    if entry is None:
        return None, None
    try:
        return float(entry["input_per_mtok"]), float(entry["output_per_mtok"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(
            f"{path}: {model} needs input_per_mtok and output_per_mtok numbers (--prices)"
        ) from None


def run_command(
    tasks: Annotated[
        list[str],
        typer.Option("--tasks", help="Task files or globs, e.g. 'examples/kernels/problems/*.py'."),
    ],
    model: Annotated[str, typer.Option("--model", help="Model name at the endpoint.")],
    base_url: Annotated[
        str,
        typer.Option(
            "--base-url",
            help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1; several serving the "
            "same model, comma-separated: each run sticks to one (session affinity).",
        ),
    ],
    env: EnvOption = DEFAULT_ENVIRONMENT,
    api_key_env: Annotated[
        str, typer.Option("--api-key-env", help="Environment variable holding the API key.")
    ] = "OPENAI_API_KEY",
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", help="Runs at once (AGENTINFRA_AGENT_CONCURRENCY)."),
    ] = None,
    hours: Annotated[float, typer.Option("--hours", help="Wall-clock budget per run.")] = 12.0,
    max_turns: Annotated[
        int | None, typer.Option("--max-turns", help="Model calls per run.")
    ] = 200,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", help="Prompt + completion tokens per run.")
    ] = None,
    max_cost: Annotated[
        float | None, typer.Option("--max-cost", help="USD per run (needs prices).")
    ] = None,
    price_in: Annotated[
        float | None, typer.Option("--price-in", help="USD per million prompt tokens.")
    ] = None,
    price_out: Annotated[
        float | None, typer.Option("--price-out", help="USD per million completion tokens.")
    ] = None,
    prices: Annotated[
        Path | None,
        typer.Option("--prices", help="JSON {model: {input_per_mtok, output_per_mtok}}."),
    ] = None,
    stream: Annotated[
        bool, typer.Option("--stream/--no-stream", help="Stream replies (SSE).")
    ] = True,
    context_tokens: Annotated[
        int, typer.Option("--context-tokens", help="The model's context length.")
    ] = 196_608,
    max_output_tokens: Annotated[int | None, typer.Option("--max-output-tokens")] = None,
    nudges: Annotated[
        int,
        typer.Option(
            "--nudges",
            help="Replies with no tool call answered with a reminder (in all) before one ends the run.",
        ),
    ] = 0,
    rpm: Annotated[
        float | None,
        typer.Option("--rpm", help="Requests per minute to the endpoint, all runs together."),
    ] = None,
    runs_dir: Annotated[
        Path | None,
        typer.Option("--runs-dir", help="Where run directories go (AGENTINFRA_RUNS_DIR)."),
    ] = None,
    eval_workers: Annotated[
        int, typer.Option("--eval-workers", help="Gradings at once per run.")
    ] = 1,
    env_option: Annotated[
        list[str] | None,
        typer.Option(
            "--env-option",
            help="An option of the environment's agent, KEY=VALUE (repeatable), e.g. track=code.",
        ),
    ] = None,
    action_space: Annotated[
        str | None,
        typer.Option("--action-space", help="desktop: computer_use, computer_13 or pyautogui."),
    ] = None,
    track: Annotated[str | None, typer.Option("--track", help="desktop: gui-only or code.")] = None,
    observation: Annotated[
        str | None, typer.Option("--observation", help="desktop: screenshot, a11y or both.")
    ] = None,
    screenshot_width: Annotated[
        int | None,
        typer.Option("--screenshot-width", help="desktop: screenshots downscaled to this width."),
    ] = None,
    keep_screenshots: Annotated[
        int | None,
        typer.Option("--keep-screenshots", help="Keep only the last K images in the context."),
    ] = None,
    desktops: Annotated[
        int | None, typer.Option("--desktops", help="desktop: live desktops at once (default 2).")
    ] = None,
    policy_version: Annotated[
        str | None,
        typer.Option(
            "--policy-version",
            help="The version of the weights the endpoint serves, recorded with every model call.",
        ),
    ] = None,
    capture_tokens: Annotated[
        bool | None,
        typer.Option(
            "--tokens/--no-tokens",
            help="Ask for the engine's token ids and logprobs; default: when the endpoint is vLLM.",
        ),
    ] = None,
    kv_hints: Annotated[
        str | None,
        typer.Option(
            "--kv-hints",
            help="HOST:PORT of the kv server under a vLLM with agentinfra's connector: each run is a KV "
            "session (its id sent with every request), closed there when the run stops.",
        ),
    ] = None,
) -> None:
    """Run one agent per task against an OpenAI-compatible model, many at once; each run is graded as it goes."""
    definition = environment_definition(env)
    flags = {"action_space": action_space, "track": track, "observation": observation,
             "screenshot_width": screenshot_width, "desktops": desktops}  # fmt: skip
    # checked before any run is created:
    options = _agent_options(definition, flags, env_option or [])
    files = sorted({Path(p) for pattern in tasks for p in (glob.glob(pattern) or [pattern])})
    missing = [str(p) for p in files if not p.is_file()]
    if missing or not files:
        raise ConfigError(f"no task file at {', '.join(missing) or tasks} (--tasks)")
    for task in files:
        definition.load_task(task)  # every task is checked before any run is created
    settings = load_settings()
    file_in, file_out = _prices(prices, model)
    config = LoopConfig(
        model=model, base_url=base_url.rstrip("/"), api_key_env=api_key_env, stream=stream, max_turns=max_turns,
        max_tokens=max_tokens, max_cost_usd=max_cost, wall_hours=hours, context_tokens=context_tokens,
        max_output_tokens=max_output_tokens, price_in_per_mtok=price_in if price_in is not None else file_in,
        price_out_per_mtok=price_out if price_out is not None else file_out,
        request_timeout_s=settings.agent.request_timeout_s, keep_images=keep_screenshots,
        kv_session=kv_hints is not None, nudges=nudges, policy_version=policy_version,
    )  # fmt: skip
    kv_server = _kv_address(kv_hints) if kv_hints is not None else None
    api_key = api_key_from_env(api_key_env)
    jobs = concurrency or settings.agent.concurrency
    asyncio.run(
        preflight(base_url=config.base_url, model=model, api_key=api_key, api_key_env=api_key_env)
    )
    if capture_tokens is False:
        config = dataclasses.replace(config, capture_tokens=False)
    else:
        support = asyncio.run(
            probe_tokens(
                base_url=config.base_url, model=model, api_key=api_key, force=bool(capture_tokens)
            )
        )
        err.print(f"tokens: {support.detail}")
        config = dataclasses.replace(config, capture_tokens=support.is_available)
    root = runs_dir or settings.harness.runs_dir
    stamp = time.strftime("%Y%m%d-%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model.split("/")[-1])
    run_settings = definition.new_settings(settings)
    runs = []
    for task in files:
        run_id = f"{task.stem}-{slug}-{stamp}"
        spec = agent_run_spec(run_id, task, config, run_settings, environment=env, options=options)
        runs.append(
            RunDirectory.create(root / run_id, spec, grader_version=definition.grader_version)
        )
    err.print(f"{len(runs)} run(s) under {root}; concurrency {jobs}")
    try:
        with Live(_table([]), console=err, refresh_per_second=2) as live:
            states = asyncio.run(
                run_agents(
                    runs, api_key=api_key, concurrency=jobs,
                    limiter=EndpointLimiter(max_in_flight=jobs, rpm=rpm),
                    eval_workers=eval_workers, on_change=lambda s: live.update(_table(s)),
                )
            )  # fmt: skip
    finally:
        for run in runs:
            run.close()
        if kv_server is not None:
            _close_kv_sessions(kv_server, [r.spec.run_id for r in runs])
    failed = [s for s in states if s.error]
    err.print()
    _, summary = write_summary([r.path for r in runs], root / "summaries" / f"{slug}-{stamp}")
    err.print(
        f"done: {len(states) - len(failed)} stopped normally, {len(failed)} failed; summary: {summary}; "
        f"`agentinfra export {root}/*` writes the training data"
    )
    if failed:
        raise typer.Exit(1)


def _agent_options(
    definition: EnvironmentDefinition[Any], flags: dict[str, Any], pairs: list[str]
) -> dict[str, Any]:
    """The run's agent options: ``--env-option KEY=VALUE`` pairs, then the named flags that were
    given, checked by the environment's agent-options model."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"--env-option {pair!r} must be KEY=VALUE, e.g. --env-option track=code"
            )
        options[key.strip().replace("-", "_")] = value
    for key, value in flags.items():
        if value is None:
            continue
        if key not in definition.agent_options.model_fields:
            raise ConfigError(
                f"--{key.replace('_', '-')} is {_owners(key)} option; this run's --env is {definition.name}"
            )
        options[key] = value
    return definition.options_of(options)


def _owners(option: str) -> str:
    """Which registered environments' agents take ``option``, for an error message ("a desktop")."""
    owners = []
    for name in environment_names():
        try:
            if option in environment_definition(name).agent_options.model_fields:
                owners.append(name)
        except ConfigError:  # an entry point that does not load takes no part in the message
            continue
    return f"a {' or '.join(owners)}" if owners else "no registered environment's"


def _kv_address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"--kv-hints {value!r} must be HOST:PORT of `agentinfra kv serve`, e.g. 127.0.0.1:7480"
        )
    return host, int(port)


def _close_kv_sessions(server: tuple[str, int], sessions: list[str]) -> None:
    """The runs are done: their KV sessions are closed (private blocks leave memory); a failure is only a note."""
    from agentinfra.kvcache import CacheClient

    try:
        with CacheClient(*server, timeout_s=5.0) as client:
            for session in sessions:
                client.session(session, "close")
    except AgentInfraError as exc:
        err.print(f"note: could not close the runs' KV sessions at {server[0]}:{server[1]}: {exc}")


def resume_agent(run: RunDirectory) -> None:
    """Continues an agent run after a crash: grading queue and agent, each from its journal."""
    config = LoopConfig.from_json(run.spec.agent["loop"])
    api_key = api_key_from_env(config.api_key_env)
    with Live(_table([]), console=err, refresh_per_second=2) as live:
        (state,) = asyncio.run(
            run_agents(
                [run], api_key=api_key, concurrency=1, limiter=EndpointLimiter(),
                on_change=lambda states: live.update(_table(states)),
            )
        )  # fmt: skip
    if state.failure is not None:
        raise state.failure
    outcome = state.outcome
    err.print(
        f"agent stopped: {outcome.stop_reason if outcome else 'unknown'} after {state.turn} turns"
    )


def export_command(
    runs: Annotated[list[Path], typer.Argument(help="Run directories of `agentinfra run`.")],
    fmt: Annotated[str, typer.Option("--format", help="Output format.")] = "jsonl",
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write here instead of stdout; images go to images/ beside it."),
    ] = None,
    audit: Annotated[
        Path | None,
        typer.Option("--audit", help="desktop: `agentinfra desktop audit --json` output."),
    ] = None,
) -> None:
    """Write one training record per run (messages, tools, rewards from trusted verdicts, anomalies, usage)."""
    if fmt != "jsonl":
        raise ConfigError(f"--format {fmt!r} is not supported; use jsonl")
    records: list[dict[str, Any]] = []
    paths = [p for p in runs if (p / "run.json").is_file()]
    skipped = len(runs) - len(paths)
    anomalies: dict[str, list[Anomaly]] = {}
    for anomaly in find_anomalies(paths, audit):
        anomalies.setdefault(anomaly.run, []).append(anomaly)
    images_dir = None if out is None else out.parent / "images"
    for path in paths:
        try:
            records.append(
                export_record(path, images_dir=images_dir, anomalies=anomalies.get(str(path), []))
            )
        except AgentInfraError as exc:
            if len(runs) == 1:
                raise
            err.print(f"skipping {path}: {exc}")
            skipped += 1
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if out is None:
        sys.stdout.write(lines)
    else:
        out.write_text(lines)
    images = f"; images in {images_dir}" if images_dir is not None and images_dir.is_dir() else ""
    err.print(f"exported {len(records)} run(s){f', skipped {skipped}' if skipped else ''}{images}")


def summary_command(
    runs: Annotated[list[Path], typer.Argument(help="Run directories of `agentinfra run`.")],
    out: Annotated[
        Path, typer.Option("--out", help="Directory for summary.html and summary.json.")
    ],
    audit: Annotated[
        Path | None,
        typer.Option("--audit", help="desktop: `agentinfra desktop audit --json` output."),
    ] = None,
    reports: Annotated[
        bool, typer.Option("--reports/--no-reports", help="Write each run's report first.")
    ] = True,
) -> None:
    """One page over many runs: score, turns, time and flags per task, anomalies linked to their step."""
    paths = [p for p in runs if (p / "run.json").is_file()]
    if not paths:
        raise ConfigError(f"no run directory among {', '.join(map(str, runs))} (no run.json)")
    _, html_path = write_summary(paths, out, audit=audit, reports=reports)
    typer.echo(f"wrote {html_path}")

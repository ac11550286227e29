"""`agentinfra rollouts run|serve`: groups of RL rollouts, one trajectory each, locally or as a service."""

from __future__ import annotations

import asyncio
import glob
import ipaddress
import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from agentinfra._settings import load_settings
from agentinfra.agent import preflight, probe_tokens
from agentinfra.cli._agent import _agent_options, _close_kv_sessions, _kv_address
from agentinfra.cli._runs import DEFAULT_ENVIRONMENT, EnvOption
from agentinfra.environments import environment_definition
from agentinfra.errors import ConfigError
from agentinfra.harness import api_key_from_env
from agentinfra.kvcache import load_token_file
from agentinfra.rollouts import (
    Group,
    GroupRequest,
    RayPlacement,
    RolloutService,
    ServiceConfig,
    new_group,
    run_groups,
)

__all__ = ["register", "rollouts_app"]

err = Console(stderr=True)
rollouts_app = typer.Typer(
    help="RL rollouts: groups of agent episodes, one trajectory each.", no_args_is_help=True
)


def group_request(**fields: Any) -> GroupRequest:
    """A `GroupRequest` from CLI values; a refused value is one `ConfigError` line naming its flag."""
    try:
        return GroupRequest(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = "--" + str(first["loc"][0]).replace("_", "-") if first["loc"] else "a flag"
        raise ConfigError(f"{flag} {first.get('input')!r}: {first['msg']}") from None


@rollouts_app.command("run")
def run_command(
    tasks: Annotated[list[str], typer.Option("--tasks", help="Task files or globs.")],
    group_size: Annotated[int, typer.Option("--group-size", help="Rollouts per task (G).")],
    model: Annotated[str, typer.Option("--model", help="Model name at the endpoint.")],
    base_url: Annotated[
        str,
        typer.Option(
            "--base-url",
            help="OpenAI-compatible endpoint (…/v1); several, comma-separated: runs stick to one each.",
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="JSONL file: one trajectory per line.")],
    env: EnvOption = DEFAULT_ENVIRONMENT,
    policy_version: Annotated[
        str | None, typer.Option("--policy-version", help="Recorded with every call.")
    ] = None,
    stream: Annotated[
        bool, typer.Option("--stream/--no-stream", help="Stream replies (SSE).")
    ] = True,
    api_key_env: Annotated[str, typer.Option("--api-key-env")] = "OPENAI_API_KEY",
    concurrency: Annotated[int, typer.Option("--concurrency", help="Rollouts at once.")] = 8,
    hours: Annotated[float, typer.Option("--hours", help="Wall-clock budget per rollout.")] = 12.0,
    max_turns: Annotated[int | None, typer.Option("--max-turns")] = 200,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens")] = None,
    max_output_tokens: Annotated[int | None, typer.Option("--max-output-tokens")] = None,
    context_tokens: Annotated[int, typer.Option("--context-tokens")] = 196_608,
    nudges: Annotated[int, typer.Option("--nudges")] = 0,
    max_retries: Annotated[
        int,
        typer.Option("--max-retries", help="Retries of a failed model call before model_error."),
    ] = 6,
    eval_workers: Annotated[int, typer.Option("--eval-workers")] = 1,
    grading_slots: Annotated[
        int | None,
        typer.Option(
            "--grading-slots",
            help="Cores gradings of all rollouts may occupy at once (default: this machine's CPUs less one).",
        ),
    ] = None,
    runs_dir: Annotated[
        Path | None, typer.Option("--runs-dir", help="Where run directories go.")
    ] = None,
    env_option: Annotated[
        list[str] | None, typer.Option("--env-option", help="KEY=VALUE (repeatable).")
    ] = None,
    kv_hints: Annotated[
        str | None,
        typer.Option(
            "--kv-hints",
            help="HOST:PORT of the kv server under vLLM: each rollout is a KV session.",
        ),
    ] = None,
    capture_tokens: Annotated[
        bool | None,
        typer.Option(
            "--tokens/--no-tokens",
            help="Ask the engine for token ids (default: when the probe finds it returns them).",
        ),
    ] = None,
) -> None:
    """Run G rollouts per task (a group each) and write one trajectory per line; exit 0 when every rollout gave one."""
    if concurrency < 1:
        raise ConfigError(f"--concurrency {concurrency} must be >= 1")
    if grading_slots is not None and grading_slots < 1:
        raise ConfigError(f"--grading-slots {grading_slots} must be >= 1")
    definition = environment_definition(env)
    options = _agent_options(definition, {}, env_option or [])
    files = sorted({Path(p) for pattern in tasks for p in (glob.glob(pattern) or [pattern])})
    missing = [str(p) for p in files if not p.is_file()]
    if missing or not files:
        raise ConfigError(f"no task file at {', '.join(missing) or tasks} (--tasks)")
    for task in files:
        definition.load_task(task)
    settings = load_settings()
    requests = [
        group_request(
            environment=env,
            task=str(task.resolve()),
            group_size=group_size,
            model=model,
            base_url=base_url,
            api_key_env=api_key_env,
            policy_version=policy_version,
            stream=stream,
            max_turns=max_turns,
            max_tokens=max_tokens,
            hours=hours,
            context_tokens=context_tokens,
            max_output_tokens=max_output_tokens,
            nudges=nudges,
            max_retries=max_retries,
            options=options,
            request_timeout_s=settings.agent.request_timeout_s,
            kv_session=kv_hints is not None,
            tokens=capture_tokens,
        )
        for task in files
    ]
    for request in requests:
        request.loop_config()  # a value the loop refuses is refused before anything starts
    kv_server = _kv_address(kv_hints) if kv_hints is not None else None
    api_key = api_key_from_env(api_key_env)
    asyncio.run(
        preflight(
            base_url=base_url.rstrip("/"), model=model, api_key=api_key, api_key_env=api_key_env
        )
    )
    support = (
        asyncio.run(probe_tokens(base_url=base_url.rstrip("/"), model=model, api_key=api_key,
                                 force=bool(capture_tokens)))
        if capture_tokens is not False else None
    )  # fmt: skip
    if support is not None:
        err.print(f"tokens: {support.detail}")
    capture = support is not None and support.is_available
    root = (runs_dir or settings.harness.runs_dir) / f"rollouts-{time.strftime('%Y%m%d-%H%M%S')}"
    groups = [new_group(request, capture_tokens=capture) for request in requests]
    total = sum(len(g.rollout_ids) for g in groups)
    err.print(
        f"{len(groups)} group(s) of {group_size}: {total} rollouts under {root}; concurrency {concurrency}"
    )
    kinds: Counter[str] = Counter()
    with out.open("w") as sink:

        def write(trajectory: dict[str, Any]) -> None:
            sink.write(json.dumps(trajectory, ensure_ascii=False) + "\n")
            sink.flush()
            failure = trajectory.get("infra_failure")
            kinds[failure.get("kind", "?") if isinstance(failure, dict) else "ok"] += 1

        try:
            done = asyncio.run(
                run_groups(
                    groups,
                    root,
                    settings=settings,
                    api_key=api_key,
                    concurrency=concurrency,
                    on_trajectory=write,
                    eval_workers=eval_workers,
                    grading_slots=grading_slots,
                )
            )
        finally:
            if kv_server is not None:
                _close_kv_sessions(kv_server, [r for g in groups for r in g.rollout_ids])
    err.print(
        f"{done} of {total} trajectories in {out}; "
        + ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items()))
    )
    if done != total:
        raise typer.Exit(1)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _resources(pairs: list[str], flag: str) -> dict[str, float]:
    """``NAME=AMOUNT`` pairs as a dict; a malformed one is one `ConfigError` line naming ``flag``."""
    found: dict[str, float] = {}
    for pair in pairs:
        name, _, amount = pair.partition("=")
        try:
            found[name.strip()] = float(amount)
        except ValueError:
            raise ConfigError(f"{flag} {pair!r} must be NAME=AMOUNT (such as grading=1)") from None
    return found


@rollouts_app.command("serve")
def serve_command(
    host: Annotated[
        str, typer.Option(help="Address to bind; loopback unless told otherwise.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port.")] = 7490,
    token_file: Annotated[
        Path | None,
        typer.Option("--token-file", help="Lines 'TENANT TOKEN' (as kv serve); requests need one."),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            help="Journal, trajectories and run directories (default RUNS_DIR/rollouts-service).",
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Rollouts at once.")] = 8,
    max_pending: Annotated[
        int, typer.Option("--max-pending", help="Rollouts queued or running before 429.")
    ] = 64,
    max_grades: Annotated[
        int, typer.Option("--max-grades", help="POST /v1/grade gradings at once.")
    ] = 4,
    grade_timeout_s: Annotated[
        float, typer.Option("--grade-timeout", help="Seconds before a grading is an infra failure.")
    ] = 600.0,
    grading_slots: Annotated[
        int | None,
        typer.Option(
            "--grading-slots",
            help="Cores gradings of all rollouts may occupy at once (default: this machine's CPUs less one).",
        ),
    ] = None,
    check_endpoint: Annotated[
        bool,
        typer.Option(
            "--check-endpoint/--no-check-endpoint", help="Preflight a group's endpoint and model."
        ),
    ] = True,
    kv_hints: Annotated[
        str | None,
        typer.Option(
            "--kv-hints", help="HOST:PORT of the kv server: groups' KV sessions closed when done."
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Run each rollout as a task on this Ray cluster: auto, local, or HOST:PORT of its head "
            "(state_dir must be on a file system every node sees at the same path).",
        ),
    ] = None,
    ray_episode_cpus: Annotated[
        float | None,
        typer.Option("--ray-episode-cpus", help="CPUs per episode (default: desktop 2, else 1)."),
    ] = None,
    ray_episode_memory_gib: Annotated[
        float | None,
        typer.Option(
            "--ray-episode-memory-gib", help="Memory per episode (default: desktop 8, else none)."
        ),
    ] = None,
    ray_episode_resource: Annotated[
        list[str] | None,
        typer.Option(
            "--ray-episode-resource",
            help="NAME=AMOUNT a custom Ray resource per episode (repeatable).",
        ),
    ] = None,
    ray_grading_cpus: Annotated[
        float | None,
        typer.Option(
            "--ray-grading-cpus", help="CPUs per grading (default: the grader's threads)."
        ),
    ] = None,
    ray_grading_gpus: Annotated[
        float, typer.Option("--ray-grading-gpus", help="GPUs per CUDA grading.")
    ] = 1.0,
    ray_grading_resource: Annotated[
        list[str] | None,
        typer.Option(
            "--ray-grading-resource",
            help="NAME=AMOUNT a custom Ray resource per grading (repeatable).",
        ),
    ] = None,
    ray_node_retries: Annotated[
        int,
        typer.Option(
            "--ray-node-retries",
            help="Resumes of a rollout whose node died before it is labelled node_lost.",
        ),
    ] = 1,
    desktop_pool: Annotated[
        int,
        typer.Option(
            "--desktop-pool",
            help="Desktops kept started for desktop episodes (0: each starts its own).",
        ),
    ] = 0,
) -> None:
    """Serve groups of rollouts, cancels and idempotent gradings over HTTP (bearer tokens, Prometheus /metrics)."""
    if not _is_loopback(host) and token_file is None:
        raise ConfigError(
            f"--host {host} is not loopback: give --token-file so that not anyone can run agents here"
        )
    tokens = frozenset(load_token_file(token_file)) if token_file is not None else None
    settings = load_settings()
    config = ServiceConfig(
        state_dir=state_dir or settings.harness.runs_dir / "rollouts-service",
        host=host,
        port=port,
        concurrency=concurrency,
        max_pending=max_pending,
        max_grades_in_flight=max_grades,
        grade_timeout_s=grade_timeout_s,
        grading_slots=grading_slots,
        tokens=tokens,
        check_endpoint=check_endpoint,
        ray=None
        if ray_address is None
        else RayPlacement(
            address=ray_address,
            episode_cpus=ray_episode_cpus,
            episode_memory_bytes=None
            if ray_episode_memory_gib is None
            else int(ray_episode_memory_gib * 2**30),
            episode_resources=_resources(ray_episode_resource or [], "--ray-episode-resource"),
            grading_cpus=ray_grading_cpus,
            grading_gpus=ray_grading_gpus,
            grading_resources=_resources(ray_grading_resource or [], "--ray-grading-resource"),
            node_retries=ray_node_retries,
        ),
        desktop_pool=desktop_pool,
    )
    kv_server = _kv_address(kv_hints) if kv_hints is not None else None

    async def group_done(group: Group) -> None:
        if kv_server is not None:
            await asyncio.to_thread(_close_kv_sessions, kv_server, list(group.rollout_ids))

    async def serve() -> None:
        service = RolloutService(
            config, settings, api_key_of=api_key_from_env, on_group_done=group_done
        )
        await service.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        swept = (
            f"; swept {len(service.swept_uids)} orphaned jail uid(s)" if service.swept_uids else ""
        )
        typer.echo(
            f"serving rollouts on http://{host}:{service.port} (state in {config.state_dir}){swept}",
            err=True,
        )
        try:
            await stop.wait()
        finally:
            await service.close()

    asyncio.run(serve())


def register(app: typer.Typer) -> None:
    """Adds ``agentinfra rollouts`` to the root app."""
    app.add_typer(rollouts_app, name="rollouts")

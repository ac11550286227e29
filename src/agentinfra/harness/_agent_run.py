"""An agent inside a run: the loop submits to the run's harness, which grades as it goes.

Layout added to a run directory (paths from `RunLayout`)::

    agent/transcript.jsonl   the agent's journal (model replies, tool calls, retries, trims)
    agent/images/            images of tool results, stored once by content hash
    agent/workspace/         the agent's private files

The tools and prompts come from the run's environment (`Environment.agent_setup`).

The loop's settings live in ``run.json`` (``spec.agent``), so ``agentinfra
resume RUN`` restarts both the grading queue and the agent from their journals.
Official verdicts reach the agent as notes appended to its next tool result.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agentinfra.agent import (
    AgentLoop,
    AgentOutcome,
    EndpointLimiter,
    LoopConfig,
    ModelClient,
    Transcript,
    profile_for,
)
from agentinfra.environments import AgentHooks, Submission
from agentinfra.errors import ConfigError
from agentinfra.harness._executors import Executor, open_environment
from agentinfra.harness._queue import RunHarness, graded_score
from agentinfra.harness._rundir import RunDirectory
from agentinfra.harness._spec import Budget, RunSpec

__all__ = [
    "AgentRunState",
    "agent_run_spec",
    "api_key_from_env",
    "model_client_off_loop",
    "run_agent",
    "run_agents",
]


@dataclass
class AgentRunState:
    """What the progress view shows for one run."""

    run_id: str
    path: Path
    status: str = "queued"
    turn: int = 0
    tokens: int = 0
    submissions: int = 0
    graded: int = 0
    best_score: float | None = None
    score_suffix: str = ""
    outcome: AgentOutcome | None = None
    error: str | None = None
    waiting: str | None = None
    """What the run waits for (a desktop slot), shown instead of the loop's status."""
    failure: Exception | None = field(default=None, repr=False)
    """The exception that ended the run, for a caller that wants to raise it."""
    loop: AgentLoop | None = field(default=None, repr=False)


def api_key_from_env(name: str) -> str:
    """The API key in environment variable ``name``.

    Raises:
        ConfigError: the variable is unset or empty.
    """
    value = os.environ.get(name, "")
    if not value:
        raise ConfigError(
            f"environment variable {name} holds no API key (set it, or name another with --api-key-env)"
        )
    return value


def agent_run_spec(
    run_id: str,
    task: Path,
    config: LoopConfig,
    settings: BaseModel | Mapping[str, Any],
    *,
    environment: str,
    options: dict[str, Any] | None = None,
) -> RunSpec:
    """An agent run's spec: ``settings`` are ``environment``'s own (a model or its JSON)."""
    if isinstance(settings, BaseModel):
        settings = settings.model_dump(mode="json")
    return RunSpec(
        run_id=run_id,
        environment=environment,
        task=str(task.resolve()),
        agent={"loop": config.to_json(), **({"options": options} if options else {})},
        budget=Budget(
            wall_hours=config.wall_hours, tokens=config.max_tokens, cost_usd=config.max_cost_usd
        ),
        settings=dict(settings),
    )


def _completed_tool_calls(transcript: Transcript, names: Collection[str]) -> int:
    """How many results of the tools ``names`` the transcript holds (`AgentHooks.completed_tool_calls`)."""
    return sum(
        1 for e in transcript.events if e.type == "tool_result" and e.data.get("name") in names
    )


async def model_client_off_loop(**kwargs: Any) -> ModelClient:
    """`ModelClient` (``kwargs`` are its own), built in a worker thread.

    Building one builds an HTTP client and its TLS context, which reads the CA bundle: ~10 ms
    alone, ~60 ms on 2 busy cores, measured as the largest stall of the event loop that all
    agents share when 8 rollouts ran at once. OpenSSL releases the GIL while it reads.
    """
    return await asyncio.to_thread(lambda: ModelClient(**kwargs))


async def run_agent(
    run: RunDirectory,
    *,
    api_key: str,
    limiter: EndpointLimiter,
    eval_workers: int = 1,
    state: AgentRunState | None = None,
    executor: Executor | None = None,
) -> AgentOutcome:
    """Runs (or resumes) the agent of ``run`` until it stops; grading drains before returning.

    ``executor`` grades the run's submissions (default: in this process, fresh hidden seeds)."""
    loop_json = run.spec.agent.get("loop")
    if not isinstance(loop_json, dict):
        raise ConfigError(
            f"run {run.path} has no agent (it was started by `agentinfra start`, not `run`)"
        )
    config = LoopConfig.from_json(loop_json)
    state = state or AgentRunState(run.spec.run_id, run.path)
    notes: list[str] = []

    environment = open_environment(run.spec)
    unit = environment.score.unit
    state.score_suffix = environment.score.suffix

    def on_graded(sha: str, view: dict[str, Any]) -> None:
        seq = harness.state.received.get(sha, {}).get("seq", "?")
        graded = harness.state.graded.get(sha, {})
        shown = " ".join(f"{k}={v}" for k, v in view.items() if k in ("outcome", "correct", unit))
        notes.append(f"[grader] submission {sha[:12]} (event {seq}) scored: {shown or view}")
        state.graded = len(harness.state.graded)
        score = graded_score(graded)
        if graded.get("outcome") == "passed" and score is not None:
            state.best_score = max(state.best_score or 0.0, score)

    harness = RunHarness(
        run, environment, eval_workers=eval_workers, on_graded=on_graded, executor=executor
    )
    harness.recover()
    run.layout.agent_dir.mkdir(exist_ok=True)
    transcript = Transcript.open(run.layout.transcript)
    client = await model_client_off_loop(
        base_url=config.base_url, model=config.model, api_key=api_key, api_key_env=config.api_key_env,
        profile=profile_for(config.model), limiter=limiter, timeout_s=config.request_timeout_s,
        max_retries=config.max_retries, max_output_tokens=config.max_output_tokens,
        kv_session=run.spec.run_id if config.kv_session else None,
    )  # fmt: skip
    loop: AgentLoop | None = None

    async def submit(submission: Submission) -> str:
        name = submission.name
        receipt = await harness.submit_async(
            submission, source=f"agent:{name}", turn=loop.turn if loop else None
        )
        state.submissions = len(harness.state.received)
        if not receipt.is_new:
            return f"{name} is identical to submission {receipt.sha256[:12]}; it is graded once"
        return (
            f"submitted {name} as {receipt.sha256[:12]}; it is being graded with secret inputs, "
            "and the score will be appended to a later tool result"
        )

    async def results(wait_s: float) -> str:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and set(harness.state.received) - set(
            harness.state.graded
        ):
            await asyncio.sleep(0.2)
        notes.clear()  # everything they would say is in this answer
        lines = []
        for sha, sub in sorted(
            harness.state.received.items(), key=lambda item: item[1].get("seq", 0)
        ):
            verdict = harness.state.graded.get(sha)
            name = str(sub.get("source", "")).removeprefix("agent:")
            if verdict is None:
                lines.append(f"{sha[:12]} {name}: still being graded")
            else:
                lines.append(
                    f"{sha[:12]} {name}: outcome={verdict.get('outcome')} correct={verdict.get('correct')} "
                    f"{unit}={graded_score(verdict)}"
                )
        return "\n".join(lines) or "no submissions yet"

    setup = environment.agent_setup(
        run.layout.workspace,
        AgentHooks(
            submit=submit,
            results=results,
            options=dict(run.spec.agent.get("options") or {}),
            waiting=lambda reason: setattr(state, "waiting", reason),
            turn=lambda: loop.turn if loop is not None else None,
            completed_tool_calls=lambda names: _completed_tool_calls(transcript, names),
        ),
    )
    loop = AgentLoop(
        config=config, client=client, tools=setup.tools, system_prompt=setup.system_prompt,
        task_prompt=setup.task_prompt, transcript=transcript,
        notifications=lambda: [notes.pop(0) for _ in range(len(notes))],
    )  # fmt: skip
    state.loop = loop
    stop = asyncio.Event()
    serving = asyncio.create_task(harness.serve(stop=stop, poll_s=0.1))
    try:
        outcome = await loop.run()
    finally:
        if setup.close is not None:
            await setup.close()
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        # The harness leaves its loop on the run's budget, which it counts from the run's creation:
        # it can end before the agent, and a submission made at close (a desktop's final state)
        # would then wait in the queue with no worker. Not on cancellation: nothing waits then.
        task = asyncio.current_task()
        if set(harness.state.received) - set(harness.state.graded) and not (
            task is not None and task.cancelling()
        ):
            await harness.drain()
        await client.close()
        transcript.close()
    state.outcome = outcome
    state.graded = len(harness.state.graded)
    return outcome


async def run_agents(
    runs: Sequence[RunDirectory],
    *,
    api_key: str,
    concurrency: int,
    limiter: EndpointLimiter,
    eval_workers: int = 1,
    on_change: Callable[[list[AgentRunState]], None] | None = None,
) -> list[AgentRunState]:
    """Runs many agents on one event loop, at most ``concurrency`` at once; one failing run never stops the others."""
    states = [AgentRunState(r.spec.run_id, r.path) for r in runs]
    gate = asyncio.Semaphore(concurrency)

    async def one(run: RunDirectory, state: AgentRunState) -> None:
        async with gate:
            state.status = "running"
            try:
                await run_agent(
                    run, api_key=api_key, limiter=limiter, eval_workers=eval_workers, state=state
                )
                state.status = (
                    f"stopped: {state.outcome.stop_reason}" if state.outcome else "stopped"
                )
            except Exception as exc:  # recorded per run; the others go on
                state.status = "failed"
                state.error = f"{type(exc).__name__}: {exc}"
                state.failure = exc

    async def watch() -> None:
        while True:
            for state in states:
                if state.loop is not None:
                    state.turn = state.loop.turn
                    state.tokens = state.loop.usage.total
                    if state.outcome is None and state.error is None:  # still going
                        state.status = (
                            f"waiting: {state.waiting}" if state.waiting else state.loop.status
                        )
            if on_change is not None:
                on_change(states)
            await asyncio.sleep(0.5)

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(*(one(r, s) for r, s in zip(runs, states, strict=True)))
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    for state in states:
        if state.loop is not None:
            state.turn, state.tokens = state.loop.turn, state.loop.usage.total
    if on_change is not None:
        on_change(states)
    return states

"""An OpenEnv server over agentinfra's environments (openenv-core 0.3.0, ``make openenv-venv``).

A trainer that speaks OpenEnv (TRL, SkyRL, ART, Unsloth, verifiers' OpenEnv taskset)
opens one WebSocket session per episode with OpenEnv's own client, typed here as
`KernelEnvClient`:

- ``reset(task="11_slow_cumsum.py")``: a `KernelObservation` with the reference problem;
- ``step(KernelAction(code=..., final=False))``: the code is graded by agentinfra's
  trusted grader in its jails (never run in the server's process), with fresh hidden
  seeds; the observation says what a run's harness tells its agent (outcome, correct,
  speedup) and the result carries the reward; the episode ends on a ``final``
  submission or after ``--max-steps`` of them.

With ``--env desktop`` (or any environment other than kernels) a step is one call of the
environment's agent tools instead (`ToolAction`, `ToolObservation`, `ToolEnvClient`):
``reset(task=..., options={...})`` returns the task prompt and the tools' schemas, the
desktop's action tool returns the screenshot (base64 PNG) and accessibility text, and
``done``/``fail`` end the episode freeze first; the reward arrives only at the end
(`_openenv_tools`).

Rewards, the step budget and what an agent is shown are `_openenv_episodes`'s
(docs/decisions/0022-openenv-server.md). Sessions are concurrent
(``SUPPORTS_CONCURRENT_SESSIONS``), at most ``--max-sessions`` at once (the next is
refused with a message naming the knob); each has its own workspace, removed when it
closes or disconnects, and stopping the server closes every session left.
OpenEnv's stateless HTTP ``/reset`` and ``/step`` open and close an environment per
request, so episodes are WebSocket sessions only.

Serve with ``.venv/openenv/bin/python -m agentinfra.trainers.openenv --tasks DIR``
(loopback; another ``--host`` needs ``--allow-remote``: OpenEnv has no authentication); for the desktop, add ``--env desktop`` and set
``AGENTINFRA_DESKTOP_PYTHON=.venv/desktop/bin/python`` (from ``.venv/openenv`` the desktop
does not find its interpreter by itself). This module imports openenv; nothing else in agentinfra does.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from fastapi import FastAPI
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.exceptions import SessionCapacityError
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from agentinfra._settings import load_settings
from agentinfra.errors import ConfigError
from agentinfra.trainers._openenv_episodes import (
    EpisodeConfig,
    EpisodeHost,
    KernelEpisode,
    StepView,
    check_bind,
)
from agentinfra.trainers._openenv_tools import ToolEpisode, ToolView

__all__ = [
    "KernelAction",
    "KernelEnvClient",
    "KernelObservation",
    "KernelOpenEnv",
    "KernelState",
    "ToolAction",
    "ToolEnvClient",
    "ToolObservation",
    "ToolOpenEnv",
    "create_app",
    "main",
]

logger = logging.getLogger(__name__)


class KernelAction(Action):  # type: ignore[misc]
    """One submission: the source of a file defining ``ModelNew``."""

    code: str = Field(
        description="The submitted file's source (Python); graded, never run by the server"
    )
    name: str = Field(default="solution.py", description="The file's name, for the record")
    final: bool = Field(default=False, description="End the episode with this submission")


class KernelObservation(Observation):  # type: ignore[misc]
    """What the agent sees: the problem after a reset, a submission's verdict after a step."""

    task: str = Field(description="The task's file name")
    message: str = Field(description="The same in words")
    steps_left: int = Field(description="Submissions this episode still allows")
    problem: str | None = Field(default=None, description="The reference program (after a reset)")
    submission: str | None = Field(default=None, description="The submission's SHA-256, 12 digits")
    outcome: str | None = Field(
        default=None, description="passed, failed, hack_flagged, timeout, crashed, invalid"
    )
    correct: bool | None = Field(
        default=None, description="Outputs matched the reference on the secret inputs"
    )
    speedup: float | None = Field(default=None, description="The measured speedup, when measured")


class KernelState(State):  # type: ignore[misc]
    """A session's state: its task and how far its episode is."""

    task: str | None = None
    steps_left: int = 0
    done: bool = False


def _observation(view: StepView) -> KernelObservation:
    return KernelObservation(
        task=view.task, message=view.message, steps_left=view.steps_left, problem=view.problem,
        submission=view.submission, outcome=view.outcome, correct=view.correct, speedup=view.score,
        done=view.done, reward=view.reward,
    )  # fmt: skip


class _Session:
    """What both session kinds share: OpenEnv's synchronous calls refused, the state, the close."""

    episode: KernelEpisode

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> NoReturn:
        raise ConfigError(
            "this environment is asynchronous: use reset_async (OpenEnv's server does)"
        )

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> NoReturn:
        raise ConfigError(
            "this environment is asynchronous: use step_async (OpenEnv's server does)"
        )

    @property
    def state(self) -> KernelState:
        episode = self.episode
        return KernelState(episode_id=episode.session_id, step_count=episode.steps, task=episode.task,
                           steps_left=episode.steps_left, done=episode.is_done)  # fmt: skip

    def close(self) -> None:
        self.episode.close()


class KernelOpenEnv(_Session, Environment[KernelAction, KernelObservation, KernelState]):  # type: ignore[misc]
    """One OpenEnv session over a `KernelEpisode` of the server's `EpisodeHost`."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, host: EpisodeHost) -> None:
        super().__init__()
        self.episode: KernelEpisode = host.new_episode()

    async def reset_async(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> KernelObservation:
        """Starts an episode of ``task`` (a file name in the server's ``--tasks``); ``seed`` is
        not used: grading seeds are secret."""
        return _observation(self.episode.reset(kwargs.get("task")))

    async def step_async(
        self, action: KernelAction, timeout_s: float | None = None, **kwargs: Any
    ) -> KernelObservation:
        view = await self.episode.submit(action.code, name=action.name, final=action.final)
        return _observation(view)


class _Client:
    """What both typed clients share: the action sent whole, the observation of ``observation_class``."""

    observation_class: type[KernelObservation] | type[ToolObservation]

    def _step_payload(self, action: Action) -> dict[str, Any]:
        payload: dict[str, Any] = action.model_dump(exclude={"metadata"})
        return payload

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[Any]:
        observation = self.observation_class(
            **payload.get("observation", {}),
            reward=payload.get("reward"),
            done=payload.get("done", False),
        )
        return StepResult(
            observation=observation, reward=payload.get("reward"), done=bool(payload.get("done"))
        )

    def _parse_state(self, payload: dict[str, Any]) -> KernelState:
        return KernelState(**payload)


class KernelEnvClient(_Client, EnvClient[KernelAction, KernelObservation, KernelState]):  # type: ignore[misc]
    """OpenEnv's WebSocket client, typed for this server: ``async with KernelEnvClient(base_url=URL)``."""

    observation_class = KernelObservation


class ToolAction(Action):  # type: ignore[misc]
    """One call of the episode's tools (the desktop: ``computer``, ``submit``, ``done``, ``fail``)."""

    tool: str = Field(description="The tool's name, as reset's observation lists them")
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="Its arguments (its JSON schema)"
    )


class ToolObservation(Observation):  # type: ignore[misc]
    """A tool's result: text and PNG images (the desktop's screenshot); the tools after a reset."""

    task: str = Field(description="The task's file name")
    text: str = Field(description="The tool's text result, or the task prompt after a reset")
    steps_left: int = Field(description="Tool calls this episode still allows")
    images: list[str] = Field(default_factory=list, description="PNG images, base64")
    tools: list[dict[str, Any]] = Field(
        default_factory=list, description="The tools' schemas (after a reset)"
    )


class ToolOpenEnv(_Session, Environment[ToolAction, ToolObservation, KernelState]):  # type: ignore[misc]
    """One OpenEnv session over a `ToolEpisode` of the server's `EpisodeHost` (the desktop)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, host: EpisodeHost) -> None:
        super().__init__()
        self.episode: ToolEpisode = host.new_session(ToolEpisode)

    async def reset_async(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> ToolObservation:
        """Starts an episode of ``task`` with the environment's agent ``options`` (a mapping)."""
        view = await self.episode.reset_tools(kwargs.get("task"), kwargs.get("options"))
        return _tool_observation(view)

    async def step_async(
        self, action: ToolAction, timeout_s: float | None = None, **kwargs: Any
    ) -> ToolObservation:
        return _tool_observation(await self.episode.call(action.tool, action.arguments))


def _tool_observation(view: ToolView) -> ToolObservation:
    return ToolObservation(task=view.task, text=view.text, steps_left=view.steps_left, images=view.images,
                           tools=view.tools, done=view.done, reward=view.reward)  # fmt: skip


class ToolEnvClient(_Client, EnvClient[ToolAction, ToolObservation, KernelState]):  # type: ignore[misc]
    """OpenEnv's WebSocket client, typed for a tool-driven server (``--env desktop``)."""

    observation_class = ToolObservation


class _Server(HTTPEnvServer):  # type: ignore[misc]
    """OpenEnv's server, with the capacity refusal naming the knob that raises it."""

    async def _create_session(self) -> Any:
        try:
            return await super()._create_session()
        except SessionCapacityError as exc:
            raise SessionCapacityError(
                exc.active_sessions, exc.max_sessions,
                message=f"server at capacity: {exc.active_sessions}/{exc.max_sessions} sessions "
                "open; close one, or start the server with a larger --max-sessions",
            ) from None  # fmt: skip


def create_app(host: EpisodeHost) -> FastAPI:
    """The OpenEnv app serving ``host``'s episodes; its shutdown closes every session left."""
    app = FastAPI(title="agentinfra kernels (OpenEnv)")
    if host.definition.name == "kernels":
        server = _Server(lambda: KernelOpenEnv(host), KernelAction, KernelObservation,
                         max_concurrent_envs=host.config.max_sessions)  # fmt: skip
    else:
        server = _Server(lambda: ToolOpenEnv(host), ToolAction, ToolObservation,
                         max_concurrent_envs=host.config.max_sessions)  # fmt: skip
    server.register_routes(app)
    app.router.on_shutdown.append(_closer(host))
    return app


def _closer(host: EpisodeHost) -> Callable[[], Any]:
    async def close_all() -> None:
        logger.info("closing %d OpenEnv sessions", len(host.episodes))
        await host.aclose()

    return close_all


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agentinfra.trainers.openenv", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--tasks", type=Path, required=True, help="folder of task files reset(task=NAME) names"
    )
    parser.add_argument(
        "--env",
        default="kernels",
        help="the registered environment: kernels (a step is a submission) or desktop (a step is a tool call)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --host (the server has no authentication: trusted networks only)",
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=4, help="sessions served at once")
    parser.add_argument("--max-steps", type=int, default=8, help="submissions per episode")
    parser.add_argument(
        "--grading-slots", type=int, default=None, help="cores gradings share (default: CPUs - 1)"
    )
    parser.add_argument("--grading-timeout-s", type=float, default=900.0)
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="where session workspaces go (default: a temp folder)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Serves the OpenEnv app until SIGINT or SIGTERM (uvicorn stops gracefully on both); returns the exit status."""
    import uvicorn

    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        check_bind(args.host, allow_remote=args.allow_remote)
        config = EpisodeConfig(tasks=args.tasks, environment=args.env, max_steps=args.max_steps,
                               max_sessions=args.max_sessions, grading_slots=args.grading_slots,
                               grading_timeout_s=args.grading_timeout_s, root=args.root)  # fmt: skip
        host = EpisodeHost(config, load_settings())
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server = uvicorn.Server(uvicorn.Config(create_app(host), host=args.host, port=args.port,
                                           timeout_graceful_shutdown=5, log_level="info"))  # fmt: skip
    # uvicorn stops gracefully on SIGINT or SIGTERM, then raises the signal again: let that be
    # a KeyboardInterrupt here, so the sessions left are closed and the grader's atexit runs.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        server.run()
    except KeyboardInterrupt:
        logger.info("stopped by a signal")
    finally:
        host.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

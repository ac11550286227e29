"""`ToolEpisode`: an OpenEnv session that drives an environment through its agent's tools (the desktop).

``reset(task, options)`` builds the environment's agent setup (`Environment.agent_setup`)
in the session's workspace, with hooks that grade a submission at once (under the
host's cores, as `KernelEpisode` grades); the observation is the task prompt and the
tools' schemas. Each ``step(tool, arguments)`` calls one tool, and its result (text and
PNG images) is the observation. For the desktop: the action tool acts and returns the
screenshot (and accessibility table), ``submit`` grades the current state while the
episode goes on, ``done``/``fail`` end it freeze first and submit the final state.

Invariants, beyond `_openenv_episodes`'s:

- The reward arrives only with the episode's end: every other step's reward is 0. The
  last step's is the episode's (`episode_reward`: the best submission's, 0 when any was
  hack-flagged). The step budget's last step ends the episode as an agent that stopped
  is ended (the setup's ``close``: for the desktop, freeze first, then the state graded).
- A tool the agent called wrongly (`ToolError`) is an observation that costs a step, as
  in the loop; anything else a tool raises is agentinfra's failure: the step raises
  `TaskEnvironmentError` and is not counted.
- Closing the session closes its setup (the desktop killed, after its state is graded if
  the episode was not over, as for any agent that stops), then removes the workspace; a
  setup whose tools were never called is dropped without a grading.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentinfra.agent import ImagePart, TextPart, Tool, ToolResult, tool_schemas
from agentinfra.environments import AgentHooks, AgentSetup, Submission
from agentinfra.errors import AgentInfraError, ConfigError, TaskEnvironmentError, ToolError
from agentinfra.trainers._openenv_episodes import (
    EpisodeHost,
    KernelEpisode,
    Submitted,
    _Episode,
    episode_reward,
    submission_reward,
)

__all__ = ["ToolEpisode", "ToolView"]

_CLOSE_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolView:
    """What one reset or step of a tool episode returns."""

    task: str
    text: str
    steps_left: int
    done: bool
    reward: float | None = None
    images: list[str] = field(default_factory=list)
    """PNG images, base64."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """The tools' OpenAI schemas (after a reset)."""


def _parts(result: ToolResult) -> tuple[str, list[str]]:
    if isinstance(result, str):
        return result, []
    texts = [p.text for p in result if isinstance(p, TextPart)]
    images = [base64.b64encode(p.png).decode() for p in result if isinstance(p, ImagePart)]
    return "\n".join(texts), images


class ToolEpisode(KernelEpisode):
    """One session over an environment's agent tools; one task's episode at a time."""

    def __init__(self, host: EpisodeHost, session_id: str) -> None:
        super().__init__(host, session_id)
        self._setup: AgentSetup | None = None
        self._tools: dict[str, Tool] = {}
        self._episodes = 0
        self._loop_thread: int | None = None

    async def reset_tools(self, task: object, options: object = None) -> ToolView:
        """Starts an episode of ``task`` with the environment's agent ``options`` (a mapping).

        Raises:
            ConfigError: an unknown task or option, or the session is closed.
        """
        self._check_open()
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        await self._close_setup()
        environment = self.host.environment(task)
        assert isinstance(task, str)
        if options is not None and not isinstance(options, dict):
            raise ConfigError(f"reset options must be a mapping of agent options, got {options!r}")
        checked = self.host.definition.options_of(options or {}, knob="reset(options=...)")
        self._episodes += 1
        folder = self.workspace / f"episode-{self._episodes}"
        folder.mkdir()
        self._episode = _Episode(task=task, environment=environment)
        hooks = AgentHooks(submit=self._submit, results=self._results, options=checked)
        self._setup = environment.agent_setup(folder, hooks)
        self._tools = {t.name: t for t in self._setup.tools}
        return ToolView(task=task, text=self._setup.task_prompt, steps_left=self.steps_left,
                        done=False, tools=tool_schemas(self._setup.tools))  # fmt: skip

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolView:
        """Calls ``tool`` as one step; the reward and end as the module docstring says.

        Raises:
            ConfigError: no episode, the episode is over, or no such tool.
            TaskEnvironmentError: the environment failed (not the agent's fault); the step is not counted.
        """
        self._check_open()
        episode, setup = self._episode, self._setup
        if episode is not None and episode.done:
            raise ConfigError(
                f"the episode of {episode.task} is over: call reset(task=NAME) to start another"
            )
        if episode is None or setup is None:
            raise ConfigError("step before reset: call reset(task=NAME) first")
        found = self._tools.get(tool)
        if found is None:
            raise ConfigError(f"no tool {tool!r}; this episode's tools: {', '.join(self._tools)}")
        ended = found.ends_run
        try:
            text, images = _parts(await found.handler(arguments))
        except ToolError as exc:
            text, images, ended = f"error: {exc}", [], False
        except AgentInfraError as exc:
            raise TaskEnvironmentError(
                f"{tool} failed ({type(exc).__name__}: {exc}); the step was not counted"
            ) from exc
        episode.steps += 1
        if not ended and episode.steps >= self.host.config.max_steps:
            try:  # ends the episode as for an agent that stopped: its state graded
                await self._close_setup()
            except AgentInfraError as exc:  # the setup is gone: the step cannot be repeated
                episode.done = True
                raise TaskEnvironmentError(
                    f"the step budget ended the episode of {episode.task} but its final state could "
                    f"not be graded ({type(exc).__name__}: {exc}); the episode is over: reset to start another"
                ) from exc
            text += "\n(step budget reached: the episode was ended and its final state graded)"
        episode.done = ended or episode.steps >= self.host.config.max_steps
        reward = episode_reward(episode.submitted) if episode.done else 0.0
        return ToolView(task=episode.task, text=text, images=images, steps_left=self.steps_left,
                        done=episode.done, reward=reward)  # fmt: skip

    async def _submit(self, submission: Submission) -> str:
        episode = self._episode
        assert episode is not None
        evaluation = await self._grade(episode.environment, submission)
        submitted = Submitted(
            sha256=submission.sha256, outcome=evaluation.outcome.value, correct=evaluation.correct,
            score=evaluation.score, reward=submission_reward(evaluation), is_hack=evaluation.is_hack,
        )  # fmt: skip
        episode.submitted.append(submitted)
        unit = episode.environment.score.unit
        return (f"submitted {submission.name} as {submission.sha256[:12]}: outcome={submitted.outcome} "
                f"correct={submitted.correct} {unit}={submitted.score}")  # fmt: skip

    async def _results(self, wait_s: float) -> str:
        lines = self._result_lines()
        return "\n".join(lines) or "no submissions yet"

    def _result_lines(self) -> Sequence[str]:
        episode = self._episode
        if episode is None:
            return []
        unit = episode.environment.score.unit
        return [f"{s.sha256[:12]}: outcome={s.outcome} correct={s.correct} {unit}={s.score}"
                for s in episode.submitted]  # fmt: skip

    async def _close_setup(self) -> None:
        """Closes the setup of an episode that acted; one whose tools were never called is dropped:
        it holds nothing yet (the desktop starts at the first action), and closing it would start
        a desktop only to grade the untouched task (a trainer's reset, then disconnect)."""
        setup, self._setup, self._tools = self._setup, None, {}
        if setup is not None and setup.close is not None and self.steps > 0:
            await setup.close()

    async def aclose(self) -> None:
        """Closes the setup on this loop, then the session."""
        try:
            await self._close_setup()
        finally:
            super().close()

    def close(self) -> None:
        """Ends the session from OpenEnv's worker thread (the setup closed on the event loop) or,
        with no loop running, only removes what is on disk."""
        if self.is_closed:
            return
        loop = self._loop
        on_other_thread = (
            loop is not None and loop.is_running() and threading.get_ident() != self._loop_thread
        )
        try:
            if on_other_thread and self._setup is not None:
                assert loop is not None
                closing = asyncio.run_coroutine_threadsafe(self._close_setup(), loop)
                closing.result(_CLOSE_TIMEOUT_S)
        finally:
            super().close()

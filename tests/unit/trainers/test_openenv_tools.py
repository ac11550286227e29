"""`ToolEpisode` (the OpenEnv server's desktop sessions) over a fake environment whose agent tools have the seam's interface."""

from __future__ import annotations

import asyncio
import base64
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from agentinfra._settings import load_settings
from agentinfra.agent import ImagePart, TextPart, Tool, ToolResult
from agentinfra.environments import (
    AgentHooks,
    AgentSetup,
    EnvironmentDefinition,
    Evaluation,
    NoSettings,
    Outcome,
    ScoreSpec,
    Submission,
    Task,
)
from agentinfra.errors import ConfigError, SandboxError, TaskEnvironmentError, ToolError
from agentinfra.trainers._openenv_episodes import EpisodeConfig, EpisodeHost
from agentinfra.trainers._openenv_tools import ToolEpisode

SCORE = ScoreSpec(unit="success")
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


class Options(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    width: int = 100


class FakeDesktop:
    """A 'desktop' whose state is a counter; ``done`` submits it (score 1 when it reached 2)."""

    name = "fakedesk"
    grader_version = "fd-1"
    score = SCORE

    def __init__(self, task: Task, settings: BaseModel) -> None:
        self.task = task
        self.settings = settings
        self.closed: list[str] = []

    async def evaluate(self, submission: Submission, *, seed: int | None = None) -> Evaluation:
        value = int(submission.data)
        outcome = Outcome.HACK_FLAGGED if value < 0 else Outcome.PASSED
        return Evaluation(environment="fakedesk", outcome=outcome, correct=value == 2,
                          score=1.0 if value == 2 else 0.0, score_unit="success")  # fmt: skip

    def agent_view(self, evaluation: Evaluation) -> dict[str, Any]:
        return {}

    def agent_setup(self, workspace: Path, hooks: AgentHooks) -> AgentSetup:
        state = {"count": 0, "ended": False}

        async def act(args: dict[str, Any]) -> ToolResult:
            if args.get("by") == "crash":
                raise SandboxError("the desktop died")
            if not isinstance(args.get("by"), int):
                raise ToolError(f"by must be a whole number, got {args.get('by')!r}")
            state["count"] += args["by"]
            return [
                TextPart(f"count {state['count']} width {hooks.options.get('width')}"),
                ImagePart(PNG),
            ]

        async def submit(args: dict[str, Any]) -> ToolResult:
            return await hooks.submit(Submission(str(state["count"]).encode(), name="state"))

        async def done(args: dict[str, Any]) -> ToolResult:
            state["ended"] = True
            return await hooks.submit(Submission(str(state["count"]).encode(), name="final"))

        async def close() -> None:
            if not state[
                "ended"
            ]:  # an agent that stopped: its state is graded, as the desktop does
                state["ended"] = True
                await hooks.submit(Submission(str(state["count"]).encode(), name="stopped"))
            self.closed.append(workspace.name)

        schema = {"type": "object", "properties": {}}
        tools = [Tool("act", "Add to the counter.", schema, act), Tool("submit", "Grade now.", schema, submit),
                 Tool("done", "End.", schema, done, ends_run=True)]  # fmt: skip
        return AgentSetup(
            tools=tools,
            system_prompt="s",
            task_prompt=f"Count to 2 ({self.task.name})",
            close=close,
        )


DEFINITION: EnvironmentDefinition[Any] = EnvironmentDefinition(
    name="fakedesk", description="fake", grader_version="fd-1", score=SCORE,
    load_task=lambda path: Task(name=path.name, data=path.read_bytes()),
    settings=NoSettings, create=FakeDesktop, agent_options=Options,
)  # fmt: skip


@pytest.fixture
def host(tmp_path: Path) -> EpisodeHost:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "t.json").write_text("{}")
    config = EpisodeConfig(tasks=tasks, environment="fakedesk", max_steps=4, root=tmp_path / "ws")
    return EpisodeHost(config, load_settings({}), definition=DEFINITION)


def test_tool_steps_return_text_and_images_and_the_reward_only_at_the_end(
    host: EpisodeHost,
) -> None:
    async def main() -> None:
        episode = host.new_session(ToolEpisode)
        view = await episode.reset_tools("t.json", {"width": 7})
        assert view.text == "Count to 2 (t.json)"
        assert [t["function"]["name"] for t in view.tools] == ["act", "submit", "done"]
        acted = await episode.call("act", {"by": 2})
        assert (acted.text, acted.images, acted.reward, acted.done) == (
            "count 2 width 7", [base64.b64encode(PNG).decode()], 0.0, False)  # fmt: skip
        graded = await episode.call("submit", {})  # graded while the episode goes on, no reward yet
        assert "outcome=passed correct=True success=1.0" in graded.text
        assert (graded.reward, graded.done) == (0.0, False)
        final = await episode.call("done", {})
        assert (final.done, final.reward, final.steps_left) == (True, 1.0, 1)
        with pytest.raises(ConfigError, match="is over"):
            await episode.call("act", {"by": 1})

    asyncio.run(main())


def test_a_wrong_call_is_an_observation_and_an_environment_failure_is_an_error(
    host: EpisodeHost,
) -> None:
    async def main() -> None:
        episode = host.new_session(ToolEpisode)
        await episode.reset_tools("t.json")
        wrong = await episode.call("act", {"by": "x"})
        assert wrong.text == "error: by must be a whole number, got 'x'"
        assert wrong.steps_left == 3
        with pytest.raises(
            TaskEnvironmentError, match=r"act failed .*the desktop died.*not counted"
        ):
            await episode.call("act", {"by": "crash"})
        assert episode.steps_left == 3
        with pytest.raises(
            ConfigError, match="no tool 'click'; this episode's tools: act, submit, done"
        ):
            await episode.call("click", {})
        with pytest.raises(ConfigError, match=r"unknown 'height'.*reset\(options=\.\.\.\)"):
            await episode.reset_tools("t.json", {"height": 3})

    asyncio.run(main())


def test_the_step_budget_ends_the_episode_with_its_state_graded(host: EpisodeHost) -> None:
    async def main() -> None:
        episode = host.new_session(ToolEpisode)
        await episode.reset_tools("t.json")
        for _ in range(3):
            assert not (await episode.call("act", {"by": 1})).done
        last = await episode.call(
            "act", {"by": -4}
        )  # a negative state is 'hack-flagged' by the fake
        assert (last.done, last.reward) == (True, 0.0)
        assert "step budget reached" in last.text

    asyncio.run(main())


def test_a_failed_grading_at_the_step_budget_ends_the_episode_with_an_error(
    host: EpisodeHost,
) -> None:
    """The budget's last step closes the setup; when that grading fails the step cannot be repeated
    (the desktop is gone), so the error says the episode is over and the session says so too."""

    async def main() -> None:
        episode = host.new_session(ToolEpisode)
        await episode.reset_tools("t.json")
        environment = host.environment("t.json")

        async def broken(submission: Submission, *, seed: int | None = None) -> Evaluation:
            raise RuntimeError("grader worker vanished")

        environment.evaluate = broken  # type: ignore[method-assign]
        for _ in range(3):
            await episode.call("act", {"by": 1})
        with pytest.raises(
            TaskEnvironmentError, match=r"could not be graded .*the episode is over"
        ):
            await episode.call("act", {"by": 1})
        assert episode.is_done
        with pytest.raises(ConfigError, match="is over: call reset"):
            await episode.call("act", {"by": 1})

    asyncio.run(main())


def test_closing_from_openenvs_worker_thread_closes_the_setup_on_the_loop(
    host: EpisodeHost,
) -> None:
    async def main() -> None:
        episode = host.new_session(ToolEpisode)
        await episode.reset_tools("t.json")
        await episode.call("act", {"by": 2})
        environment = host.environment("t.json")
        assert isinstance(environment, FakeDesktop)
        closer = threading.Thread(target=episode.close)
        closer.start()
        while closer.is_alive():
            await asyncio.sleep(0.01)
        assert environment.closed == ["episode-1"]
        assert not episode.workspace.exists()
        assert host.episodes == {}

    asyncio.run(main())


def test_the_server_shutdown_closes_tool_sessions_left_open(host: EpisodeHost) -> None:
    async def main() -> None:
        one, two, idle = (host.new_session(ToolEpisode) for _ in range(3))
        for episode in (one, two, idle):
            await episode.reset_tools("t.json")
        await one.call("act", {"by": 1})
        await two.call("act", {"by": 2})
        await host.aclose()
        environment = host.environment("t.json")
        assert isinstance(environment, FakeDesktop)
        # the idle one never acted: dropped, not closed (closing would grade an untouched task)
        assert environment.closed == ["episode-1", "episode-1"]
        assert host.episodes == {}
        assert not idle.workspace.exists()

    asyncio.run(main())

"""`EpisodeHost` and `KernelEpisode` (the OpenEnv server's core) over a fake environment with the seam's interface."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from agentinfra._settings import load_settings
from agentinfra.environments import (
    AgentHooks,
    AgentSetup,
    EnvironmentDefinition,
    Evaluation,
    Finding,
    NoSettings,
    Outcome,
    ScoreSpec,
    Submission,
    Task,
)
from agentinfra.errors import ConfigError, TaskEnvironmentError
from agentinfra.trainers._openenv_episodes import (
    EpisodeConfig,
    EpisodeHost,
    check_bind,
    episode_reward,
)

SCORE = ScoreSpec(unit="speedup", suffix="x")


def run_async(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """The test run to completion on a fresh event loop (the project's tests use no asyncio plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


class FakeEnvironment:
    """Grades by the code's first word: ``pass:<score>``, ``fail``, ``hack``, ``crash``, ``broken``, ``slow``."""

    name = "fake"
    grader_version = "fake-1"
    score = SCORE

    def __init__(self, task: Task, settings: BaseModel) -> None:
        self.task = task
        self.settings = settings
        self.graded: list[bytes] = []

    async def evaluate(self, submission: Submission, *, seed: int | None = None) -> Evaluation:
        self.graded.append(submission.data)
        word = submission.data.decode().split()[0]
        if word == "crash":
            raise RuntimeError("worker vanished")
        if word == "slow":
            await asyncio.sleep(30)
        outcome, score, findings = Outcome.FAILED, None, []
        if word.startswith("pass:"):
            outcome, score = Outcome.PASSED, float(word.split(":")[1])
        elif word == "hack":
            outcome, score = Outcome.HACK_FLAGGED, 50.0
            findings = [
                Finding(check="call_count", severity="block", message="m", evidence="secret")
            ]
        elif word == "broken":
            outcome = Outcome.GRADER_ERROR
        return Evaluation(environment="fake", outcome=outcome, correct=outcome is Outcome.PASSED,
                          score=score, score_unit="speedup", findings=findings, error="e")  # fmt: skip

    def agent_view(self, evaluation: Evaluation) -> dict[str, Any]:
        return {"outcome": evaluation.outcome.value}

    def agent_setup(self, workspace: Path, hooks: AgentHooks) -> AgentSetup:
        raise NotImplementedError


DEFINITION: EnvironmentDefinition[Any] = EnvironmentDefinition(
    name="fake", description="fake", grader_version="fake-1", score=SCORE,
    load_task=lambda path: Task(name=path.name, data=path.read_bytes()),
    settings=NoSettings, create=FakeEnvironment,
)  # fmt: skip


@pytest.fixture
def host(tmp_path: Path) -> EpisodeHost:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "p1.py").write_text("class Model: ...\n")
    (tasks / "p2.py").write_text("class Model: pass\n")
    (tmp_path / "outside.py").write_text("secret\n")
    config = EpisodeConfig(tasks=tasks, environment="fake", max_steps=3, root=tmp_path / "ws",
                           grading_timeout_s=5)  # fmt: skip
    return EpisodeHost(config, load_settings({}), definition=DEFINITION)


@run_async
async def test_reset_shows_the_problem_and_steps_grade_with_per_submission_rewards(
    host: EpisodeHost,
) -> None:
    episode = host.new_episode()
    view = episode.reset("p1.py")
    assert (view.task, view.problem, view.steps_left, view.done, view.reward) == (
        "p1.py",
        "class Model: ...\n",
        3,
        False,
        None,
    )
    first = await episode.submit("pass:2.5")
    assert (
        first.outcome,
        first.correct,
        first.score,
        first.reward,
        first.done,
        first.steps_left,
    ) == ("passed", True, 2.5, 2.5, False, 2)
    second = await episode.submit("fail")
    assert (second.outcome, second.reward, second.done) == ("failed", 0.0, False)
    last = await episode.submit("pass:1.5")
    # the budget's last step ends the episode, and its reward is the episode's: the best submission's
    assert (last.done, last.steps_left, last.reward, last.score) == (True, 0, 2.5, 1.5)
    # the observation does not carry the reward
    assert last.message.endswith("speedup=1.5; episode over")
    with pytest.raises(ConfigError, match="is over: call reset"):
        await episode.submit("pass:9")


@run_async
async def test_a_hack_flag_zeroes_the_episode_reward_and_shows_no_evidence(
    host: EpisodeHost,
) -> None:
    episode = host.new_episode()
    episode.reset("p2.py")
    assert (await episode.submit("pass:4")).reward == 4.0
    flagged = await episode.submit("hack", final=True)
    assert (flagged.outcome, flagged.correct, flagged.reward, flagged.done) == (
        "hack_flagged",
        False,
        0.0,
        True,
    )
    assert "secret" not in repr(flagged)
    assert "call_count" not in repr(flagged)


@run_async
async def test_final_ends_early_and_reset_starts_over(host: EpisodeHost) -> None:
    episode = host.new_episode()
    episode.reset("p1.py")
    assert (await episode.submit("pass:3", final=True)).done
    assert episode.is_done
    view = episode.reset("p2.py")
    assert (view.task, view.steps_left, episode.steps, episode.is_done) == ("p2.py", 3, 0, False)


@run_async
async def test_an_identical_resubmission_is_graded_once_but_costs_a_step(host: EpisodeHost) -> None:
    episode = host.new_episode()
    episode.reset("p1.py")
    await episode.submit("pass:2")
    again = await episode.submit("pass:2")
    environment = host.environment("p1.py")
    assert isinstance(environment, FakeEnvironment)
    assert (len(environment.graded), again.steps_left, again.reward) == (1, 1, 2.0)


@pytest.mark.parametrize("code", ["crash", "broken"])
@run_async
async def test_a_grader_failure_is_an_error_not_a_zero_and_not_a_step(
    host: EpisodeHost, code: str
) -> None:
    episode = host.new_episode()
    episode.reset("p1.py")
    with pytest.raises(TaskEnvironmentError, match=r"the grader failed.*not counted"):
        await episode.submit(code)
    assert episode.steps_left == 3
    assert (await episode.submit("pass:1")).steps_left == 2


@run_async
async def test_a_grading_past_its_timeout_is_a_grader_failure(
    host: EpisodeHost, tmp_path: Path
) -> None:
    config = EpisodeConfig(
        tasks=host.config.tasks, environment="fake", grading_timeout_s=0.05, root=tmp_path / "w2"
    )
    quick = EpisodeHost(config, load_settings({}), definition=DEFINITION)
    episode = quick.new_episode()
    episode.reset("p1.py")
    with pytest.raises(TaskEnvironmentError, match=r"more than 0.05 s \(--grading-timeout-s\)"):
        await episode.submit("slow")


@pytest.mark.parametrize(
    "task", ["../outside.py", "/etc/passwd", "missing.py", "", None, 3, "p1\x00.py", "x" * 5000]
)
def test_a_task_outside_the_folder_or_missing_is_refused_with_the_known_ones(
    host: EpisodeHost, task: object
) -> None:
    episode = host.new_episode()
    with pytest.raises(ConfigError, match=r"task|reset needs task=NAME") as info:
        episode.reset(task)
    if isinstance(task, str) and task:
        assert "known: p1.py, p2.py" in str(info.value)
        assert "--tasks" in str(info.value)


@run_async
async def test_step_before_reset_and_oversized_code_are_refused(host: EpisodeHost) -> None:
    episode = host.new_episode()
    with pytest.raises(ConfigError, match="step before reset"):
        await episode.submit("pass:1")
    episode.reset("p1.py")
    with pytest.raises(ConfigError, match="at most 1048576"):
        await episode.submit("x" * ((1 << 20) + 1))
    with pytest.raises(ConfigError, match=r"code is not valid text \(surrogates not allowed at"):
        await episode.submit("pass:1 \ud800")  # a lone surrogate, as JSON's "\ud800" decodes
    assert episode.steps == 0


@run_async
async def test_a_session_closed_as_its_grading_ends_records_nothing(host: EpisodeHost) -> None:
    """OpenEnv closes from a worker thread; a close that lands as the grading returns is not a crash."""
    episode = host.new_episode()
    episode.reset("p1.py")
    environment = host.environment("p1.py")
    grade = environment.evaluate

    async def graded_then_closed(submission: Submission, *, seed: int | None = None) -> Evaluation:
        evaluation = await grade(submission, seed=seed)
        episode.close()
        return evaluation

    environment.evaluate = graded_then_closed  # type: ignore[method-assign]
    with pytest.raises(ConfigError, match="is closed: open a new one"):
        await episode.submit("pass:2")
    assert not episode.workspace.exists()


@run_async
async def test_sessions_are_separate_and_close_removes_workspaces(host: EpisodeHost) -> None:
    one, two = host.new_episode(), host.new_episode()
    one.reset("p1.py")
    two.reset("p1.py")
    views = await asyncio.gather(one.submit("pass:3"), two.submit("hack"))
    assert [v.outcome for v in views] == ["passed", "hack_flagged"]
    assert len(list(one.workspace.iterdir())) == 1
    assert one.workspace != two.workspace
    one.close()
    one.close()
    assert not one.workspace.exists()
    assert two.workspace.exists()
    assert list(host.episodes) == [two.session_id]
    with pytest.raises(ConfigError, match="is closed"):
        one.reset("p1.py")
    host.close()
    assert not two.workspace.exists()
    assert host.episodes == {}


@run_async
async def test_close_cancels_a_grading_in_flight(host: EpisodeHost) -> None:
    episode = host.new_episode()
    episode.reset("p1.py")
    step = asyncio.create_task(episode.submit("slow"))
    await asyncio.sleep(0.05)
    await asyncio.to_thread(episode.close)  # OpenEnv closes a session from a worker thread
    with pytest.raises(asyncio.CancelledError):
        await step


def test_a_host_without_a_root_makes_and_removes_its_own(tmp_path: Path, host: EpisodeHost) -> None:
    config = EpisodeConfig(tasks=host.config.tasks, environment="fake")
    own = EpisodeHost(config, load_settings({}), definition=DEFINITION)
    episode = own.new_episode()
    assert episode.workspace.parent == own.root
    assert own.root.is_dir()
    own.close()
    assert not own.root.exists()


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"max_steps": 0}, "--max-steps 0"), ({"max_sessions": True}, "--max-sessions True"),
     ({"grading_timeout_s": 0.0}, "--grading-timeout-s 0.0"), ({"tasks": Path("/nonexistent")}, "--tasks /nonexistent")],
)  # fmt: skip
def test_bad_config_names_the_knob(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    values: dict[str, Any] = {"tasks": tmp_path, **changes}
    with pytest.raises(ConfigError, match=message):
        EpisodeConfig(**values)


def test_episode_reward_is_the_best_unless_a_hack() -> None:
    assert episode_reward([]) == 0.0


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "example.org"])
def test_a_non_loopback_bind_is_refused_unless_allowed(host: str) -> None:
    with pytest.raises(ConfigError, match=r"is not loopback .*no authentication.*--allow-remote"):
        check_bind(host)
    check_bind(host, allow_remote=True)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_a_loopback_bind_is_served(host: str) -> None:
    check_bind(host)

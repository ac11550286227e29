"""Step-by-step episodes over an agentinfra environment, for the OpenEnv server; no OpenEnv import here.

`EpisodeHost` is one server's shared part: the task folder, the grading settings, the pool
of cores its gradings share (`agentinfra.rollouts.GradingSlots`) and every live episode,
so that stopping the server closes them all. `KernelEpisode` is one session:
``reset(task)`` shows the problem; each ``submit(code)`` is one step, graded at once;
the episode ends on a ``final`` submission or when ``max_steps`` submissions were made.

Invariants:

- Submitted code is bytes handed to the environment's trusted grader
  (`Environment.evaluate`, which runs it in its jails); this process never imports,
  executes or parses it. Gradings use fresh hidden seeds, as a run's harness does.
- A task is a file name inside the host's task folder; a name that leaves it is refused.
- The agent is told of a grading what a run's harness tells its agent: the outcome,
  whether it was correct, and the score (for kernels, the speedup); never findings'
  evidence, seeds or timings.
- A step's reward is that submission's reward (its score when it passed, else 0: a
  trajectory's ``turn_rewards[].reward``); the last step's reward is the episode's (the
  best submission's reward, 0 when any submission was hack-flagged: a trajectory's
  ``reward``, docs/trajectory.md). A grader failure is never a reward of 0: the step
  raises `TaskEnvironmentError`, is not counted, and may be repeated.
- An identical resubmission is not graded again (a run grades identical files once);
  it still costs a step.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from agentinfra._settings import Settings
from agentinfra.environments import (
    Environment,
    EnvironmentDefinition,
    Evaluation,
    Outcome,
    Submission,
    environment_definition,
)
from agentinfra.errors import ConfigError, TaskEnvironmentError
from agentinfra.harness import episode_reward as harness_episode_reward
from agentinfra.harness import submission_reward as harness_submission_reward
from agentinfra.rollouts import GradingSlots, grading_cost

__all__ = ["EpisodeConfig", "EpisodeHost", "KernelEpisode", "StepView", "Submitted", "check_bind"]

logger = logging.getLogger(__name__)

E = TypeVar("E", bound="KernelEpisode")

_MAX_CODE_BYTES = 1 << 20
_LISTED_TASKS = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeConfig:
    """One OpenEnv server's episodes."""

    tasks: Path
    """The folder of task files a ``reset(task=NAME)`` may name (``--tasks``)."""
    environment: str = "kernels"
    """The registered environment the tasks belong to (``--env``)."""
    max_steps: int = 8
    """Submissions per episode; the last one ends it (``--max-steps``)."""
    max_sessions: int = 4
    """Sessions (WebSocket connections) served at once; the next is refused (``--max-sessions``)."""
    grading_slots: int | None = None
    """Cores the server's gradings share; None: this process's CPUs less one (``--grading-slots``)."""
    grading_timeout_s: float = 900.0
    """A grading that takes longer, once it has its cores, is a grader failure (``--grading-timeout-s``)."""
    root: Path | None = None
    """Where session workspaces go; None: a fresh temporary folder, removed at stop (``--root``)."""

    def __post_init__(self) -> None:
        if not self.tasks.is_dir():
            raise ConfigError(f"--tasks {self.tasks} is not a folder of task files")
        for knob, value in (("--max-steps", self.max_steps), ("--max-sessions", self.max_sessions)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{knob} {value!r} must be a whole number >= 1")
        if not self.grading_timeout_s > 0:
            raise ConfigError(f"--grading-timeout-s {self.grading_timeout_s!r} must be > 0")


@dataclass(frozen=True, slots=True)
class Submitted:
    """One graded submission of an episode, as the agent may see it (plus its reward)."""

    sha256: str
    outcome: str
    correct: bool
    score: float | None
    reward: float
    is_hack: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class StepView:
    """What one reset or step returns: the observation's fields, its reward and whether it ended."""

    task: str
    message: str
    steps_left: int
    done: bool
    reward: float | None = None
    problem: str | None = None
    submission: str | None = None
    outcome: str | None = None
    correct: bool | None = None
    score: float | None = None
    score_unit: str = ""


def check_bind(host: str, *, allow_remote: bool = False) -> None:
    """Refuses a non-loopback ``host`` unless ``allow_remote``: OpenEnv's server has no
    authentication, so whoever reaches it may have code graded and desktops started.

    Raises:
        ConfigError: ``host`` is not loopback and ``allow_remote`` is false.
    """
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost
        loopback = False
    if not loopback and not allow_remote:
        raise ConfigError(
            f"--host {host} is not loopback and the OpenEnv server has no authentication: "
            "bind 127.0.0.1, or pass --allow-remote on a network you trust"
        )


def submission_reward(evaluation: Evaluation) -> float:
    """A submission's reward, by the harness's rule (`agentinfra.harness.submission_reward`)."""
    return harness_submission_reward(evaluation.outcome.value, evaluation.score)


def episode_reward(submitted: list[Submitted]) -> float:
    """An episode's reward, by the harness's rule (`agentinfra.harness.episode_reward`)."""
    return harness_episode_reward(
        (s.reward for s in submitted), hacked=any(s.is_hack for s in submitted)
    )


class EpisodeHost:
    """What the sessions of one server share: tasks, grading settings, cores, and the live episodes."""

    def __init__(
        self,
        config: EpisodeConfig,
        settings: Settings,
        *,
        definition: EnvironmentDefinition[Any] | None = None,
    ) -> None:
        self.config = config
        self.definition = definition or environment_definition(config.environment)
        self.grader_settings = self.definition.new_settings(settings)
        self.slots = GradingSlots(config.grading_slots)
        self._own_root = config.root is None
        self.root = config.root or Path(tempfile.mkdtemp(prefix="agentinfra-openenv-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.episodes: dict[str, KernelEpisode] = {}
        self._environments: dict[str, Environment] = {}

    def new_episode(self) -> KernelEpisode:
        """A new session of submissions (`KernelEpisode`)."""
        return self.new_session(KernelEpisode)

    def new_session(self, kind: type[E]) -> E:
        """A new session of ``kind`` (`KernelEpisode`, or `ToolEpisode` for an environment driven by its tools)."""
        episode = kind(self, uuid.uuid4().hex)
        self.episodes[episode.session_id] = episode
        return episode

    def task_names(self) -> list[str]:
        return sorted(p.name for p in self.config.tasks.iterdir() if p.is_file())

    def environment(self, name: object) -> Environment:
        """The environment of task ``name`` (a file name inside the task folder), opened once.

        Raises:
            ConfigError: ``name`` is not a string naming a task file inside the folder.
        """
        if not isinstance(name, str) or not name:
            raise ConfigError(f"reset needs task=NAME, a file in {self.config.tasks}; got {name!r}")
        folder = self.config.tasks.resolve()
        try:
            path = (folder / name).resolve()
            is_task = path.parent == folder and path.is_file()
        except (OSError, ValueError):  # a NUL byte, a name too long for the file system
            is_task = False
        if not is_task:
            known = ", ".join(self.task_names()[:_LISTED_TASKS])
            raise ConfigError(
                f"task {name[:200]!r} is not a file in {self.config.tasks} (--tasks); known: {known}"
            )
        opened = self._environments.get(path.name)
        if opened is None:
            task = self.definition.load_task(path)
            opened = self.definition.open(task, self.grader_settings)
            self._environments[path.name] = opened
        return opened

    def forget(self, episode: KernelEpisode) -> None:
        self.episodes.pop(episode.session_id, None)

    async def aclose(self) -> None:
        """Closes every live episode on this event loop (at the server's shutdown), then `close`."""
        for episode in list(self.episodes.values()):
            await episode.aclose()
        self.close()

    def close(self) -> None:
        """Closes every live episode and removes the workspaces folder when the host made it."""
        for episode in list(self.episodes.values()):
            episode.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class _Episode:
    task: str
    environment: Environment
    steps: int = 0
    done: bool = False
    submitted: list[Submitted] = field(default_factory=list)
    by_sha: dict[str, Submitted] = field(default_factory=dict)


class KernelEpisode:
    """One session: a task's episode at a time, each submission graded in the environment's jail."""

    def __init__(self, host: EpisodeHost, session_id: str) -> None:
        self.host = host
        self.session_id = session_id
        self.workspace = host.root / session_id
        self.workspace.mkdir()
        self.is_closed = False
        self._episode: _Episode | None = None
        self._grading: asyncio.Task[Evaluation] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def steps_left(self) -> int:
        episode = self._episode
        return 0 if episode is None else self.host.config.max_steps - episode.steps

    @property
    def task(self) -> str | None:
        return None if self._episode is None else self._episode.task

    @property
    def steps(self) -> int:
        return 0 if self._episode is None else self._episode.steps

    @property
    def is_done(self) -> bool:
        return self._episode is not None and self._episode.done

    def reset(self, task: object) -> StepView:
        """Starts an episode of ``task``: the observation is the problem.

        Raises:
            ConfigError: the task is not one of the host's, or the session is closed.
        """
        self._check_open()
        environment = self.host.environment(task)
        assert isinstance(task, str)
        self._episode = _Episode(task=Path(task).name, environment=environment)
        for old in self.workspace.iterdir():
            old.unlink()
        problem = environment.task.data.decode(errors="replace")
        message = (
            f"Make the reference `Model` in {self._episode.task} faster: submit the source of a file "
            "that defines `ModelNew` with the same constructor arguments and outputs. Each "
            "submission is graded with secret inputs; tricks that fake speed score zero. "
            f"You have {self.host.config.max_steps} submissions; mark one final to end early."
        )
        return StepView(task=self._episode.task, message=message, problem=problem,
                        steps_left=self.steps_left, done=False, score_unit=environment.score.unit)  # fmt: skip

    async def submit(
        self, code: str, *, name: str = "solution.py", final: bool = False
    ) -> StepView:
        """Grades ``code`` as one step; the reward and end as the module docstring says.

        Raises:
            ConfigError: no episode, the episode is over, or ``code`` is too big.
            TaskEnvironmentError: the grader failed (not the submission's fault); the step is not counted.
        """
        self._check_open()
        episode = self._episode
        if episode is None:
            raise ConfigError("step before reset: call reset(task=NAME) first")
        if episode.done:
            raise ConfigError(
                f"the episode of {episode.task} is over: call reset(task=NAME) to start another"
            )
        try:
            data = code.encode()
        except UnicodeEncodeError as exc:  # JSON may carry lone surrogates
            raise ConfigError(
                f"code is not valid text ({exc.reason} at character {exc.start}): submit UTF-8 source"
            ) from None
        if len(data) > _MAX_CODE_BYTES:
            raise ConfigError(
                f"code has {len(data)} bytes; a submission may have at most {_MAX_CODE_BYTES}"
            )
        submission = Submission(
            data, name=Path(name).name or "solution.py", media_type="text/x-python"
        )
        submitted = episode.by_sha.get(submission.sha256)
        if submitted is None:
            evaluation = await self._grade(episode.environment, submission)
            self._check_open()  # closed (from OpenEnv's thread) as the grading ended: nothing to record
            submitted = Submitted(
                sha256=submission.sha256, outcome=evaluation.outcome.value, correct=evaluation.correct,
                score=evaluation.score, reward=submission_reward(evaluation), is_hack=evaluation.is_hack,
            )  # fmt: skip
            episode.by_sha[submission.sha256] = submitted
            (
                self.workspace / f"{len(episode.submitted):03d}-{submission.sha256[:12]}.py"
            ).write_bytes(data)
        episode.submitted.append(submitted)
        episode.steps += 1
        episode.done = final or episode.steps >= self.host.config.max_steps
        return self._view(episode, submitted)

    def _view(self, episode: _Episode, submitted: Submitted) -> StepView:
        unit = episode.environment.score.unit
        reward = episode_reward(episode.submitted) if episode.done else submitted.reward
        message = (f"submission {submitted.sha256[:12]}: outcome={submitted.outcome} "
                   f"correct={submitted.correct} {unit}={submitted.score}")  # fmt: skip
        if episode.done:
            message += "; episode over"  # the reward travels beside the observation, not in it
        return StepView(task=episode.task, message=message, steps_left=self.steps_left, done=episode.done,
                        reward=reward, submission=submitted.sha256[:12], outcome=submitted.outcome,
                        correct=submitted.correct, score=submitted.score, score_unit=unit)  # fmt: skip

    async def _grade(self, environment: Environment, submission: Submission) -> Evaluation:
        self._loop = asyncio.get_running_loop()
        self._grading = asyncio.create_task(self._graded(environment, submission))
        try:
            evaluation = await self._grading
        except TimeoutError:
            raise TaskEnvironmentError(
                f"grading took more than {self.host.config.grading_timeout_s} s "
                "(--grading-timeout-s); the step was not counted"
            ) from None
        except TaskEnvironmentError:
            raise
        except Exception as exc:  # a grader crash is an infra failure, never the submission's 0
            raise TaskEnvironmentError(
                f"the grader failed ({type(exc).__name__}: {exc}); the step was not counted"
            ) from exc
        finally:
            self._grading = None
        logger.info("session %s: %s graded %s (%s), findings: %s", self.session_id, submission.sha256[:12],
                    evaluation.outcome.value, evaluation.score,
                    ", ".join(f"{f.check}/{f.severity}" for f in evaluation.findings) or "none")  # fmt: skip
        if evaluation.outcome is Outcome.GRADER_ERROR:
            raise TaskEnvironmentError(
                f"the grader failed ({evaluation.error or 'grader error'}); the step was not counted"
            )
        return evaluation

    async def _graded(self, environment: Environment, submission: Submission) -> Evaluation:
        async with self.host.slots.hold(grading_cost(environment.settings)):
            return await asyncio.wait_for(
                environment.evaluate(submission), self.host.config.grading_timeout_s
            )

    def _check_open(self) -> None:
        if self.is_closed:
            raise ConfigError(f"session {self.session_id} is closed: open a new one")

    async def aclose(self) -> None:
        """`close`, from the event loop."""
        self.close()

    def close(self) -> None:
        """Ends the session: a grading in flight is cancelled, the workspace removed. Idempotent;
        safe from any thread (OpenEnv closes sessions from a worker thread)."""
        if self.is_closed:
            return
        self.is_closed = True
        grading, loop = self._grading, self._loop
        if grading is not None and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile
                loop.call_soon_threadsafe(grading.cancel)
        shutil.rmtree(self.workspace, ignore_errors=True)
        self.host.forget(self)
        logger.debug("closed OpenEnv session %s", self.session_id)

"""The environment seam: what every problem environment provides, and what it is given.

An environment (kernels, desktop, a third party's) is registered by name with an
`EnvironmentDefinition`: how it loads a task, how it creates an `Environment` for
one task, its grader version, what its score means (`ScoreSpec`), and the models of
its own settings and agent options (pydantic, validated through the definition
wherever they are read back: ``run.json``, a Ray worker, the CLI). An
`Environment` evaluates `Submission`\\ s (content-addressed bytes, never a path)
into `Evaluation`\\ s, says what the agent may see of one, and gives the agent
its tools and prompts (`AgentSetup`).

Nothing here knows any particular environment; the harness, reports and exports
work only with these types. Decision record: docs/decisions/0007-environment-seam.md.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentinfra._settings import Settings
from agentinfra.agent import Tool
from agentinfra.errors import ConfigError

__all__ = [
    "EVALUATION_SCHEMA_VERSION",
    "AgentHooks",
    "Anomaly",
    "RunView",
    "AgentSetup",
    "Environment",
    "EnvironmentDefinition",
    "Evaluation",
    "Finding",
    "NoSettings",
    "Outcome",
    "ScoreSpec",
    "Severity",
    "Submission",
    "Task",
]

EVALUATION_SCHEMA_VERSION = 2
Severity = Literal["block", "warn"]


class Outcome(enum.StrEnum):
    """How an evaluation ended. `PASSED` means correct and no blocking finding."""

    PASSED = "passed"
    FAILED = "failed"
    HACK_FLAGGED = "hack_flagged"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    INVALID = "invalid"
    GRADER_ERROR = "grader_error"


class Finding(BaseModel):
    """One named check's observation, with evidence."""

    model_config = ConfigDict(frozen=True)

    check: str
    severity: Severity
    message: str
    evidence: str = ""


@dataclass(frozen=True, slots=True)
class ScoreSpec:
    """What an environment's score means. Higher is always better.

    ``unit`` labels every figure ("speedup", "success"); ``thresholds`` are the
    levels whose time-to-reach the metrics report; ``scale`` is how charts draw it;
    ``remeasure_best`` says whether a noisy best score should be measured again
    (the winner's curse) before a report counts it; ``suffix`` is written after
    a value ("x" for a speedup of 2.00x).
    """

    unit: str
    thresholds: tuple[float, ...] = (1.0,)
    scale: Literal["log", "linear"] = "linear"
    remeasure_best: bool = False
    suffix: str = ""

    def format(self, value: float | None, *, digits: int = 2) -> str:
        if value is None:
            return "-"
        return f"{value:.{digits}f}{self.suffix}"


@dataclass(frozen=True, slots=True)
class Submission:
    """What an agent handed in: bytes with metadata, addressed by their SHA-256.

    ``name`` is the agent's name for it (a file name such as ``solution.py``);
    ``media_type`` says what the bytes are: ``text/x-python`` for one source file,
    ``application/x-tar`` for an episode's final state (several files), or any
    type an environment documents.
    """

    data: bytes
    name: str = "submission"
    media_type: str = "application/octet-stream"
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True, slots=True)
class Task:
    """One task of an environment, as bytes (so it can travel to another machine).

    ``source`` is where it was loaded from (for display and run.json), never read again.
    """

    name: str
    data: bytes
    source: str = ""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


class NoSettings(BaseModel):
    """The settings model (or agent-options model) of an environment that has none."""

    model_config = ConfigDict(frozen=True, extra="forbid")


M = TypeVar("M", bound=BaseModel)
S = TypeVar("S", bound=BaseModel)


def _validated(model: type[M], data: Mapping[str, Any] | BaseModel, *, what: str, knob: str) -> M:
    """``data`` as ``model``, or a one-line `ConfigError` naming ``what``, the key, its value and ``knob``
    (a `ConfigError` the model raises itself is passed on as it is).

    Raises:
        ConfigError: an unknown key (the message lists the known ones) or a value the model refuses.
    """
    if isinstance(data, model):
        return data
    values = data.model_dump(mode="json") if isinstance(data, BaseModel) else dict(data)
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(p) for p in error["loc"])
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, ConfigError):  # the model's own check: its message names the knob
            raise cause from None
        if error["type"] == "extra_forbidden":
            known = ", ".join(model.model_fields) or "none"
            raise ConfigError(f"{what}: unknown {key!r}; known: {known} ({knob})") from None
        shown = f"{key}={values[key]!r}" if key in values else key or "value"
        raise ConfigError(f"{what}: {shown}: {error['msg']} ({knob})") from None


class Evaluation(BaseModel):
    """The trusted result of evaluating one submission (``schema_version`` 2).

    Stored as ``evaluations/<sha256>/<grader_version>.json`` in a run. ``score``
    is None when it was not measured; ``details`` holds what only this
    environment knows (for kernels: speedup, candidate and baseline times).
    """

    model_config = ConfigDict(frozen=True)

    schema_version: Literal[2] = 2
    environment: str
    outcome: Outcome
    correct: bool
    score: float | None = None
    score_unit: str
    score_ci: tuple[float, float] | None = None
    findings: list[Finding] = Field(default_factory=list)
    provenance: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Evaluation:
        """Reads an evaluation of this schema (older ones: ``agentinfra.harness``'s migrations)."""
        return cls.model_validate(data)

    @property
    def is_hack(self) -> bool:
        return self.outcome is Outcome.HACK_FLAGGED or any(
            f.severity == "block" for f in self.findings
        )


@dataclass(frozen=True, slots=True)
class AgentHooks:
    """What the run gives an environment's agent tools.

    ``submit(submission)`` hands a submission to the run and returns the receipt
    text; ``results(wait_s)`` returns the official verdicts so far; ``options`` are
    the run's environment-specific agent options (``run.json``: ``agent.options``,
    for the desktop its action space, observation and screenshot size);
    ``waiting(reason)`` tells the progress view the agent waits for a shared
    resource (a desktop slot), ``waiting(None)`` that it no longer does;
    ``turn()`` is the agent's current turn (for journals that link to it);
    ``completed_tool_calls(names)`` is how many calls of the tools named ``names``
    the agent's transcript holds a result of, earlier sessions of a resumed run included.
    """

    submit: Callable[[Submission], Awaitable[str]]
    results: Callable[[float], Awaitable[str]]
    options: Mapping[str, Any] = field(default_factory=dict)
    waiting: Callable[[str | None], None] = lambda reason: None
    turn: Callable[[], int | None] = lambda: None
    completed_tool_calls: Callable[[Collection[str]], int] = lambda names: 0


@dataclass(frozen=True, slots=True)
class AgentSetup:
    """What the agent gets: tools (whose results may carry images), and its prompts.

    ``close``, when given, is awaited once the agent has stopped (a desktop's
    processes are killed there)."""

    tools: list[Tool]
    system_prompt: str
    task_prompt: str
    close: Callable[[], Awaitable[None]] | None = None


class Environment(Protocol):
    """One task of one environment, ready to evaluate submissions."""

    @property
    def name(self) -> str: ...

    @property
    def grader_version(self) -> str: ...

    @property
    def score(self) -> ScoreSpec: ...

    @property
    def task(self) -> Task: ...

    @property
    def settings(self) -> BaseModel:
        """This run's settings: an instance of its definition's settings model."""
        ...

    async def evaluate(self, submission: Submission, *, seed: int | None = None) -> Evaluation:
        """The trusted evaluation of ``submission``; ``seed`` None means fresh secret seeds."""
        ...

    def agent_view(self, evaluation: Evaluation) -> dict[str, Any]:
        """What the agent is told about ``evaluation`` (never hidden seeds or audit schedules)."""
        ...

    def agent_setup(self, workspace: Path, hooks: AgentHooks) -> AgentSetup:
        """The agent's tools and prompts for this task; ``workspace`` is its private directory."""
        ...


@dataclass(frozen=True, slots=True)
class RunView:
    """What an environment's anomaly finder is shown of one agent run (built by the harness)."""

    path: Path
    task: Path
    workspace: Path
    """The agent's private files (a desktop keeps its action journal here)."""
    submissions: tuple[Mapping[str, Any], ...]
    """In order received: ``source``, ``outcome`` (None until graded) and ``score`` (None unless passed)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """The run's environment-specific agent options (``AgentHooks.options``)."""

    @property
    def passed(self) -> bool:
        return any(
            s.get("outcome") == "passed" and (s.get("score") or 0) > 0 for s in self.submissions
        )


@dataclass(frozen=True, slots=True)
class Anomaly:
    """Something odd about an agent run, found after the fact across its journals (and other runs).

    A lead for a person to look at, not a verdict: rewards come from the grader.
    ``step`` and ``turn`` point at where it starts (the report's ``#turn-N`` anchor).
    """

    run: str
    """The run directory."""
    check: str
    message: str
    step: int | None = None
    turn: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "check": self.check, "message": self.message,
                "step": self.step, "turn": self.turn}  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvironmentDefinition(Generic[S]):
    """A registered environment: what the registry and entry points hand out.

    It declares everything the harness and the CLI need to know about it, so neither
    branches on its name: its settings model (what ``run.json`` stores as
    ``spec.settings``), how a new run's settings come from the ``AGENTINFRA_*``
    settings, its agent-options model (``run.json``'s ``agent.options``, the CLI's
    ``--env-option KEY=VALUE``), and the settings ``regrade --strict`` and
    ``replay-run --quick`` grade with.
    """

    name: str
    description: str
    grader_version: str
    score: ScoreSpec
    load_task: Callable[[Path], Task]
    """Reads a task from a path; raises `ConfigError` naming the path when it is not one."""
    settings: type[S]
    """Its settings model (a frozen pydantic model); `NoSettings` for an environment without any."""
    create: Callable[[Task, S], Environment]
    """The environment of one task, graded with the given settings."""
    settings_from: Callable[[Settings], S] | None = None
    """A new run's settings from the process settings (`load_settings`); None: the model's defaults."""
    agent_options: type[BaseModel] = NoSettings
    """The model of its agent's options; `NoSettings`: its agent takes none."""
    strict_settings: Callable[[S], S] | None = None
    """The settings ``regrade --strict`` grades with, given the run's; None: nothing stricter."""
    quick_settings: Callable[[S], S] | None = None
    """The settings ``replay-run --quick`` grades with (faster, noisier); None: nothing quicker."""
    find_anomalies: Callable[[Sequence[RunView], Path | None], list[Anomaly]] | None = None
    """Anomalies over agent runs of this environment (``runs``, and the environment's task
    audit file when given); None: the environment looks for none beyond its verdicts' findings."""

    def settings_of(
        self, data: Mapping[str, Any] | BaseModel, *, knob: str = "run.json spec.settings"
    ) -> S:
        """``data`` (stored settings, as JSON) validated by the settings model.

        Raises:
            ConfigError: a key the model does not know or a value it refuses; the message names ``knob``.
        """
        return _validated(self.settings, data, what=f"{self.name} setting", knob=knob)

    def new_settings(self, config: Settings) -> S:
        """The settings a new run gets from ``config`` (the ``AGENTINFRA_*`` settings)."""
        return self.settings() if self.settings_from is None else self.settings_from(config)

    def options_of(self, data: Mapping[str, Any], *, knob: str = "--env-option") -> dict[str, Any]:
        """Agent options checked by the agent-options model; returns the given ones as JSON.

        Raises:
            ConfigError: an option the model does not know or a value it refuses.
        """
        model = _validated(self.agent_options, data, what=f"{self.name} agent option", knob=knob)
        return model.model_dump(mode="json", exclude_unset=True)

    def open(self, task: Task, settings: Mapping[str, Any] | BaseModel) -> Environment:
        """`create` with ``settings`` validated first (as stored in a run, or shipped to a worker)."""
        return self.create(task, self.settings_of(settings))

"""`RunSpec`: what a run is (environment, task, agent, budget, the environment's settings), and `run.json`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentinfra.harness import _migrations

__all__ = ["RUN_SCHEMA_VERSION", "SPEC_SCHEMA_VERSION", "Budget", "RunInfo", "RunSpec"]

RUN_SCHEMA_VERSION = 1
SPEC_SCHEMA_VERSION = 2
"""2: the environment's own ``settings`` (1 held the kernel grader's as ``grader``; `_migrations`)."""


class Budget(BaseModel):
    """Limits of one run; None means unlimited."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    wall_hours: float = Field(default=12.0, gt=0)
    tokens: int | None = Field(default=None, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)


class RunSpec(BaseModel):
    """One agent on one task of one environment.

    ``environment`` is a registered environment's name; ``settings`` are that
    environment's own (its definition's settings model, as JSON: a model instance
    given here is stored as its JSON). Both are checked when the run's environment
    is opened (`EnvironmentDefinition.open`), so a run of an uninstalled
    environment can still be read. Hidden grading seeds are fresh from the OS for
    every grading, so a run has no seed. Older shapes are read by `_migrations`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[2] = 2
    run_id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")
    environment: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._-]+$")
    task: str = Field(min_length=1)
    agent: dict[str, Any] = Field(default_factory=dict)
    budget: Budget = Field(default_factory=Budget)
    settings: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _current_shape(cls, data: Any) -> Any:
        data = _migrations.run_spec(data)
        if isinstance(data, dict) and isinstance(data.get("settings"), BaseModel):
            return {**data, "settings": data["settings"].model_dump(mode="json")}
        return data


class RunInfo(BaseModel):
    """The contents of ``run.json``: the spec and what it ran on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    spec: RunSpec
    created_at: float
    versions: dict[str, str]
    machine: dict[str, str]

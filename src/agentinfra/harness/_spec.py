"""`RunSpec`: what a run is (environment, task, agent, budget, grader), and `run.json`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentinfra.environments import GraderSettings

__all__ = ["RUN_SCHEMA_VERSION", "Budget", "GraderSettings", "RunInfo", "RunSpec"]

RUN_SCHEMA_VERSION = 1


class Budget(BaseModel):
    """Limits of one run; None means unlimited."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    wall_hours: float = Field(default=12.0, gt=0)
    tokens: int | None = Field(default=None, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)


class RunSpec(BaseModel):
    """One agent on one task of one environment.

    ``environment`` is a registered environment's name (checked when the run's
    environment is opened, so a run of an uninstalled environment can still be read).
    Hidden grading seeds are fresh from the OS for every grading, so a run has no seed;
    ``seed`` in run.json files written before it was dropped is accepted and ignored.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    run_id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")
    environment: str = Field(
        default="kernels", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._-]+$"
    )
    task: str = Field(min_length=1)
    agent: dict[str, Any] = Field(default_factory=dict)
    budget: Budget = Field(default_factory=Budget)
    grader: GraderSettings = Field(default_factory=GraderSettings)

    @model_validator(mode="before")
    @classmethod
    def _drop_legacy_seed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "seed" in data:
            return {k: v for k, v in data.items() if k != "seed"}
        return data


class RunInfo(BaseModel):
    """The contents of ``run.json``: the spec and what it ran on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    spec: RunSpec
    created_at: float
    versions: dict[str, str]
    machine: dict[str, str]

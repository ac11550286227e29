"""`RunSpec`: what a run is (environment, task, agent, budget, grader, seed), and `run.json`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RUN_SCHEMA_VERSION", "Budget", "GraderSettings", "RunInfo", "RunSpec"]

RUN_SCHEMA_VERSION = 1


class Budget(BaseModel):
    """Limits of one run; None means unlimited."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    wall_hours: float = Field(default=12.0, gt=0)
    tokens: int | None = Field(default=None, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)


class GraderSettings(BaseModel):
    """How the run's submissions are graded."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    threads: int = Field(default=1, ge=1)
    timeout_s: float = Field(default=120.0, gt=0)
    timing_pairs: int = Field(default=20, ge=3)
    correctness_seeds: int = Field(default=2, ge=1)


class RunSpec(BaseModel):
    """One agent on one task of one environment."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    run_id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")
    environment: Literal["kernels"] = "kernels"
    task: str = Field(min_length=1)
    agent: dict[str, Any] = Field(default_factory=dict)
    budget: Budget = Field(default_factory=Budget)
    grader: GraderSettings = Field(default_factory=GraderSettings)
    seed: int = 0


class RunInfo(BaseModel):
    """The contents of ``run.json``: the spec and what it ran on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    spec: RunSpec
    created_at: float
    versions: dict[str, str]
    machine: dict[str, str]

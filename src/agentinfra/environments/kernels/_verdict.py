"""The verdict: the one result of grading a submission (schema version 1).

Other tools (the harness, reports, exports) depend on this exact contract. A
verdict is produced by the trusted supervisor only; nothing in it is taken from
the candidate's own account of itself.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentinfra.environments import Finding, Outcome, Severity

__all__ = ["Finding", "Outcome", "Provenance", "Severity", "Verdict"]


class Provenance(BaseModel):
    """What produced the verdict."""

    model_config = ConfigDict(frozen=True)

    grader_version: str
    torch_version: str
    device: str
    device_model: str
    threads: int
    sandbox: str
    problem_sha256: str
    submission_sha256: str


ERROR_LIMIT = 4000
"""The most characters of a verdict's ``error`` (its head and tail are kept)."""


class Verdict(BaseModel):
    """The graded result of one submission on one problem."""

    model_config = ConfigDict(frozen=True)

    schema_version: Literal[1] = 1
    outcome: Outcome
    correct: bool
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    candidate_ms: float | None = None
    baseline_ms: float | None = None
    findings: list[Finding] = Field(default_factory=list)
    provenance: Provenance
    error: str | None = None
    """Why grading stopped. It may quote the candidate's own stderr and exception text, which agents
    need to debug: that part is candidate-controlled (anything the candidate could read, it can
    print), capped at `ERROR_LIMIT` characters, and never trusted: show it, never parse it."""

    @property
    def is_passed(self) -> bool:
        """True when the outcome is `Outcome.PASSED`."""
        return self.outcome is Outcome.PASSED

    def blocking(self) -> list[Finding]:
        """The findings with severity ``block``."""
        return [f for f in self.findings if f.severity == "block"]

"""The verdict: the one result of grading a submission (schema version 1), and the stop that
ends a grading early with an outcome (`StopGradingError`).

Other tools (the harness, reports, exports) depend on this exact contract. A
verdict is produced by the trusted supervisor only; nothing in it is taken from
the candidate's own account of itself.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentinfra.environments import Finding, Outcome, Severity

__all__ = [
    "ERROR_LIMIT",
    "Finding",
    "Outcome",
    "Provenance",
    "Severity",
    "StopGradingError",
    "Utilisation",
    "Verdict",
    "capped_error",
]


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


class Utilisation(BaseModel):
    """How close the candidate's median call came to this machine's peaks: its roofline position.

    Work per call comes from the problem's ``flops`` and ``bytes`` metadata; where
    ``bytes`` is absent it is estimated as the inputs read plus the output written
    once (``bytes_source`` says which). Peaks are the reference worker's own
    measurements on this machine and device (a large matmul; a large copy).
    """

    model_config = ConfigDict(frozen=True)

    flops_per_s: float | None
    bytes_per_s: float
    bytes_source: Literal["problem", "estimate: inputs + output"]
    peak_flops_per_s: float
    peak_bytes_per_s: float
    flops_fraction: float | None
    """Achieved FLOP/s over the peak FLOP/s (None without a FLOP count)."""
    bytes_fraction: float
    """Achieved bytes/s over the peak bandwidth."""
    arithmetic_intensity: float | None
    """FLOPs per byte (None without a FLOP count)."""
    bound: Literal["compute", "memory"]
    """Which roof limits a kernel of this intensity on this machine (memory without a FLOP count)."""
    roofline_fraction: float
    """Achieved throughput over the roof at this intensity: 1.0 is the hardware limit."""


ERROR_LIMIT = 4000
"""The most characters of a verdict's ``error`` (its head and tail are kept)."""


def capped_error(error: str) -> str:
    """``error`` within `ERROR_LIMIT` characters: its head and tail, the cut marked."""
    if len(error) <= ERROR_LIMIT:
        return error
    half = (ERROR_LIMIT - 40) // 2
    return f"{error[:half]} [... {len(error) - 2 * half} characters cut ...] {error[-half:]}"


class StopGradingError(Exception):
    """Ends a grading early with ``outcome``; ``error`` becomes the verdict's ``error``.

    ``finding``, when set, is recorded first: a ``problem`` finding when the problem, not
    the candidate, is to blame (the outcome is then ``grader_error``).
    """

    def __init__(self, outcome: Outcome, error: str, finding: Finding | None = None) -> None:
        super().__init__(error)
        self.outcome = outcome
        self.error = error
        self.finding = finding


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
    utilisation: Utilisation | None = None
    """The candidate's roofline position; present when its speed was measured."""
    timed_calls: int | None = None
    """Calls timed per side (after warm-up); present when the speed was measured. Fewer than
    ``timing_pairs`` when a slow problem's plan adapted (the grader's threat model)."""
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

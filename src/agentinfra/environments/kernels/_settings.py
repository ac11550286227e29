"""`KernelSettings`: how a kernels run grades, stored in its ``run.json`` (``spec.settings``).

The field names are the grader's own, end to end: ``AGENTINFRA_GRADER_*`` ->
`GraderConfig` (``agentinfra._settings``) -> `KernelSettings` (here, one
conversion: `KernelSettings.from_config`) -> `GradeOptions` (one conversion:
`GradeOptions.from_settings`). `strict_settings` and `quick_settings` are the
environment's rules for ``regrade --strict`` and ``replay-run --quick``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentinfra._settings import GraderConfig, Settings

__all__ = ["KernelSettings", "kernel_settings", "quick_settings", "strict_settings"]

_QUICK_TIMING_PAIRS = 8


class KernelSettings(BaseModel):
    """How a kernels run's submissions are graded; stored in ``run.json`` (``spec.settings``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    threads: int = Field(default=1, ge=1)
    """Torch intra-op threads on both sides (AGENTINFRA_GRADER_THREADS)."""
    timeout_s: float = Field(default=120.0, gt=0)
    """Wall-clock limit of one candidate process (AGENTINFRA_GRADER_TIMEOUT_S)."""
    timing_pairs: int = Field(default=20, ge=3)
    correctness_seeds: int = Field(default=2, ge=1)
    memory_limit_bytes: int | None = Field(default=None, ge=64 << 20)
    """A cap on the candidate's memory limit, which is sized per problem (AGENTINFRA_GRADER_MEMORY);
    None: no cap beyond the machine's. Runs stored before it was a cap keep their value as the cap."""
    max_processes: int = Field(default=64, ge=1)
    """Processes and threads the candidate may start (AGENTINFRA_GRADER_MAX_PROCESSES)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where kernels are graded (AGENTINFRA_GRADER_DEVICE)."""
    fork_server: bool = True
    """Fork CPU workers from a zygote with torch imported (AGENTINFRA_GRADER_FORK_SERVER)."""

    @classmethod
    def from_config(cls, config: GraderConfig, **overrides: Any) -> KernelSettings:
        """The settings of ``config`` (``AGENTINFRA_GRADER_*``), with the overrides that are not None."""
        values: dict[str, Any] = {
            "threads": config.threads,
            "timeout_s": config.timeout_s,
            "memory_limit_bytes": config.memory_limit_bytes,
            "max_processes": config.max_processes,
            "device": config.device,
            "fork_server": config.fork_server,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def kernel_settings(settings: Settings) -> KernelSettings:
    """A new kernels run's settings: the ``AGENTINFRA_GRADER_*`` ones."""
    return KernelSettings.from_config(settings.grader)


def strict_settings(settings: KernelSettings) -> KernelSettings:
    """``regrade --strict``: twice the run's correctness seeds and timing pairs."""
    return settings.model_copy(
        update={
            "correctness_seeds": settings.correctness_seeds * 2,
            "timing_pairs": settings.timing_pairs * 2,
        }
    )


def quick_settings(settings: KernelSettings) -> KernelSettings:
    """``replay-run --quick``: fewer timing pairs (faster, noisier)."""
    return settings.model_copy(update={"timing_pairs": _QUICK_TIMING_PAIRS})

"""Grading on a Ray cluster: the same queue, with evaluations run as Ray tasks.

Ray is the existing distributed engine; agentinfra only ships each grading to it.
The task and submission travel as bytes (not paths), so any node can grade; each
node needs agentinfra installed and its sandbox tools (``unshare``, ``setpriv``).
Install with ``pip install 'agentinfra[ray]'``.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from agentinfra.errors import HarnessError
from agentinfra.harness._environment import KernelEnvironment

__all__ = ["RayKernelEnvironment"]


def _grade_bytes(
    task_name: str, task: bytes, submission: bytes, options: dict[str, Any]
) -> dict[str, Any]:
    """Runs in a Ray worker: writes both files to a private directory and grades."""
    from agentinfra.environments.kernels import GradeOptions, grade

    with tempfile.TemporaryDirectory(prefix="agentinfra-ray-") as folder:
        task_path = Path(folder) / task_name
        submission_path = Path(folder) / "submission.py"
        task_path.write_bytes(task)
        submission_path.write_bytes(submission)
        return grade(task_path, submission_path, GradeOptions(**options)).model_dump(mode="json")


class RayKernelEnvironment(KernelEnvironment):
    """`KernelEnvironment` whose gradings run as Ray tasks (one CPU each by default)."""

    def __init__(
        self,
        inner: KernelEnvironment,
        *,
        address: str | None = None,
        num_cpus_per_grading: float = 1.0,
    ) -> None:
        super().__init__(inner.task, inner.settings)
        try:
            import ray
        except ImportError:
            raise HarnessError("--cluster needs Ray: pip install 'agentinfra[ray]'") from None
        if not ray.is_initialized():
            try:
                ray.init(address=None if address in (None, "local") else address, include_dashboard=False,
                         log_to_driver=False, ignore_reinit_error=True)  # fmt: skip
            except Exception as exc:  # Ray raises many types for an unreachable cluster
                raise HarnessError(f"cannot connect to Ray cluster {address!r}: {exc}") from None
        self._remote = ray.remote(num_cpus=num_cpus_per_grading)(_grade_bytes)
        self.address = address or "local"

    async def evaluate(self, submission: Path, *, seed: int | None = None) -> dict[str, Any]:
        options = {
            "threads": self.settings.threads,
            "timeout_s": self.settings.timeout_s,
            "timing_pairs": self.settings.timing_pairs,
            "correctness_seeds": self.settings.correctness_seeds,
            "seed": seed,
        }
        reference = self._remote.remote(
            self.task.name, self.task.read_bytes(), submission.read_bytes(), options
        )
        result: dict[str, Any] = await asyncio.wrap_future(reference.future())
        return result

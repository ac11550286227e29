"""A grading's two workers: started (with reserved uids), called, and who is blamed when one fails.

The reference is the problem's own code: when it fails, times out or dies, the
problem is blamed (``grader_error`` with a ``problem`` finding), never the
candidate. The candidate works within its wall-clock budget, which counts only
the time the grader waits on it (a slow reference never spends it): a timeout
is ``timeout``, a death ``crashed`` (``timeout`` for its CPU-time limit), an exception ``failed`` (``crashed`` for MemoryError and RecursionError). Each
outcome is raised as a `StopGradingError`, which the orchestrator turns into the
verdict.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any, Literal

from agentinfra.environments.kernels._judgements import Refusal
from agentinfra.environments.kernels._process_state import reserve_worker_uid
from agentinfra.environments.kernels._verdict import Finding, Outcome, StopGradingError
from agentinfra.environments.kernels._wire import Frame, TensorBytes
from agentinfra.environments.kernels._workers import (
    ForkServerError,
    SandboxLimits,
    WorkerDiedError,
    WorkerProcess,
    WorkerTimeoutError,
    worker_fork_server,
)
from agentinfra.errors import TaskEnvironmentError
from agentinfra.sandbox import ForkServer, probe_sandbox_mode

__all__ = ["WorkerCalls", "blame_problem"]


def blame_problem(refusal: Refusal) -> StopGradingError:
    """Stops grading with ``grader_error`` and a ``problem`` finding: the problem, not the candidate."""
    finding = Finding(
        check="problem", severity="warn", message=refusal.message, evidence=refusal.evidence
    )
    return StopGradingError(Outcome.GRADER_ERROR, refusal.message, finding)


class WorkerCalls:
    """The reference and candidate workers of one grading, and the candidate's budget."""

    def __init__(self, *, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        """The candidate's wall-clock budget; the reference gets at least 60 s per request."""
        self.reference: WorkerProcess | None = None
        self.candidate: WorkerProcess | None = None
        self.budget_s = timeout_s
        """Seconds the grader may wait on the candidate's replies, all calls together (a slow
        reference extends it: `_grader._Grading.check_reference`)."""
        self.spent_s = 0.0
        """Seconds spent waiting on the candidate so far."""
        self._uid_locks: list[int] = []
        """The reservations of the workers' uids, released by `close` after the workers are killed."""

    def start_reference(self, private: Path, limits: SandboxLimits, *, device: str, use_fork_server: bool,
                        fd_socket: int) -> None:  # fmt: skip
        """Starts the reference worker from ``private``'s ``problem.py`` on a uid reserved for the
        grading's life (no limits: it is the problem's own code)."""
        self.reference = self._start(private, "reference", limits, device=device,
                                     use_fork_server=use_fork_server, fd_socket=fd_socket)  # fmt: skip

    def start_candidate(self, private: Path, limits: SandboxLimits, *, device: str, use_fork_server: bool,
                        fd_socket: int) -> None:  # fmt: skip
        """Starts the candidate worker from ``private``'s ``submission.py`` with ``limits`` (its memory
        limit is sized from the reference, so it starts after the reference's self-check)."""
        self.candidate = self._start(private, "candidate", limits, device=device,
                                     use_fork_server=use_fork_server, fd_socket=fd_socket)  # fmt: skip

    def _start(self, private: Path, role: Literal["reference", "candidate"], limits: SandboxLimits, *,
               device: str, use_fork_server: bool, fd_socket: int) -> WorkerProcess:  # fmt: skip
        server = _fork_server(limits.threads, device) if use_fork_server else None
        program = private / ("problem.py" if role == "reference" else "submission.py")
        try:
            return WorkerProcess.start(
                workdir=private / role, role=role, limits=limits, program=program, uid=self._worker_uid(),
                device=device, fork_server=server, fd_socket=fd_socket,
            )  # fmt: skip
        except ForkServerError as exc:
            raise TaskEnvironmentError(
                f"the grader's fork server failed: {exc}; grade with GradeOptions(fork_server=False) "
                "(AGENTINFRA_GRADER_FORK_SERVER=0) to start workers without it"
            ) from None

    def _worker_uid(self) -> int:
        """A uid for one worker, reserved for this grading's life (`reserve_worker_uid`)."""
        uid, lock = reserve_worker_uid()
        self._uid_locks.append(lock)
        return uid

    def reference_call(
        self,
        header: dict[str, Any],
        tensors: list[TensorBytes] | None = None,
        *,
        receive_only: bool = False,
    ) -> Frame:
        """The reference's reply to ``header``; any failure blames the problem."""
        assert self.reference is not None
        timeout = max(60.0, self.timeout_s)
        try:
            frame = _exchange(self.reference, header, tensors, timeout, receive_only=receive_only)
        except WorkerTimeoutError:
            raise blame_problem(Refusal(
                f"the reference took over {timeout:.0f} s for one {header.get('op')} request: the problem is too "
                "slow for this machine; raise --timeout-s (GradeOptions.timeout_s) or shrink the problem's sizes"
            )) from None  # fmt: skip
        except WorkerDiedError as exc:
            raise self._reference_death(exc, header) from None
        if not frame.header.get("ok"):
            raise blame_problem(
                Refusal(
                    f"the problem's own code failed in {header.get('op')}: {frame.header.get('error')}"
                )
            )
        return frame

    def _reference_death(self, exc: WorkerDiedError, header: dict[str, Any]) -> StopGradingError:
        assert self.reference is not None
        with contextlib.suppress(Exception):
            self.reference.process.wait(timeout=5)
        code = self.reference.process.poll()
        # alive: what it sent could not be read (malformed, or over the frame limit)
        if code is None:
            return blame_problem(Refusal(
                f"the reference's reply to {header.get('op')} could not be read: {exc}",
                self.reference.stderr_tail(),
            ))  # fmt: skip
        killed = code in (-signal.SIGKILL, 128 + signal.SIGKILL)
        why = (
            "it was killed (SIGKILL: most likely the machine ran out of memory; see dmesg)"
            if killed
            else f"exit status {code}"
        )
        return blame_problem(Refusal(
            f"the reference process died during {header.get('op')}: {why}; the problem may be too large for "
            "this machine: shrink its sizes",
            f"{exc}; {self.reference.stderr_tail()}",
        ))  # fmt: skip

    def candidate_call(self, header: dict[str, Any], tensors: list[TensorBytes] | None = None, *, phase: str,
                       receive_only: bool = False, allow_error: bool = False) -> Frame:  # fmt: skip
        """The candidate's reply to ``header`` within what is left of its budget; ``phase`` names
        the step in errors."""
        assert self.candidate is not None
        left = self.budget_s - self.spent_s
        if left <= 0:
            raise StopGradingError(
                Outcome.TIMEOUT,
                f"candidate exceeded its {self.timeout_s:.0f} s budget during {phase}",
            )
        started = time.monotonic()
        try:
            frame = _exchange(self.candidate, header, tensors, left, receive_only=receive_only)
        except WorkerTimeoutError:
            raise StopGradingError(
                Outcome.TIMEOUT,
                f"candidate exceeded its {self.timeout_s:.0f} s budget during {phase}",
            ) from None
        except WorkerDiedError as exc:
            raise self._candidate_death(exc, phase) from None
        finally:
            self.spent_s += time.monotonic() - started
        if not frame.header.get("ok") and not allow_error:
            kind = frame.header.get("error_type", "")
            outcome = (
                Outcome.CRASHED if kind in ("MemoryError", "RecursionError") else Outcome.FAILED
            )
            raise StopGradingError(
                outcome, f"candidate raised during {phase}: {str(frame.header.get('error'))[:1500]}"
            )
        if not frame.header.get("ok") and frame.header.get("error_type") == "MemoryError":
            raise StopGradingError(Outcome.CRASHED, f"candidate ran out of memory during {phase}")
        return frame

    def _candidate_death(self, exc: WorkerDiedError, phase: str) -> StopGradingError:
        assert self.candidate is not None
        with contextlib.suppress(Exception):
            self.candidate.process.wait(timeout=5)
        code = self.candidate.process.poll()
        tail = self.candidate.stderr_tail(600)
        if code is not None and code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
            return StopGradingError(
                Outcome.TIMEOUT, f"candidate hit its CPU-time limit during {phase}"
            )
        return StopGradingError(
            Outcome.CRASHED,
            f"candidate process ended during {phase} (exit status {code}): {exc}; stderr: {tail}",
        )

    def close(self) -> None:
        """Kills both workers (the candidate first; errors ignored), then releases their uids."""
        for worker in (self.candidate, self.reference):
            if worker is not None:
                with contextlib.suppress(Exception):
                    worker.kill()
        while self._uid_locks:  # after the kill: the uids' processes are gone
            os.close(self._uid_locks.pop())


def _exchange(worker: WorkerProcess, header: dict[str, Any], tensors: list[TensorBytes] | None,
              timeout_s: float, *, receive_only: bool) -> Frame:  # fmt: skip
    """``worker``'s next frame (``receive_only``: one it sends unasked), else its reply to ``header``."""
    if receive_only:
        return worker.receive(timeout_s=timeout_s)
    return worker.request(header, tensors, timeout_s=timeout_s)


def _fork_server(threads: int, device: str) -> ForkServer | None:
    """The zygote to fork workers from: CPU gradings in a namespace jail."""
    if device != "cpu" or probe_sandbox_mode() not in ("namespaces+uid", "userns"):
        return None
    return worker_fork_server(threads)

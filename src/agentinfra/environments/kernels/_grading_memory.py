"""One grading's memory: its reservation in the host's ledger, the candidate's limit, and who is
blamed when the candidate runs out (decision 0024).

`GradingMemory` is the orchestrator's (`_grader`) memory step, in three calls:
`admit` (before the reference loads: reserve what the sizes say, or the plan an
earlier grading of this problem measured; wait in turn; refuse what cannot fit on
this machine at all), `size` (after the reference's self-check: the plan from its
measured peaks (`_sizing.memory_plan`), refused over the user's cap, the reservation
grown to it, or `RestartGradingError` when it cannot grow now), and `blame` (a
candidate that ran out of memory). Measurements come from the reference worker only;
the candidate's account of itself decides nothing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from agentinfra._settings import format_size
from agentinfra.environments.kernels._judgements import Refusal, cap_refusal
from agentinfra.environments.kernels._process_state import TRUSTED
from agentinfra.environments.kernels._sizing import (
    MARGIN_FLOOR_BYTES,
    MemoryPlan,
    ProblemSizes,
    admission_bytes,
    memory_plan,
)
from agentinfra.environments.kernels._verdict import Finding, Outcome, StopGradingError
from agentinfra.environments.kernels._worker_calls import blame_problem
from agentinfra.environments.kernels._workers import WorkerProcess
from agentinfra.sandbox import (
    LedgerView,
    MemoryLedger,
    MemoryTooLargeError,
    MemoryWaitTimeoutError,
    Reservation,
)

__all__ = ["GradingMemory", "MemoryRules", "RestartGradingError"]

logger = logging.getLogger(__name__)

_OUT_OF_MEMORY_SIGNS = ("MemoryError", "ran out of memory", "allocate memory", "out of memory")


class RestartGradingError(Exception):
    """The reservation could not grow to the measured plan now: the grading starts again and waits
    in the ledger's queue for the whole plan (it never holds memory while it waits for more)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRules:
    """What one grading's memory step needs from its options and problem."""

    key: tuple[str, str, int]
    """(problem sha256, device, threads): the `TRUSTED.memory` entry of this problem."""
    label: str
    cap_bytes: int | None
    timing_pairs: int
    measure_speed: bool
    max_wait_s: float
    is_cpu: bool


class GradingMemory:
    """One grading's reservation, plan and blame (module docstring)."""

    def __init__(
        self, rules: MemoryRules, ledger: MemoryLedger, *, restarted: bool = False
    ) -> None:
        self.rules = rules
        self.ledger = ledger
        self.restarted = restarted
        """A second start (`RestartGradingError`): the reservation is not grown again."""
        self.reservation: Reservation | None = None
        self.sizes = ProblemSizes(None, None, None)
        self.baseline_bytes: int | None = None
        """The reference's address space before it loads the problem (its runtime)."""
        self.plan: MemoryPlan | None = None

    def _plan(self, peak_bytes: int | None, resident_bytes: int | None) -> MemoryPlan:
        return memory_plan(
            self.sizes, baseline_bytes=self.baseline_bytes, peak_bytes=peak_bytes, resident_bytes=resident_bytes,
            timing_pairs=self.rules.timing_pairs, measure_speed=self.rules.measure_speed,
        )  # fmt: skip

    def _first_reservation(self) -> tuple[int, MemoryPlan | None]:
        """What `admit` reserves: the plan measured earlier, else the sizes' least; and that plan."""
        known = TRUSTED.memory.get(self.rules.key)
        plan = self._plan(*known) if known is not None else None
        size = plan.reserve_bytes if plan is not None else admission_bytes(
            self.sizes, timing_pairs=self.rules.timing_pairs, measure_speed=self.rules.measure_speed
        )  # fmt: skip
        return size, plan

    def unfit(self, sizes: ProblemSizes, baseline_bytes: int | None) -> Refusal | None:
        """The refusal of a grading that could not fit on this machine even with no other grading
        running (what `admit` would reserve, against `LedgerView.most_bytes`); None otherwise."""
        self.sizes, self.baseline_bytes = sizes, baseline_bytes
        size, plan = self._first_reservation()
        view = self.ledger.view()
        return self._machine_refusal(size, view, plan) if size > view.most_bytes else None

    def admit(self, sizes: ProblemSizes, baseline_bytes: int | None) -> None:
        """Reserves the grading's memory, waiting in turn (at most ``max_wait_s``, then a ``memory``
        ``grader_error``); a grading that cannot fit on this machine at all is refused.

        Reserved: the plan an earlier grading of this problem in this process measured, else the
        least the sizes say (`admission_bytes`), grown by `size` once measured.
        """
        self.sizes, self.baseline_bytes = sizes, baseline_bytes
        size, plan = self._first_reservation()
        label = f"{self.rules.label}, pid {os.getpid()}"

        def waiting(view: LedgerView) -> None:
            logger.info(
                "grading of %s waits for %s of memory: %s",
                label,
                format_size(size),
                view.describe(),
            )

        try:
            self.reservation = self.ledger.reserve(
                size, label=label, max_wait_s=self.rules.max_wait_s, on_wait=waiting
            )
        except MemoryTooLargeError as exc:
            raise blame_problem(self._machine_refusal(size, exc.view, plan)) from None
        except MemoryWaitTimeoutError as exc:
            raise StopGradingError(
                Outcome.GRADER_ERROR,
                f"no memory for this grading within {exc.waited_s:.0f} s: it needs about {format_size(size)}; "
                f"{exc.view.describe()}",
                Finding(check="memory", severity="warn", message="the grading waited for memory past its bound",
                        evidence=exc.view.describe()),
            ) from None  # fmt: skip

    def _machine_refusal(self, size: int, view: LedgerView, plan: MemoryPlan | None) -> Refusal:
        how = plan.describe() if plan is not None else (
            f"at least the reference and the candidate each holding the problem's data "
            f"({self.sizes.describe()}) and the supervisor's copies"
        )  # fmt: skip
        return Refusal(
            f"problem too large for this machine: grading it holds about {format_size(size)} of memory ({how}); "
            f"this machine can give a grading at most {format_size(max(view.most_bytes, 0))} "
            f"(MemAvailable {format_size(view.machine.available_bytes)} of MemTotal "
            f"{format_size(view.machine.total_bytes)}, less {format_size(view.machine.headroom_bytes)} "
            "headroom, with no other grading running): grade it on a larger machine, or shrink its sizes",
            view.describe(),
        )

    def size(self, reference: WorkerProcess) -> MemoryPlan:
        """The plan from the reference's peaks after its self-check (the largest this process measured
        for the problem: a cached self-check does not run again); refused over the cap, or over the
        machine; `RestartGradingError` when the reservation cannot grow to it now."""
        assert self.reservation is not None
        peak = reference.peak_address_space() if self.rules.is_cpu else None
        resident = reference.peak_resident() if self.rules.is_cpu else None
        known = TRUSTED.memory.get(self.rules.key)
        if known is not None:
            peak, resident = (
                max(a or 0, b or 0) or None for a, b in zip((peak, resident), known, strict=True)
            )
        TRUSTED.memory[self.rules.key] = (peak, resident)
        plan = self.plan = self._plan(peak, resident)
        logger.info("grading of %s: %s", self.rules.label, plan.describe())
        refusal = cap_refusal(plan.limit_bytes, plan.describe(), self.rules.cap_bytes)
        if refusal is not None and self.rules.is_cpu:
            raise blame_problem(refusal)
        try:
            grown = self.reservation.grow(plan.reserve_bytes)
        except MemoryTooLargeError as exc:
            raise blame_problem(self._machine_refusal(plan.reserve_bytes, exc.view, plan)) from None
        if not grown and not self.restarted:
            raise RestartGradingError
        if not grown:  # measured more than the whole plan it waited for: go on, and say so
            logger.warning(
                "grading of %s holds less memory than its plan: %s",
                self.rules.label,
                plan.describe(),
            )
        return plan

    def blame(self, stop: StopGradingError, reference: WorkerProcess | None) -> StopGradingError:
        """Who is to blame when the candidate ran out of memory (its error says so: untrusted, so only
        the reference's figures decide). When the reference itself has since come within the margin's
        floor of the limit (threads' allowance aside), the sizing: ``grader_error``; else the
        candidate: ``crashed``."""
        error = stop.error or ""
        if (
            stop.outcome not in (Outcome.FAILED, Outcome.CRASHED)
            or self.plan is None
            or not any(sign in error for sign in _OUT_OF_MEMORY_SIGNS)
        ):
            return stop
        peak = reference.peak_address_space() if reference is not None else None
        now = self._plan(peak, reference.peak_resident() if reference is not None else None)
        # the reference's own growth (its timing step, the machine's peaks) within the margin's floor
        # is what the margin is for; past it, the limit no longer holds what the reference does
        if (
            self.rules.is_cpu
            and now.reference_peak_bytes
            > self.plan.limit_bytes - self.plan.threads_bytes - MARGIN_FLOOR_BYTES
        ):
            message = (
                f"the candidate ran out of memory at its {format_size(self.plan.limit_bytes)} limit, and the "
                f"reference itself has since reached {format_size(now.reference_peak_bytes)} of address space "
                f"(the limit was sized from {format_size(self.plan.reference_peak_bytes)}): the grader's sizing, "
                "not the candidate, is to blame"
            )
            finding = Finding(
                check="memory_limit", severity="warn", message=message, evidence=error[:300]
            )
            return StopGradingError(Outcome.GRADER_ERROR, message, finding)
        return StopGradingError(
            Outcome.CRASHED,
            f"candidate ran out of memory: {self.plan.describe()}; it needed more than a candidate doing "
            f"the reference's work would ({error[:600]})",
        )

    def release(self) -> None:
        if self.reservation is not None:
            self.reservation.release()
            self.reservation = None

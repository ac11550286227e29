"""Memory sized per problem and reserved machine-wide: graded past a fixed limit, waited for, or refused.

``wide_intermediate.py`` holds a 96 MiB intermediate from 4 MiB of input, so its
reference's peak is far above what its sizes say. The machine is a fake one where a test
needs its figures (`MemoryLedger` over a `MachineMemory` the test sets), so nothing
here allocates more than that problem does.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agentinfra._settings import load_settings
from agentinfra.environments import Outcome
from agentinfra.environments.kernels import GradeOptions, KernelSettings, grade, grade_async
from agentinfra.environments.kernels._process_state import TRUSTED
from agentinfra.sandbox import MachineMemory, MemoryLedger, Reservation

PROBLEMS = Path(__file__).resolve().parents[1] / "fixtures" / "kernels" / "problems"
GIB = 1 << 30
MIB = 1 << 20
WIDE = (PROBLEMS / "wide_intermediate.py").read_bytes()
IDENTITY = WIDE + b"\n\nModelNew = Model\n"


class SpyLedger(MemoryLedger):
    """A ledger over a fake machine that records every reservation's final size."""

    def __init__(self, folder: Path, available: int) -> None:
        super().__init__(folder, machine=lambda: MachineMemory(64 * GIB, available))
        self.sizes: list[int] = []

    def reserve(self, size_bytes: int, **kwargs: object) -> Reservation:  # type: ignore[override]
        reservation = super().reserve(size_bytes, **kwargs)  # type: ignore[arg-type]
        spy = self

        class Recorded(Reservation):
            def release(self) -> None:
                spy.sizes.append(self.size_bytes)
                super().release()

        reservation.__class__ = Recorded
        return reservation


def quick(ledger: MemoryLedger | None = None, **overrides: object) -> GradeOptions:
    return GradeOptions(measure_speed=False, correctness_seeds=1, memory_ledger=ledger, **overrides)  # type: ignore[arg-type]


def test_a_problem_over_a_fixed_limit_is_graded_and_a_cap_below_it_refuses_naming_the_knob(
    tmp_path: Path,
) -> None:
    ledger = SpyLedger(tmp_path, available=32 * GIB)
    verdict = grade(WIDE, IDENTITY, quick(ledger), problem_name="wide_intermediate.py")
    assert verdict.outcome is Outcome.PASSED, verdict
    peak, _ = next(
        v for k, v in TRUSTED.memory.items() if k[0] == verdict.provenance.problem_sha256
    )
    assert peak is not None
    # the same problem under a fixed limit just below its reference's peak (the old way, scaled
    # down), set as a cap through the environment: refused in seconds, naming the cap and the knob
    cap = f"{(peak - 64 * MIB) // MIB}MiB"
    settings = KernelSettings.from_config(load_settings({"AGENTINFRA_GRADER_MEMORY": cap}).grader)
    capped = replace(GradeOptions.from_settings(settings), measure_speed=False, correctness_seeds=1,
                     memory_ledger=ledger)  # fmt: skip
    refused = grade(WIDE, IDENTITY, capped, problem_name="wide_intermediate.py")
    assert refused.outcome is Outcome.GRADER_ERROR
    assert {f.check for f in refused.findings} == {"problem"}
    assert "capped at" in (refused.error or "")
    assert "AGENTINFRA_GRADER_MEMORY" in (refused.error or "")
    assert len(ledger.sizes) in (1, 2)  # refused on its sizes, or once measured
    assert not list(tmp_path.glob("r-*"))  # every reservation was given back


def test_two_gradings_that_do_not_fit_together_run_one_after_the_other(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    alone = SpyLedger(tmp_path / "alone", available=32 * GIB)
    first = grade(WIDE, IDENTITY, quick(alone), problem_name="wide_intermediate.py")
    assert first.outcome is Outcome.PASSED, first
    (one,) = alone.sizes  # the whole plan, measured: later gradings reserve it at once
    # room for one grading and a half (and the 3.2 GiB headroom of a 64 GiB machine)
    ledger = SpyLedger(tmp_path / "shared", available=int(1.5 * one) + int(0.05 * 64 * GIB))

    async def both() -> list[Outcome]:
        verdicts = await asyncio.gather(
            *(
                grade_async(WIDE, IDENTITY, quick(ledger), problem_name="wide_intermediate.py")
                for _ in range(2)
            )
        )
        return [v.outcome for v in verdicts]

    with caplog.at_level(logging.INFO, logger="agentinfra.environments.kernels"):
        assert asyncio.run(both()) == [Outcome.PASSED, Outcome.PASSED]
    waits = [r.getMessage() for r in caplog.records if "waits for" in r.getMessage()]
    assert waits, "the second grading should have waited for the first"
    assert "1 gradings" in waits[0] or "held by 1" in waits[0]


def test_a_problem_that_cannot_fit_on_this_machine_is_refused_naming_its_figure(
    tmp_path: Path,
) -> None:
    small = MemoryLedger(tmp_path, machine=lambda: MachineMemory(4 * GIB, 700 * MIB))
    verdict = grade(WIDE, IDENTITY, quick(small), problem_name="wide_intermediate.py")
    assert verdict.outcome is Outcome.GRADER_ERROR
    assert {f.check for f in verdict.findings} == {"problem"}
    error = verdict.error or ""
    assert "problem too large for this machine" in error
    assert "MemAvailable 700.0 MiB of MemTotal 4.0 GiB" in error
    assert not list(tmp_path.glob("r-*"))


def test_a_grading_that_cannot_grow_to_its_plan_starts_again_and_waits_for_it_whole(
    tmp_path: Path,
) -> None:
    problem = WIDE + b"\n# a problem of its own: no plan measured yet in this process\n"
    # 2 GiB for gradings (64 GiB, 3.2 GiB headroom); another holds 1.2 GiB: the sizes' 0.5 GiB fit
    # beside it, the measured plan (about 1.2 GiB) does not
    ledger = MemoryLedger(tmp_path, machine=lambda: MachineMemory(64 * GIB, int(5.2 * GIB)))
    other = ledger.reserve(int(1.2 * GIB), label="another grading", max_wait_s=0)
    restarted = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "starts again" in record.getMessage():
                restarted.set()

    def release_once_restarted() -> None:
        restarted.wait(120)
        time.sleep(0.5)  # it is waiting in the queue by now
        other.release()

    watch = Watch(level=logging.INFO)
    graders = logging.getLogger("agentinfra.environments.kernels")
    graders.addHandler(watch)
    level = graders.level
    graders.setLevel(logging.INFO)
    helper = threading.Thread(target=release_once_restarted)
    helper.start()
    try:
        verdict = grade(
            problem, problem + b"\n\nModelNew = Model\n", quick(ledger), problem_name="wide.py"
        )
    finally:
        graders.removeHandler(watch)
        graders.setLevel(level)
        other.release()
        helper.join(10)
    assert restarted.is_set()
    assert verdict.outcome is Outcome.PASSED, verdict
    assert not list(tmp_path.glob("r-*"))

"""KernelBench's kinds of problems, unchanged format: the reference against itself never fails.

Each problem in ``tests/fixtures/kernels/problems`` is graded with the identity
submission KernelBench users try first (the problem's own code with
``ModelNew = Model``): a random reference, one too large for the sandbox or the
wire, a slow one. The verdict is ``passed``, or ``grader_error`` with a
``problem`` finding that blames the problem; never ``failed`` for the candidate.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agentinfra.environments import Outcome
from agentinfra.environments.kernels import GradeOptions, Verdict, grade
from agentinfra.environments.kernels._timing import MIN_PAIRS, SLOW_CALL_S, SLOW_TIMED_S
from agentinfra.sandbox import MachineMemory, MemoryLedger

PROBLEMS = Path(__file__).resolve().parents[1] / "fixtures" / "kernels" / "problems"


def identity(problem: Path) -> bytes:
    """The problem's own code as its submission, the identity KernelBench users try first."""
    return problem.read_bytes() + b"\n\nModelNew = Model\n"


def grade_identity(name: str, **options: object) -> Verdict:
    problem = PROBLEMS / name
    return grade(
        problem.read_bytes(), identity(problem), GradeOptions(**options), problem_name=name
    )  # type: ignore[arg-type]


def checks(verdict: Verdict) -> set[str]:
    return {f.check for f in verdict.findings}


@pytest.mark.slow
def test_a_reference_with_dropout_is_graded_in_eval_mode() -> None:
    verdict = grade_identity("matmul_dropout_softmax.py")
    assert verdict.outcome is Outcome.PASSED, verdict
    (finding,) = [f for f in verdict.findings if f.check == "nondeterministic_reference"]
    assert "Dropout" in finding.message
    assert "eval mode" in finding.message
    # a wrong candidate still fails in eval mode: the policy does not weaken the check
    problem = (PROBLEMS / "matmul_dropout_softmax.py").read_bytes()
    wrong = problem.replace(b"dim=1", b"dim=0") + b"\n\nModelNew = Model\n"
    failed = grade(problem, wrong, GradeOptions(measure_speed=False))
    assert failed.outcome is Outcome.FAILED


def test_a_reference_random_in_eval_mode_too_blames_the_problem() -> None:
    verdict = grade_identity("noise_in_forward.py")
    assert verdict.outcome is Outcome.GRADER_ERROR
    assert checks(verdict) == {"problem"}
    assert "training and in eval mode" in (verdict.error or "")


def test_a_problem_too_large_is_refused_in_seconds_naming_sizes_limit_and_knob(
    tmp_path: Path,
) -> None:
    # on a machine with room for it (a fake one), the wire's frame is what refuses it
    roomy = MemoryLedger(tmp_path, machine=lambda: MachineMemory(256 << 30, 200 << 30))
    started = time.monotonic()
    verdict = grade_identity("huge_output.py", memory_ledger=roomy)
    assert time.monotonic() - started < 30  # sized on the meta device: 4.1 GiB is never allocated
    assert verdict.outcome is Outcome.GRADER_ERROR
    assert checks(verdict) == {"problem"}
    error = verdict.error or ""
    assert "output 4.1 GiB" in error
    assert "over the 4.0 GiB frame" in error  # no cap by default: the wire's frame is the limit
    # under a cap below what the sizes say the candidate needs, the cap and its knob are named
    capped = grade_identity("huge_output.py", memory_limit_bytes=4 << 30, memory_ledger=roomy)
    assert capped.outcome is Outcome.GRADER_ERROR
    assert "capped at 4.0 GiB" in (capped.error or "")
    assert "AGENTINFRA_GRADER_MEMORY" in (capped.error or "")
    # on a machine without room for it too, the frame is named first (a larger machine would not
    # lift it), then the machine's figure
    small = MemoryLedger(tmp_path, machine=lambda: MachineMemory(16 << 30, 12 << 30))
    machine = grade_identity("huge_output.py", memory_ledger=small)
    error = machine.error or ""
    assert machine.outcome is Outcome.GRADER_ERROR
    assert checks(machine) == {"problem"}
    assert "over the 4.0 GiB frame" in error
    assert "nor would it fit this machine" in error
    assert "MemAvailable 12.0 GiB of MemTotal 16.0 GiB" in error
    assert error.index("frame") < error.index("MemAvailable")


@pytest.mark.slow
def test_a_slow_problem_times_fewer_calls_and_says_how_many() -> None:
    # asked for 200 pairs, a slow problem times single calls within its budget of reference
    # work instead: under SLOW_TIMED_S / SLOW_CALL_S of them whatever the machine's speed (the
    # early stop may cut it shorter; on a loaded machine it may not, so it is not asserted)
    verdict = grade_identity("slow_chain.py", timing_pairs=200)
    assert verdict.outcome is Outcome.PASSED, verdict
    assert verdict.timed_calls is not None
    assert MIN_PAIRS <= verdict.timed_calls <= SLOW_TIMED_S / SLOW_CALL_S < 200
    assert verdict.speedup is not None
    assert 0.7 < verdict.speedup < 1.4


def test_a_problem_whose_own_code_fails_blames_the_problem() -> None:
    verdict = grade_identity("broken_reference.py")
    assert verdict.outcome is Outcome.GRADER_ERROR
    assert checks(verdict) == {"problem"}
    assert "the problem's own code failed in gen" in (verdict.error or "")

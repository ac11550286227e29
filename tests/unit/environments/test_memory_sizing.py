"""The candidate's memory limit and the grading's reservation, from the reference's measured figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentinfra.environments.kernels._compare import COMPARE_BYTES
from agentinfra.environments.kernels._grading_memory import GradingMemory, MemoryRules
from agentinfra.environments.kernels._sizing import (
    MARGIN_FLOOR_BYTES,
    THREAD_ADDRESS_BYTES,
    MemoryPlan,
    ProblemSizes,
    admission_bytes,
    memory_plan,
    supervisor_bytes,
)
from agentinfra.environments.kernels._timing import largest_plan, plan_timing
from agentinfra.environments.kernels._verdict import Outcome, StopGradingError
from agentinfra.sandbox import MemoryLedger

GIB = 1 << 30
MIB = 1 << 20
THREADS = 8 * THREAD_ADDRESS_BYTES  # 8 more threads' arenas and stacks: address space, not resident
# KernelBench level2/3_ConvTranspose3d_Sum_LayerNorm_AvgPool_GELU as measured on this machine: the
# reference's VmPeak 0.64 GiB before loading, 3.93 GiB after its self-check, VmHWM about 3.5 GiB
CONV3D = ProblemSizes(params_bytes=221_696, inputs_bytes=64 * MIB, output_bytes=128 * MIB)


def test_the_limit_is_the_references_peak_plus_a_quarter_of_its_data_and_a_batch() -> None:
    plan = memory_plan(CONV3D, baseline_bytes=640 * MIB, peak_bytes=4024 * MIB, resident_bytes=3584 * MIB,
                       timing_pairs=20, measure_speed=True)  # fmt: skip
    data = 4024 * MIB - 640 * MIB
    assert plan.margin_bytes == data // 4
    assert (
        plan.batch_bytes == 192 * MIB
    )  # one call's inputs and output: the pool allows one a batch
    assert plan.limit_bytes == 4024 * MIB + data // 4 + 192 * MIB + THREADS
    # resident: the reference's high-water mark and a batch; the candidate's limit less what the
    # runtime maps without touching (VmPeak - VmHWM); the supervisor's: the planning call's frame,
    # a comparison's chunks, the largest pool the timing plan makes (its 768 MiB bound of inputs),
    # a batch's copy per side (one call's 64 MiB) and an audit's outputs from both sides
    assert plan.reference_resident_bytes == 3584 * MIB + 192 * MIB
    assert plan.candidate_resident_bytes == plan.limit_bytes - THREADS - (4024 - 3584) * MIB
    assert (
        plan.supervisor_bytes
        == 192 * MIB + COMPARE_BYTES + 768 * MIB + 2 * 64 * MIB + 2 * 128 * MIB
    )
    assert plan.reserve_bytes == (
        plan.reference_resident_bytes + plan.candidate_resident_bytes + plan.supervisor_bytes
    )
    # the identity measured 3.80 GiB on its second call, where the old fixed 4 GiB failed it
    assert plan.limit_bytes > 3.9 * GIB


def test_a_small_problem_gets_a_limit_far_below_the_old_fixed_4_gib() -> None:
    small = ProblemSizes(params_bytes=4 * MIB, inputs_bytes=MIB, output_bytes=MIB)
    plan = memory_plan(small, baseline_bytes=640 * MIB, peak_bytes=700 * MIB, resident_bytes=300 * MIB,
                       timing_pairs=20, measure_speed=True)  # fmt: skip
    assert plan.margin_bytes == MARGIN_FLOOR_BYTES
    assert plan.batch_bytes == 16 * 2 * MIB
    assert plan.limit_bytes == 700 * MIB + MARGIN_FLOOR_BYTES + 32 * MIB + THREADS
    assert plan.limit_bytes < 1.7 * GIB


@pytest.mark.parametrize("peak", [None, 100 * MIB])
def test_the_limit_never_starts_below_what_the_sizes_say_a_worker_holds(peak: int | None) -> None:
    heavy = ProblemSizes(params_bytes=GIB, inputs_bytes=8 * MIB, output_bytes=8 * MIB)
    plan = memory_plan(heavy, baseline_bytes=None, peak_bytes=peak, resident_bytes=None,
                       timing_pairs=20, measure_speed=False)  # fmt: skip
    floor = GIB + 2 * GIB + 16 * MIB  # runtime (unmeasured: 1 GiB), parameters twice, one call
    assert plan.reference_peak_bytes == floor
    assert plan.limit_bytes == floor + (floor - GIB) // 4 + plan.batch_bytes + THREADS
    # no timing, no pool: the self-check's frames beside the parameters kept for the candidate
    assert plan.supervisor_bytes == 16 * MIB + COMPARE_BYTES + GIB + 8 * MIB


def test_an_audits_outputs_are_counted_as_a_workers_batch_allowance_holds_them() -> None:
    """KernelBench level1/7: 16 MiB in, a 4 GiB output. The largest batch the plan makes has 2 calls,
    8 GiB of outputs; the workers' own sizing holds a batch to `batch_bytes` (one call's entry
    here), and so does the audit's count."""
    huge = ProblemSizes(params_bytes=0, inputs_bytes=16 * MIB, output_bytes=4 * GIB)
    pool, batch = largest_plan(16 * MIB, 20)
    entry = 16 * MIB + 4 * GIB
    assert batch // (16 * MIB) * 4 * GIB > entry  # uncapped, the audit would count more
    assert supervisor_bytes(huge, timing_pairs=20, measure_speed=True) == (
        entry + COMPARE_BYTES + pool + 2 * batch + 2 * entry
    )


def test_admission_reserves_the_least_the_sizes_say_before_the_reference_runs() -> None:
    reserve = admission_bytes(CONV3D, timing_pairs=20, measure_speed=True)
    worker = 256 * MIB + 2 * CONV3D.params_bytes + 192 * MIB  # type: ignore[operator]
    supervisor = 192 * MIB + COMPARE_BYTES + 768 * MIB + 2 * 64 * MIB + 2 * 128 * MIB
    assert reserve == 2 * worker + CONV3D.params_bytes + supervisor  # type: ignore[operator]
    plan = memory_plan(CONV3D, baseline_bytes=640 * MIB, peak_bytes=4024 * MIB, resident_bytes=3584 * MIB,
                       timing_pairs=20, measure_speed=True)  # fmt: skip
    assert reserve < plan.reserve_bytes  # grown once measured


def test_the_plan_says_how_it_was_sized() -> None:
    plan = MemoryPlan(limit_bytes=5 * GIB, reference_peak_bytes=4 * GIB, margin_bytes=768 * MIB,
                      batch_bytes=256 * MIB, threads_bytes=640 * MIB, reference_resident_bytes=3 * GIB,
                      candidate_resident_bytes=4 * GIB, supervisor_bytes=GIB)  # fmt: skip
    assert plan.describe() == (
        "the candidate's limit 5.0 GiB of address space is the reference's peak 4.0 GiB plus a 768.0 MiB "
        "margin, a timed batch's 256.0 MiB and 640.0 MiB for 8 more threads; the grading holds about 8.0 GiB "
        "resident (reference "
        "3.0 GiB, candidate 4.0 GiB, supervisor 1.0 GiB)"
    )


class FakeReference:
    """The two figures `GradingMemory.blame` reads from the reference worker."""

    def __init__(self, peak: int, resident: int) -> None:
        self.peak, self.resident = peak, resident

    def peak_address_space(self) -> int:
        return self.peak

    def peak_resident(self) -> int:
        return self.resident


def sized(tmp_path: Path) -> GradingMemory:
    rules = MemoryRules(key=("sha", "cpu", 1), label="conv3d", cap_bytes=None, timing_pairs=20,
                        measure_speed=True, max_wait_s=1, is_cpu=True)  # fmt: skip
    memory = GradingMemory(rules, MemoryLedger(tmp_path))
    memory.sizes, memory.baseline_bytes = CONV3D, 640 * MIB
    memory.plan = memory_plan(CONV3D, baseline_bytes=640 * MIB, peak_bytes=4024 * MIB,
                              resident_bytes=3584 * MIB, timing_pairs=20, measure_speed=True)  # fmt: skip
    return memory


OOM = (
    "candidate raised during correctness: RuntimeError: DefaultCPUAllocator: can't allocate memory"
)


def test_a_candidate_out_of_memory_under_a_limit_the_reference_still_fits_crashed(
    tmp_path: Path,
) -> None:
    stop = sized(tmp_path).blame(
        StopGradingError(Outcome.FAILED, OOM),
        FakeReference(4024 * MIB, 3584 * MIB),  # type: ignore[arg-type]
    )
    assert stop.outcome is Outcome.CRASHED
    assert (stop.error or "").startswith(
        "candidate ran out of memory: the candidate's limit 5.6 GiB"
    )


def test_a_limit_the_reference_itself_outgrew_blames_the_sizing_not_the_candidate(
    tmp_path: Path,
) -> None:
    stop = sized(tmp_path).blame(
        StopGradingError(Outcome.FAILED, OOM),
        FakeReference(4900 * MIB, 3900 * MIB),  # type: ignore[arg-type]
    )
    assert stop.outcome is Outcome.GRADER_ERROR
    assert stop.finding is not None
    assert stop.finding.check == "memory_limit"
    assert "the grader's sizing, not the candidate, is to blame" in (stop.error or "")


def test_other_failures_are_left_alone(tmp_path: Path) -> None:
    failed = StopGradingError(Outcome.FAILED, "candidate raised during correctness: ValueError: no")
    assert sized(tmp_path).blame(failed, FakeReference(9 * GIB, 9 * GIB)) is failed  # type: ignore[arg-type]


@pytest.mark.parametrize("pooled", [1, 64 << 10, 5 * MIB, 100 * MIB, 300 * MIB, GIB])
@pytest.mark.parametrize("pairs", [3, 20, 200])
def test_the_reserved_pool_and_batch_cover_every_plan_the_timing_step_can_make(
    pooled: int, pairs: int
) -> None:
    """Over reference times from 10 ns to 100 s: with 3 timing pairs a slow call (6 pairs, the
    slow plan's floor) makes a larger pool than a fast one, so the bound is not the fast plan alone."""
    pool, batch = largest_plan(pooled, pairs)
    plans = [plan_timing(10.0**exponent, pooled, pairs) for exponent in range(-8, 3)]
    assert max(p.pool_size for p in plans) * pooled == pool
    assert max(p.per_batch for p in plans) * pooled == batch

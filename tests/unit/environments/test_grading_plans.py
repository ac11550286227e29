"""The plans: how many secret seeds each variant gets, and how a grading times, fast and slow.

`check_candidate` runs against a scripted pair of workers (`ScriptedCalls`, the two calls
`WorkerCalls` answers), so each case it asks for is recorded exactly; nothing is started.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, cast

import pytest

from agentinfra.environments import Finding
from agentinfra.environments.kernels._correctness import (
    SLOW_CORRECTNESS_S,
    check_candidate,
    seeds_for,
)
from agentinfra.environments.kernels._problem import ProblemMeta
from agentinfra.environments.kernels._timing import (
    POOL_BYTES_LIMIT,
    SLOW_CALL_S,
    TimingPlan,
    plan_timing,
)
from agentinfra.environments.kernels._verdict import Outcome, StopGradingError
from agentinfra.environments.kernels._wire import Frame, TensorBytes
from agentinfra.environments.kernels._worker_calls import WorkerCalls

ONE = TensorBytes("float32", (1,), b"\x00\x00\x80\x3f")
META = ProblemMeta(path=Path("p.py"), sha256="0" * 64)
SHAPED = ProblemMeta(path=Path("p.py"), sha256="0" * 64, shape_variants=({"n": 3}, {"n": 5}))


class ScriptedCalls:
    """Both workers: the reference generates one finite output, the candidate returns it."""

    def __init__(self) -> None:
        self.cases: list[tuple[str, str]] = []
        """(variant, shape) of each case the reference generated."""

    def reference_call(self, header: dict[str, Any], tensors: object = None) -> Frame:
        self.cases.append((header["variant"], str(header["shape"])))
        return Frame({"inputs": [], "finite": True}, [ONE])

    def candidate_call(
        self, header: dict[str, Any], tensors: object = None, *, phase: str
    ) -> Frame:
        return Frame({"output_type": "torch.Tensor", "inputs_after": []}, [ONE])


def run_cases(meta: ProblemMeta, seeds: int, case_s: float | None) -> list[tuple[str, str]]:
    calls = ScriptedCalls()
    findings: list[Finding] = []
    passed = check_candidate(
        cast(WorkerCalls, calls), meta, random.Random(0), seeds, findings.append, case_s=case_s
    )
    assert passed
    assert not findings
    return calls.cases


@pytest.mark.parametrize(
    ("seeds", "case_s", "expected"),
    [
        (2, None, 2),  # not measured: all of them
        (2, SLOW_CALL_S, 2),  # not slow
        (20, SLOW_CALL_S, 20),  # a fast problem keeps every seed it was asked for
        (2, SLOW_CORRECTNESS_S / 8, 2),  # 8 cases fit the budget exactly
        (2, SLOW_CORRECTNESS_S / 7, 1),
        (4, SLOW_CORRECTNESS_S / 8, 2),  # --strict's 4 seeds, 2 fit
        (2, 4.0, 1),  # level3/44_MiniGPTBlock's 4 s a call
        (2, 600.0, 1),  # never below one
    ],
)
def test_seeds_per_variant(seeds: int, case_s: float | None, expected: int) -> None:
    assert seeds_for(seeds, case_s, META) == expected


def test_shape_variants_count_against_the_budget() -> None:
    assert seeds_for(2, SLOW_CORRECTNESS_S / 10, SHAPED) == 2  # 8 + 2 cases fit
    assert seeds_for(2, SLOW_CORRECTNESS_S / 9, SHAPED) == 1


def test_a_fast_problem_checks_every_seed_of_every_variant() -> None:
    cases = run_cases(SHAPED, 2, 0.01)
    assert sorted(cases) == sorted(
        [(v, "{}") for v in META.variants] * 2 + [("base", "{'n': 3}"), ("base", "{'n': 5}")]
    )


def test_a_slow_problem_checks_fewer_seeds_but_every_variant_and_shape() -> None:
    cases = run_cases(SHAPED, 2, 4.0)
    assert sorted(cases) == sorted(
        [(v, "{}") for v in META.variants] + [("base", "{'n': 3}"), ("base", "{'n': 5}")]
    )


MIB = 1 << 20
GIB = 1 << 30


@pytest.mark.parametrize(
    ("reference_s", "pooled_bytes", "expected"),
    [
        # level1/72: 17 MiB of inputs (and a 113 MiB output, not pooled) at 80 ms a call
        (0.08, 17 * MIB, TimingPlan(per_batch=1, pairs=20, warmup=2, slow=False, pool_size=22)),
        (0.001, MIB, TimingPlan(per_batch=16, pairs=20, warmup=2, slow=False, pool_size=352)),
        (0.001, 8 * MIB, TimingPlan(per_batch=4, pairs=20, warmup=2, slow=False, pool_size=88)),
        (4.0, 16 * MIB, TimingPlan(per_batch=1, pairs=6, warmup=1, slow=True, pool_size=7)),
        # inputs that do not fit one pool: rounds of fresh pools, the pairs kept
        (0.5, 200 * MIB, TimingPlan(per_batch=1, pairs=20, warmup=1, slow=True, pool_size=3)),
        # level1/12: 64 MiB of inputs at 12 ms a call (was 9 timed pairs)
        (0.012, 64 * MIB, TimingPlan(per_batch=1, pairs=20, warmup=2, slow=False, pool_size=12)),
        # level1/40: 256 MiB at 107 ms a call (was 3 timed pairs)
        (0.107, 256 * MIB, TimingPlan(per_batch=1, pairs=20, warmup=1, slow=True, pool_size=3)),
        (0.5, GIB, TimingPlan(per_batch=1, pairs=20, warmup=1, slow=True, pool_size=1)),
    ],
)
def test_the_timing_plan_pools_inputs_within_the_cap(
    reference_s: float, pooled_bytes: int, expected: TimingPlan
) -> None:
    plan = plan_timing(reference_s, pooled_bytes, timing_pairs=20)
    assert plan == expected
    assert plan.pool_size * pooled_bytes <= POOL_BYTES_LIMIT or plan.pool_size == 1
    assert plan.pool_size % plan.per_batch == 0


class SlowWorker:
    """A worker whose every reply takes ``reply_s`` (what `_exchange` asks of it: `request`)."""

    def __init__(self, reply_s: float) -> None:
        self.reply_s = reply_s

    def request(self, header: dict[str, Any], tensors: Any, *, timeout_s: float) -> Frame:
        from agentinfra.environments.kernels._workers import WorkerTimeoutError

        if self.reply_s > timeout_s:
            time.sleep(timeout_s)
            raise WorkerTimeoutError("no reply")
        time.sleep(self.reply_s)
        return Frame({"ok": True}, [])


def test_the_candidates_budget_counts_only_its_own_replies() -> None:
    """The reference's work (its self-check, the timing pools) never spends the candidate's
    budget: ``level1/56`` once timed out "during pool" after the reference had used it."""
    calls = WorkerCalls(timeout_s=0.25)
    calls.reference = cast(Any, SlowWorker(0.3))
    calls.candidate = cast(Any, SlowWorker(0.1))
    for _ in range(2):
        calls.reference_call({"op": "pool_make"})
        calls.candidate_call({"op": "batch"}, phase="timing")
    assert 0.2 <= calls.spent_s < 0.25
    with pytest.raises(StopGradingError, match="exceeded its 0 s budget during audit") as raised:
        calls.candidate_call({"op": "fetch"}, phase="audit")
    assert raised.value.outcome is Outcome.TIMEOUT
    with pytest.raises(StopGradingError, match="during timing"):  # nothing left: not even asked
        calls.candidate_call({"op": "batch"}, phase="timing")

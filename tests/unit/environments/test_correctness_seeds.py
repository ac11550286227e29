"""The correctness plan: how many secret seeds each variant gets, on fast and slow problems.

`check_candidate` runs against a scripted pair of workers (`ScriptedCalls`, the two calls
`WorkerCalls` answers), so each case it asks for is recorded exactly; nothing is started.
"""

from __future__ import annotations

import random
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
from agentinfra.environments.kernels._timing import SLOW_CALL_S
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

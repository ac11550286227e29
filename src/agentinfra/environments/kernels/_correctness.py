"""The correctness steps: the reference's self-check, then the candidate on secret inputs.

`reference_self_check` runs the reference twice on the same fresh inputs; a
reference that disagrees with itself is graded in eval mode (a
``nondeterministic_reference`` warning) or, when it still disagrees, the problem is
blamed (module docstring of `_grader`). The result is cached per problem hash
(`_process_state.TRUSTED`). `check_candidate` runs every secret seed, variant and
shape through both sides and compares the outputs here (`_compare`). Findings go to
``record`` as they arise.

Slow problems cost less, as in the timing plan (`seeds_for`): once one correctness case
costs the reference over ``_timing.SLOW_CALL_S``, the seeds per variant shrink to what
fits in ``SLOW_CORRECTNESS_S`` of reference work, never below one. Every variant and
every shape variant is still checked on every problem; a slow problem gives up only
repeats of a variant on further seeds (and the timing's audits still compare a secret
share of the timed calls, each on fresh base inputs, with the reference).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentinfra.environments.kernels._compare import compare
from agentinfra.environments.kernels._judgements import Refusal
from agentinfra.environments.kernels._problem import ProblemMeta
from agentinfra.environments.kernels._process_state import TRUSTED
from agentinfra.environments.kernels._timing import SLOW_CALL_S
from agentinfra.environments.kernels._verdict import Finding
from agentinfra.environments.kernels._wire import digest
from agentinfra.environments.kernels._worker_calls import WorkerCalls, blame_problem

__all__ = [
    "SLOW_CORRECTNESS_S",
    "SelfCheck",
    "check_candidate",
    "reference_self_check",
    "seeds_for",
]

SLOW_CORRECTNESS_S = 10.0
"""Reference work a slow problem's correctness checks aim at, in seconds (`seeds_for`)."""


@dataclass(frozen=True, slots=True)
class SelfCheck:
    """What the reference's self-check decided."""

    eval_mode: bool
    """Both models are graded in eval mode (the reference was random in training mode)."""
    call_s: float | None
    """One reference call's seconds, when the check ran in this grading."""


def _agrees_with_itself(
    calls: WorkerCalls, meta: ProblemMeta, rng: random.Random
) -> tuple[bool, list[str], str, float]:
    """Runs the reference twice on the same fresh inputs: (agrees, its random modules, why not, s per call)."""
    started = time.monotonic()
    twice = calls.reference_call(
        {
            "op": "gen",
            "seed": rng.randrange(1 << 31),
            "variant": "base",
            "shape": {},
            "repeat": True,
        }
    )
    call_s = (time.monotonic() - started) / 2
    result = compare(twice.tensors[-1], twice.tensors[-2], meta)
    return result.ok, list(twice.header.get("random_modules", [])), result.message, call_s


def reference_self_check(calls: WorkerCalls, meta: ProblemMeta, rng: random.Random, device: str,
                         record: Callable[[Finding], None]) -> SelfCheck:  # fmt: skip
    """The policy for a reference that is random: eval mode, else blame the problem."""
    key = (meta.sha256, device)
    why = "measured earlier in this process"
    call_s: float | None = None
    if key in TRUSTED.self_check and TRUSTED.self_check[key] is None:
        return SelfCheck(eval_mode=False, call_s=None)
    named = TRUSTED.self_check.get(key)
    if named is None:
        agrees, modules, why, call_s = _agrees_with_itself(calls, meta, rng)
        if agrees:
            TRUSTED.self_check[key] = None
            return SelfCheck(eval_mode=False, call_s=call_s)
        named = ", ".join(modules) or "no dropout-like module: random ops in forward"
        calls.reference_call({"op": "mode", "eval": True})
        agrees, _, why_eval, call_s = _agrees_with_itself(calls, meta, rng)
        if not agrees:
            raise blame_problem(Refusal(
                "the reference gives different outputs for the same inputs, in training and in eval "
                f"mode: output comparison cannot grade this problem (random modules: {named})",
                f"training mode: {why}; eval mode: {why_eval}",
            ))  # fmt: skip
    else:
        calls.reference_call({"op": "mode", "eval": True})
    TRUSTED.self_check[key] = named
    record(
        Finding(
            check="nondeterministic_reference",
            severity="warn",
            message="the reference gives different outputs for the same inputs in training mode "
            f"({named}): both models were graded in eval mode",
            evidence=why,
        )
    )
    return SelfCheck(eval_mode=True, call_s=call_s)


def seeds_for(seeds: int, case_s: float | None, meta: ProblemMeta) -> int:
    """Secret seeds per variant: ``seeds``, or on a slow problem as many as fit, at least one.

    ``case_s`` is one correctness case's reference work (the self-check's measure: input
    generation, one call and the transfer). Over ``SLOW_CALL_S`` (the timing plan's line)
    the cases of all seeds, one per variant and seed plus one per shape variant, aim at
    ``SLOW_CORRECTNESS_S`` of it; every variant and shape is checked at least once.
    """
    if case_s is None or case_s <= SLOW_CALL_S:
        return seeds
    fit = int((SLOW_CORRECTNESS_S / case_s - len(meta.shape_variants)) // len(meta.variants))
    return max(1, min(seeds, fit))


def check_candidate(calls: WorkerCalls, meta: ProblemMeta, rng: random.Random, seeds: int,
                    record: Callable[[Finding], None], *, case_s: float | None = None) -> bool:  # fmt: skip
    """Whether the candidate matched the reference on every secret case that counts
    (``seeds`` per variant, fewer on a slow problem: `seeds_for` with ``case_s``)."""
    seeds = seeds_for(seeds, case_s, meta)
    cases: list[tuple[int, str, dict[str, int]]] = [
        (rng.randrange(1 << 31), variant, {}) for _ in range(seeds) for variant in meta.variants
    ]
    cases += [(rng.randrange(1 << 31), "base", dict(shape)) for shape in meta.shape_variants]
    checked = 0
    failures: list[str] = []
    for seed, variant, shape in cases:
        label = f"seed {seed}, variant {variant}" + (f", shape {shape}" if shape else "")
        failure = _check_case(
            calls, meta, record, label, {"seed": seed, "variant": variant, "shape": shape}
        )
        if failure is not _SKIPPED:
            checked += 1
            if failure is not None:
                failures.append(failure)
    if failures:
        record(Finding(check="correctness", severity="warn", evidence="; ".join(failures[:4]),
                       message=f"{len(failures)} of {checked} checks failed"))  # fmt: skip
    return checked > 0 and not failures


_SKIPPED = "skipped"
"""`_check_case` on a variant whose inputs the reference does not keep finite: not a check."""


def _check_case(calls: WorkerCalls, meta: ProblemMeta, record: Callable[[Finding], None],
                label: str, case: dict[str, object]) -> str | None:  # fmt: skip
    """One correctness case: None when the candidate matched, else why not (`_SKIPPED`: not run).

    Its frames die when it returns: the supervisor holds one case's inputs, expected output and
    reply at a time (`_sizing.supervisor_bytes`), never the previous case's beside the next's.
    """
    gen = calls.reference_call({"op": "gen", **case})
    if not gen.header["finite"] and case["variant"] != "base":
        return _SKIPPED
    inputs, expected = gen.tensors[:-1], gen.tensors[-1]
    reply = calls.candidate_call(
        {"op": "call", "inputs": gen.header["inputs"]}, inputs, phase="correctness"
    )
    if reply.header.get("output_type") != "torch.Tensor" or not reply.tensors:
        record(Finding(
            check="output_type", severity="block", evidence=label,
            message=f"output is {reply.header.get('output_type')}, not a plain torch.Tensor",
        ))  # fmt: skip
        return label
    sent = [digest(t) for t in inputs]
    after = [a for a in reply.header.get("inputs_after", []) if isinstance(a, str) and len(a) == 32]
    if after != sent[: len(after)] or len(after) != len(sent):
        record(Finding(check="input_mutation", severity="block",
                       message="an input was modified by the call", evidence=label))  # fmt: skip
    result = compare(reply.tensors[0], expected, meta)
    return None if result.ok else f"{label}: {result.message}"

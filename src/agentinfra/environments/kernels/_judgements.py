"""The judgements that decide a verdict, as pure functions of measurements.

Each takes what the grading measured (wall and CPU seconds per batch, staging CPU,
per-call times, sizes, the machine's peaks) and, where it draws, an
``rng: random.Random``, and returns a value: a `Finding` or None, a `SpeedupResult`
with its interval, or a `Refusal` (the problem, not the candidate, is to blame) or
None. None of them does I/O or records anything: the orchestrator (`_grader`) adds
what they return. The margins are those of `_grader`'s threat model.
"""

from __future__ import annotations

import os
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agentinfra._settings import format_size
from agentinfra.environments.kernels._problem import ProblemMeta
from agentinfra.environments.kernels._verdict import Finding, Utilisation

__all__ = [
    "CI_STOP",
    "CpuWindow",
    "Refusal",
    "SpeedupResult",
    "StagingCpu",
    "bootstrap_ci",
    "cap_refusal",
    "interval_tight",
    "judge_cores",
    "judge_cpu",
    "judge_idle",
    "judge_plausibility",
    "judge_staging",
    "judge_timing_disagreement",
    "physical_floor_s",
    "both_refusals",
    "size_refusal",
    "speedup_result",
    "utilisation",
]

MIN_CORE_WALL_S = 0.1
"""Below this much timed candidate work the core count is not judged (a warning at most)."""
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
STAGE_SHARE = 0.1
STAGE_SLACK_S = 0.0001
"""Staging CPU a candidate may spend beyond the reference's, per batch: ``STAGE_SHARE`` of the
reference's staging and of its own timed work, plus this (honest candidates: 0.99-1.04x the
reference's staging, within 0.06 ms a batch)."""
CI_STOP = 0.05
"""A slow problem's timing stops once the speedup's 95% interval is within this fraction of its median."""
RUNTIME_BYTES = 1 << 30
"""Address space a worker holds for Python and torch before any problem data (measured: ~0.6 GiB)."""
SPEEDUP_RESAMPLES = 400
"""Bootstrap resamples of the verdict's speedup interval (200 for the early-stop test)."""


class CpuWindow(NamedTuple):
    """One candidate batch (or one wait of the candidate's): wall seconds, CPU seconds of its
    process tree, and whether the CPU figure is precise (``schedstat``) or in clock ticks."""

    wall_s: float
    cpu_s: float
    is_precise: bool


@dataclass(slots=True)
class StagingCpu:
    """CPU seconds per staged batch: the reference staging it, the candidate from the start of
    its staging to the start of the timed batch, and the candidate's CPU in the timed batch."""

    reference_s: list[float] = field(default_factory=list)
    candidate_s: list[float] = field(default_factory=list)
    candidate_batch_s: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SpeedupResult:
    """The timing part of a verdict: medians per call and the speedup with its 95% interval."""

    baseline_ms: float
    candidate_ms: float
    speedup: float
    speedup_ci: tuple[float, float]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the problem, not the candidate, cannot be graded here: a ``problem`` finding's text."""

    message: str
    evidence: str = ""


def judge_cpu(
    windows: Sequence[CpuWindow], allowed: float, threads: int, when: str, how: str
) -> Finding | None:
    """A ``threads_processes`` finding when ``windows`` use more than ``allowed`` cores: a block
    only when measurable and repeated, else a warning."""
    wall = sum(w for w, _, _ in windows)
    cpu = sum(c for _, c, _ in windows)
    if wall <= 0 or cpu / wall <= allowed:
        return None
    coarse = sum(1 for _, _, p in windows if not p)
    # A window measured in clock ticks can read up to two ticks high; is the excess beyond that?
    resolution_s = 2 * coarse / TICKS_PER_S
    over = sum(1 for w, c, _ in windows if w > 0.005 and c / w > allowed)
    measurable = wall >= MIN_CORE_WALL_S and cpu - resolution_s > allowed * wall
    repeated = over >= max(3, (len(windows) + 1) // 2)
    message = f"the candidate used {cpu / wall:.2f} cores {when}; {threads} allotted"
    if wall < MIN_CORE_WALL_S:
        message += " (too little timed work to judge: not counted)"
    elif not measurable:
        message += " (within clock-tick resolution: not counted)"
    elif not repeated:
        message += " (in a few batches only: not counted)"
    return Finding(
        check="threads_processes",
        severity="block" if measurable and repeated else "warn",
        message=message,
        evidence=f"cpu {cpu:.3f} s over wall {wall:.3f} s across {len(windows)} batches, {how}; "
        f"{over} batches over {allowed:.2f} cores; {coarse} measured in clock ticks",
    )


def judge_cores(
    empty: Sequence[CpuWindow], timed: Sequence[CpuWindow], threads: int, reference_empty_s: float
) -> Finding | None:
    """Cores the candidate's computation used while timed, beyond the plumbing of a batch
    (the median ``empty`` batch's wall and CPU, subtracted from each ``timed`` one).

    The candidate controls its own empty batches, so, as in the timing, it may only lower what
    is subtracted: the wall is at most ``reference_empty_s`` (the reference's median empty
    batch), and the CPU at most that wall (a batch's plumbing runs on one thread). Otherwise a
    candidate that sleeps in its empty batches would read as using many cores while timed.
    """
    if not empty or not timed:
        return None
    empty_wall = min(statistics.median(w for w, _, _ in empty), reference_empty_s)
    empty_cpu = min(statistics.median(c for _, c, _ in empty), empty_wall)
    work = [CpuWindow(max(w - empty_wall, 0.0), max(c - empty_cpu, 0.0), p) for w, c, p in timed]
    return judge_cpu(
        work, threads * 1.5 + 0.25, threads, "while timed",
        f"after subtracting an empty batch's {empty_cpu * 1e3:.2f} ms cpu and {empty_wall * 1e3:.2f} ms wall",
    )  # fmt: skip


def judge_idle(windows: Sequence[CpuWindow], threads: int) -> Finding | None:
    """CPU the candidate uses while the reference is timed and the candidate has no call.

    An honest candidate waits on its pipe; one that burns CPU, or finishes work in
    the background after returning, shows up here. The allowance is one quarter of
    a core plus the allotted threads beyond the first (an OpenMP pool may spin
    briefly after a parallel region).
    """
    return judge_cpu(windows, 0.25 + (threads - 1), threads, "while it had no call to run",
                     "during the reference's timed batches")  # fmt: skip


def judge_staging(staging: StagingCpu) -> Finding | None:
    """CPU the candidate spent staging batches beyond what the reference spent staging the
    same bytes the same way (each from its own copy, made alike).

    Staging maps a batch's inputs just before the batch is timed. A candidate that
    computes its outputs then, untimed, and only returns them from the timed batch,
    spends the work here instead. Allowed beyond the reference, per batch and over all
    batches: a tenth of the reference's staging, a tenth of the candidate's timed work
    and 0.1 ms. Blocks when the total is over and at least half of the batches (and at
    least 3) are over on their own; a warning when only a few are.
    """
    if not staging.candidate_s:
        return None
    batches = list(zip(staging.candidate_s, staging.reference_s, staging.candidate_batch_s, strict=False))  # fmt: skip

    def allowed(reference: float, timed: float) -> float:
        return STAGE_SHARE * (reference + timed) + STAGE_SLACK_S

    excess = sum(c - r for c, r, _ in batches)
    if excess <= sum(allowed(r, t) for _, r, t in batches):
        return None
    over = sum(1 for c, r, t in batches if c - r > allowed(r, t))
    repeated = over >= max(3, (len(batches) + 1) // 2)
    timed = sum(t for _, _, t in batches)
    return Finding(
        check="staging",
        severity="block" if repeated else "warn",
        message=f"the candidate used {excess * 1e3:.1f} ms more CPU than the reference staging "
        f"the same {len(batches)} batches of inputs (untimed), against {timed * 1e3:.1f} ms "
        "in its timed batches" + ("" if repeated else " (in a few batches only: not counted)"),
        evidence=f"{over} of {len(batches)} batches over a tenth of the reference's staging "
        f"and of their timed work plus {STAGE_SLACK_S * 1e3:.1f} ms",
    )


def physical_floor_s(meta: ProblemMeta, peaks: Mapping[str, float]) -> float:
    """The least time one call can take at this machine's peaks (0.0 where unknown)."""
    floor = 0.0
    if meta.flops and peaks.get("flops_per_s"):
        floor = max(floor, meta.flops / peaks["flops_per_s"])
    if meta.bytes and peaks.get("bytes_per_s"):
        floor = max(floor, meta.bytes / peaks["bytes_per_s"])
    return floor


def judge_plausibility(
    meta: ProblemMeta, peaks: Mapping[str, float], candidate_s: float
) -> Finding | None:
    """A block when ``candidate_s`` per call is under half the physical floor.

    ``candidate_s`` must never read below the candidate's real time
    (`Measurements.candidate_s_at_least`): a block is a claim of cheating.
    """
    floor = physical_floor_s(meta, peaks)
    if not floor or candidate_s >= 0.5 * floor:
        return None
    return Finding(
        check="plausibility",
        severity="block",
        message=f"{candidate_s * 1e3:.4f} ms per call is below the physical floor of {floor * 1e3:.4f} ms for this problem's work on this machine",
        evidence=f"peaks {dict(peaks)}",
    )


def judge_timing_disagreement(device_ms: float, host_ms: float, calls: int) -> Finding | None:
    """A warning when CUDA events read under a quarter of the supervisor's clock for a batch.

    Events only see the default stream: work elsewhere, or patched events, read low.
    """
    if not (device_ms < 0.25 * host_ms and host_ms > 1.0):
        return None
    return Finding(
        check="timing_disagreement",
        severity="warn",
        message=f"CUDA events report {device_ms:.3f} ms for a batch the supervisor's clock measured at {host_ms:.3f} ms",
        evidence=f"batch of {calls} calls",
    )


def bootstrap_ci(ratios: list[float], rng: random.Random, resamples: int) -> tuple[float, float]:
    """The 95% bootstrap interval of the median of ``ratios``."""
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return boot[int(0.025 * len(boot))], boot[int(0.975 * len(boot)) - 1]


def interval_tight(ref_times: list[float], cand_times: list[float], rng: random.Random) -> bool:
    """Whether the speedup's bootstrap 95% interval is within ``CI_STOP`` of its median."""
    ratios = [r / c for r, c in zip(ref_times, cand_times, strict=True)]
    middle = statistics.median(ratios)
    low, high = bootstrap_ci(ratios, rng, 200)
    return middle > 0 and (high - low) / 2 <= CI_STOP * middle


def speedup_result(
    ref_times: list[float], cand_times: list[float], rng: random.Random
) -> SpeedupResult:
    """Medians per call of both sides, and the median of the pairs' ratios with its interval."""
    ratios = [r / c for r, c in zip(ref_times, cand_times, strict=True)]
    return SpeedupResult(
        baseline_ms=statistics.median(ref_times) * 1e3,
        candidate_ms=statistics.median(cand_times) * 1e3,
        speedup=statistics.median(ratios),
        speedup_ci=bootstrap_ci(ratios, rng, SPEEDUP_RESAMPLES),
    )


def utilisation(
    meta: ProblemMeta, peaks: Mapping[str, float], seconds: float, io_bytes: int
) -> Utilisation | None:
    """The roofline position of one call taking ``seconds`` (see `Utilisation`)."""
    peak_flops, peak_bytes = peaks.get("flops_per_s", 0.0), peaks.get("bytes_per_s", 0.0)
    if seconds <= 0 or peak_flops <= 0 or peak_bytes <= 0:
        return None
    work_bytes = meta.bytes if meta.bytes else float(io_bytes)
    intensity = meta.flops / work_bytes if meta.flops and work_bytes else None
    roof = min(peak_flops, intensity * peak_bytes) if intensity is not None else peak_bytes
    achieved = (
        meta.flops / seconds if meta.flops and intensity is not None else work_bytes / seconds
    )
    return Utilisation(
        flops_per_s=meta.flops / seconds if meta.flops else None, bytes_per_s=work_bytes / seconds,
        bytes_source="problem" if meta.bytes else "estimate: inputs + output",
        peak_flops_per_s=peak_flops, peak_bytes_per_s=peak_bytes,
        flops_fraction=meta.flops / seconds / peak_flops if meta.flops else None,
        bytes_fraction=work_bytes / seconds / peak_bytes, arithmetic_intensity=intensity,
        bound="compute" if intensity is not None and intensity * peak_bytes >= peak_flops else "memory",
        roofline_fraction=achieved / roof,
    )  # fmt: skip


def size_refusal(
    sizes: Mapping[str, Any], *, memory_cap_bytes: int | None, max_reply_bytes: int
) -> Refusal | None:
    """A problem that cannot be graded at all, from the reference's meta-device sizes; unknown sizes pass.

    Over the wire's reply frame (one input set and its output, or the self-check's two outputs), or, where the
    user capped the candidate's memory (``memory_cap_bytes``), over that cap. What the machine can
    give is the memory ledger's to judge (`_grader`), not this function's.
    """
    params, inputs, output = (
        sizes.get(k) if isinstance(sizes.get(k), int) else None
        for k in ("params_bytes", "inputs_bytes", "output_bytes")
    )
    parts = f"parameters {_size(params)}, one input set {_size(inputs)}, output {_size(output)}"
    # the candidate receives the parameters and builds its own copy, then holds one call's
    # inputs and output, beside Python and torch (about 1 GiB of address space)
    candidate_need = 2 * (params or 0) + (inputs or 0) + (output or 0) + RUNTIME_BYTES
    if memory_cap_bytes is not None and candidate_need > memory_cap_bytes:
        return Refusal(
            f"problem too large for the sandbox: the candidate needs at least {_size(candidate_need)} ({parts}; "
            f"the parameters twice while it loads, {_size(RUNTIME_BYTES)} for Python and torch); its memory "
            f"is capped at {_size(memory_cap_bytes)} {CAP_KNOB}"
        )
    if inputs is not None and output is not None and inputs + output > max_reply_bytes:
        return Refusal(
            f"problem too large for the grader's wire: one input set and its output are {_size(inputs + output)} "
            f"({parts}), over the {_size(max_reply_bytes)} frame the reference sends them in: shrink the "
            "problem's sizes to grade it here"
        )
    if output is not None and 2 * output > max_reply_bytes:
        return Refusal(
            f"problem output too large: {_size(output)} per call, and the reference's self-check sends two "
            f"in one frame, over the grader's {_size(max_reply_bytes)} (outputs are compared by the "
            f"supervisor; {parts}): shrink the problem's sizes to grade it here"
        )
    return None


def both_refusals(limit: Refusal, machine: Refusal) -> Refusal:
    """A problem over a limit a larger machine would not lift (the wire's frame, the user's cap) and
    over this machine too: the limit first, then the machine's figure (`GradingMemory.unfit`)."""
    return Refusal(
        f"{limit.message}; nor would it fit this machine: {machine.message.removeprefix('problem too large for this machine: ')}",
        machine.evidence,
    )


CAP_KNOB = (
    "(AGENTINFRA_GRADER_MEMORY, GradeOptions.memory_limit_bytes): raise or unset the cap, "
    "or shrink the problem's sizes"
)


def cap_refusal(limit_bytes: int, why: str, memory_cap_bytes: int | None) -> Refusal | None:
    """A candidate limit sized over the user's cap (``why`` says how it was sized)."""
    if memory_cap_bytes is None or limit_bytes <= memory_cap_bytes:
        return None
    return Refusal(
        f"problem too large for the sandbox under its cap: {why}; the candidate's memory is capped at "
        f"{_size(memory_cap_bytes)} {CAP_KNOB}"
    )


def _size(count: int | None) -> str:
    return "unknown" if count is None else format_size(count)

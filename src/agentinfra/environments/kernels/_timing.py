"""The timing step: plan, share the pool, time the ABBA pairs, audit, and measure CPU around it.

`TimingRun` measures and returns `Measurements`; it judges nothing but the audits
(a wrong or uncommitted timed output is a block as it happens) and a CUDA
timing disagreement (a warning), which it hands to ``record`` as they happen, so a
grading stopped mid-way keeps them. The core, idle, staging and plausibility
judgements run afterwards on the measurements (`_judgements`).

The plan: batches of up to 16 calls aimed at ``TARGET_BATCH_S`` of reference work
each, two warm-up pairs, ``timing_pairs`` timed pairs, every call with fresh inputs
from a pool of at most ``POOL_BYTES_LIMIT`` of inputs (outputs are not pooled); a slow problem (one reference call over
``SLOW_CALL_S``) gets single-call batches, one warm-up, about ``SLOW_TIMED_S`` of timed
reference work (at least ``MIN_PAIRS`` pairs) and stops early once the speedup's
interval is tight (`interval_tight`). When the batches' inputs do not fit in one pool,
the pool is made again from fresh seeds each time its batches are used up (a round),
so large inputs cost pool-making time, never timed pairs: no input is used twice, and
the pairs are as many as for small inputs (three pairs of 256 MiB inputs read
1.117x for an identity; nine single calls 1.165x).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from agentinfra.environments.kernels._compare import compare
from agentinfra.environments.kernels._judgements import (
    CpuWindow,
    StagingCpu,
    interval_tight,
    judge_timing_disagreement,
)
from agentinfra.environments.kernels._problem import ProblemMeta
from agentinfra.environments.kernels._process_state import gc_paused
from agentinfra.environments.kernels._timing_pool import CANDIDATE, REFERENCE, TimingPool
from agentinfra.environments.kernels._verdict import Finding, Outcome, StopGradingError
from agentinfra.environments.kernels._wire import Frame, digest
from agentinfra.environments.kernels._worker_calls import WorkerCalls
from agentinfra.environments.kernels._workers import CpuSample

__all__ = ["Measurements", "TimingPlan", "TimingRun", "plan_timing"]

POOL_BYTES_LIMIT = 768 << 20
TARGET_BATCH_S = 0.05
SLOW_CALL_S = 0.1
"""A reference call slower than this makes the timing plan adapt (module docstring)."""
SLOW_TIMED_S = 15.0
"""Timed reference work a slow problem's plan aims at, in seconds."""
MIN_PAIRS = 6
WARMUP_PAIRS = 2
MAX_EXTRA_WARMUP = 3
"""Warm-up pairs added at most while a side's batches still fault pages in (`TimingRun`)."""
COLD_FAULTS_PER_CALL = 256
"""Page faults a call (1 MiB of 4 KiB pages) over which a warm-up batch counts as cold: an
identity of KernelBench's level2/20 faulted 131,072-524,256 pages in timed calls after one
warm-up pair, in the candidate (a younger heap) more than in the reference; warm, 0-3."""


@dataclass(slots=True)
class Measurements:
    """What the timing step measured, for the judgements and the verdict."""

    per_batch: int
    entry_bytes: int
    """Bytes of one call's inputs and output (the utilisation's estimate of its traffic)."""
    ref_times: list[float] = field(default_factory=list)
    """Per timed pair: the reference's seconds per call, its empty batch's overhead subtracted."""
    cand_times: list[float] = field(default_factory=list)
    cand_batch_s: list[float] = field(default_factory=list)
    """Per timed pair: the candidate's batch as the supervisor's clock read it, nothing subtracted."""
    quietest_empty_s: float = 0.0
    """The shortest empty batch either side took: the least plumbing a batch can have had."""
    empty_windows: list[CpuWindow] = field(default_factory=list)
    """The candidate's empty batches (the plumbing subtracted by the core check)."""
    reference_empty_s: float = 0.0
    """The reference's median empty batch: the most plumbing the core check may subtract."""
    timed_windows: list[CpuWindow] = field(default_factory=list)
    """The candidate's timed batches after warm-up."""
    idle_windows: list[CpuWindow] = field(default_factory=list)
    """The candidate while the reference's batches ran, after warm-up."""
    staging: StagingCpu | None = None
    """Staging CPU per batch (CPU devices, where inputs are staged)."""
    audit_failed: bool = False
    warmup_pairs: int = 0
    """Warm-up pairs run: the plan's, and any added while a side still faulted pages in."""

    @property
    def candidate_s_at_least(self) -> float:
        """The candidate's median seconds per call with only the quietest plumbing subtracted.

        ``cand_times`` subtract the median empty batch, measured once before the pairs; on a
        loaded machine that median can exceed a fast candidate's later batches, which then
        read as no time at all. A check that blocks on a time too short uses this instead:
        it is never below the candidate's real time per call plus the plumbing's noise.
        """
        if not self.cand_batch_s:
            return 0.0
        return statistics.median(
            max(s - self.quietest_empty_s, 0.0) / self.per_batch for s in self.cand_batch_s
        )

    @property
    def timed_calls(self) -> int:
        """Calls timed per side."""
        return len(self.cand_times) * self.per_batch


class TimingPlan(NamedTuple):
    """How one grading times: calls per batch, timed and warm-up pairs, and the pool's entries."""

    per_batch: int
    pairs: int
    warmup: int
    slow: bool
    """One reference call over ``SLOW_CALL_S``: single-call batches, early stop."""
    pool_size: int
    """Entries in the pool at once: one round's batches (module docstring), ``per_batch`` each."""

    @property
    def round_batches(self) -> int:
        """Batches timed from one pool before it is made again."""
        return self.pool_size // self.per_batch


def plan_timing(reference_s: float, pooled_bytes: int, timing_pairs: int) -> TimingPlan:
    """The plan for a reference call of ``reference_s`` with ``pooled_bytes`` of inputs a call
    (module docstring): the pool holds inputs only, at most ``POOL_BYTES_LIMIT`` of them."""
    per_batch = max(1, min(16, int(TARGET_BATCH_S / max(reference_s, 1e-6))))
    pairs = timing_pairs
    warmup = WARMUP_PAIRS
    slow = reference_s > SLOW_CALL_S
    if slow:  # fewer, single-call batches within a time budget; early stop in the loop
        warmup = 1
        pairs = max(MIN_PAIRS, min(pairs, int(SLOW_TIMED_S / reference_s)))
    batches = pairs + warmup
    if batches * per_batch * pooled_bytes > POOL_BYTES_LIMIT:
        per_batch = max(1, POOL_BYTES_LIMIT // pooled_bytes // batches)
    # the batches one pool holds; the rest come from pools made again (rounds)
    round_batches = max(1, min(batches, POOL_BYTES_LIMIT // (per_batch * pooled_bytes)))
    return TimingPlan(per_batch, pairs, warmup, slow, round_batches * per_batch)


def largest_plan(pooled_bytes: int, timing_pairs: int) -> tuple[int, int]:
    """The most bytes of inputs `plan_timing` can put in the pool and in one batch, over every
    reference time: the fastest call has the most calls a batch, the slowest call just past
    ``SLOW_CALL_S`` the most timed pairs. `_sizing` reserves memory for these before any timing."""
    plans = [plan_timing(reference_s, pooled_bytes, timing_pairs)
             for reference_s in (0.0, SLOW_CALL_S * (1 + 1e-9))]  # fmt: skip
    return (
        max(plan.pool_size for plan in plans) * pooled_bytes,
        max(plan.per_batch for plan in plans) * pooled_bytes,
    )


class TimingRun:
    """One grading's timing step over its workers and its pool (module docstring)."""

    def __init__(self, calls: WorkerCalls, pool: TimingPool, meta: ProblemMeta, *, rng: random.Random,
                 device: str, timing_pairs: int, audit_fraction: float,
                 record: Callable[[Finding], None]) -> None:  # fmt: skip
        self.calls = calls
        self.pool = pool
        self.meta = meta
        self.rng = rng
        self.device = device
        self.timing_pairs = timing_pairs
        self.audit_fraction = audit_fraction
        self.record = record
        self._cpu_windows: list[CpuWindow] = []
        self._idle_windows: list[CpuWindow] = []
        """Candidate windows since the lists were last reset."""
        self._batch_cpu_before: CpuSample | None = None
        """The candidate's CPU sample that started its last timed batch."""
        self._staging_cpu: StagingCpu | None = None
        self._audit_failed = False
        self._disagreed = False
        self._quietest_empty_s = float("inf")
        self._batch_faults = [0, 0]
        """Page faults of each side's last batch (reference, candidate): the warm-up's test."""

    def run(self) -> Measurements:
        """Plans, shares the pool and times every pair."""
        probe = self.calls.reference_call(
            {"op": "gen", "seed": self.rng.randrange(1 << 31), "variant": "base", "shape": {}}
        )
        entry_bytes = sum(len(t.data) for t in probe.tensors) or 1
        pooled_bytes = sum(len(t.data) for t in probe.tensors[:-1]) or 1  # inputs: the pool's entry
        plan = plan_timing(self._time_single(probe), pooled_bytes, self.timing_pairs)
        order = self._new_round(plan, 0, plan.pairs + plan.warmup)
        measured = Measurements(
            per_batch=plan.per_batch, entry_bytes=entry_bytes, warmup_pairs=plan.warmup
        )
        with gc_paused():
            overhead_ref = self._empty_overhead(reference=True)
            measured.reference_empty_s = overhead_ref
            # The candidate controls how long its own empty batch takes: it may only lower
            # the overhead subtracted from its time, never raise it.
            self._cpu_windows = []
            overhead_cand = min(self._empty_overhead(reference=False), overhead_ref)
            measured.empty_windows, self._cpu_windows, self._idle_windows = (
                self._cpu_windows,
                [],
                [],
            )
            self._timing_loop(order, plan, overhead_ref, overhead_cand, measured)
        measured.quietest_empty_s = min(
            self._quietest_empty_s, min(measured.cand_batch_s, default=0.0)
        )
        measured.timed_windows = self._cpu_windows[measured.warmup_pairs :]
        measured.idle_windows = self._idle_windows[measured.warmup_pairs :]
        measured.staging = self._staging_cpu
        measured.audit_failed = self._audit_failed
        return measured

    def _timing_loop(self, order: list[int], plan: TimingPlan, overhead_ref: float,
                     overhead_cand: float, measured: Measurements) -> None:  # fmt: skip
        """The timed pairs, appending per-call seconds to ``measured``'s times; ``order`` is the
        first round's, and each later round's pool is made as the one before is used up.

        The warm-up goes on, up to ``MAX_EXTRA_WARMUP`` more pairs, while either side's last
        warm-up batch took over ``COLD_FAULTS_PER_CALL`` page faults a call: a heap still
        growing (`_worker.fix_allocator` keeps it once grown). The candidate can only lengthen
        its own warm-up so, never shorten the reference's.
        """
        ref_times, cand_times = measured.ref_times, measured.cand_times
        per_batch, warmup = plan.per_batch, plan.warmup
        index = local = 0
        while index < plan.pairs + warmup:
            if local * per_batch >= len(order):  # this round's pool is used up
                order, local = self._new_round(plan, index, plan.pairs + warmup), 0
            chunk = order[local * per_batch : (local + 1) * per_batch]
            # ABBA: who goes first alternates, so neither side gains from its place in the pair
            if index % 2 == 0:
                ref_s = self._staged_batch_reference(local, chunk)
                cand_s, commits = self._staged_batch_candidate(local, chunk)
            else:
                cand_s, commits = self._staged_batch_candidate(local, chunk)
                ref_s = self._staged_batch_reference(local, chunk)
            self._audit(chunk, commits)
            index, local = index + 1, local + 1
            if (
                index == warmup
                and warmup < plan.warmup + MAX_EXTRA_WARMUP
                and max(self._batch_faults) > COLD_FAULTS_PER_CALL * len(chunk)
            ):
                warmup += 1
                measured.warmup_pairs = warmup
                continue
            if index > warmup:
                ref_times.append(max(ref_s - overhead_ref, 1e-9) / len(chunk))
                cand_times.append(max(cand_s - overhead_cand, 1e-9) / len(chunk))
                measured.cand_batch_s.append(cand_s)
            if (
                plan.slow
                and len(ref_times) >= MIN_PAIRS
                and len(ref_times) % 2 == 0
                and interval_tight(ref_times, cand_times, self.rng)
            ):
                break

    def _time_single(self, probe: Frame) -> float:
        self.calls.reference_call(
            {"op": "pool", "entries": [probe.header["inputs"]]}, probe.tensors[:-1]
        )
        best = float("inf")
        for _ in range(3):
            best = min(best, self._timed_batch_reference([0]))
            if best > SLOW_CALL_S:  # a slow call: once is enough to plan with
                break
        return best

    def _new_round(self, plan: TimingPlan, first_batch: int, batches_in_all: int) -> list[int]:
        """A pool of fresh inputs for the batches from ``first_batch`` on, as many as one pool
        holds (the last round only those still to time), and the order its entries are used in."""
        batches = min(plan.round_batches, batches_in_all - first_batch)
        size = batches * plan.per_batch
        staged = self._share_pool(size, plan.per_batch)
        order = list(range(size))
        if not staged:  # staged batches are runs of the pool, which is in random order already
            self.rng.shuffle(order)
        return order

    def _share_pool(self, size: int, per_batch: int) -> bool:
        """``size`` timing inputs from fresh secret seeds: the reference writes them into the pool
        file and this process seals it. On a CPU the inputs are staged (True): each run of
        ``per_batch`` entries is copied, sealed, for one side at a time as it stages it
        (`_stage`), just before that batch is timed, so the candidate never
        holds inputs it could work on ahead of time. Elsewhere each worker reads a private
        copy of the whole pool."""
        staged = self.device == "cpu"
        seeds = [self.rng.randrange(1 << 31) for _ in range(size)]
        self.pool.create()
        made = self.calls.reference_call(
            {"op": "pool_make", "seeds": seeds, "receive_fd": True,
             "align_every": per_batch if staged else 0}
        )  # fmt: skip
        total = int(made.header["bytes"])
        self.pool.seal_pool(total)
        shared = {"op": "pool", "shared": True, "staged": staged,
                  "entries": made.header["entries"], "specs": made.header["specs"]}  # fmt: skip
        if staged:
            starts = [int(x) for x in made.header.get("starts", [])]
            self.pool.split(starts, total, per_batch, size)
            if self._staging_cpu is None:  # kept across rounds
                self._staging_cpu = StagingCpu()
        pooled = self.calls.reference_call(shared)
        if pooled.header.get("size") != size:
            raise StopGradingError(
                Outcome.GRADER_ERROR,
                f"reference pool has {pooled.header.get('size')} entries, not {size}",
            )
        if staged:
            self.calls.candidate_call(shared, phase="pool")
            return True
        self.pool.send_readonly_to_candidate()
        self.calls.candidate_call({**shared, "receive_fd": True}, phase="pool")
        return False

    def _stage(self, index: int, *, reference: bool) -> None:
        """Batch ``index``'s inputs mapped into one worker, from that worker's own copy."""
        header = self.pool.stage(index, REFERENCE if reference else CANDIDATE)
        if reference:
            self.calls.reference_call(header)
        else:
            self.calls.candidate_call(header, phase="timing")

    def _staged_batch_reference(self, index: int, chunk: list[int]) -> float:
        if self._staging_cpu is None:
            return self._timed_batch_reference(chunk)
        assert self.calls.reference is not None
        before = self.calls.reference.cpu_sample()
        self._stage(index, reference=True)
        after = self.calls.reference.cpu_sample()
        self._staging_cpu.reference_s.append(after.since(before)[0])
        return self._timed_batch_reference(chunk, staged=True)

    def _staged_batch_candidate(self, index: int, chunk: list[int]) -> tuple[float, list[str]]:
        if self._staging_cpu is None:
            return self._timed_batch_candidate(chunk)
        before = self._cpu()
        windows = len(self._cpu_windows)
        self._stage(index, reference=False)
        elapsed, commits = self._timed_batch_candidate(chunk, staged=True)
        if (
            before is not None
            and self._batch_cpu_before is not None
            and len(self._cpu_windows) > windows
        ):
            # from before staging to the timed batch's start: the gap between them included
            self._staging_cpu.candidate_s.append(self._batch_cpu_before.since(before)[0])
            self._staging_cpu.candidate_batch_s.append(self._cpu_windows[-1].cpu_s)
        return elapsed, commits

    def _empty_overhead(self, *, reference: bool) -> float:
        samples = [
            self._timed_batch_reference([]) if reference else self._timed_batch_candidate([])[0]
            for _ in range(7)
        ]
        self._quietest_empty_s = min(self._quietest_empty_s, *samples)
        return statistics.median(samples)

    def _cpu(self) -> CpuSample | None:
        candidate = self.calls.candidate
        return candidate.cpu_sample() if candidate is not None else None

    def _timed_batch_reference(self, indices: list[int], *, staged: bool = False) -> float:
        assert self.calls.reference is not None
        faults = self.calls.reference.minor_faults()
        cpu_before = self._cpu()
        start = time.perf_counter()
        self.calls.reference_call({"op": "batch", "indices": indices, "staged": staged})
        elapsed = time.perf_counter() - start
        cpu_after = self._cpu()
        self._batch_faults[REFERENCE] = self.calls.reference.minor_faults() - faults
        if cpu_before is not None and cpu_after is not None:
            # the candidate is waiting for its next call: what does it compute meanwhile?
            self._idle_windows.append(CpuWindow(elapsed, *cpu_after.since(cpu_before)))
        return elapsed

    def _timed_batch_candidate(
        self, indices: list[int], *, staged: bool = False
    ) -> tuple[float, list[str]]:
        assert self.calls.candidate is not None
        faults = self.calls.candidate.minor_faults()
        cpu_before = self._batch_cpu_before = self._cpu()
        start = time.perf_counter()
        frame = self.calls.candidate_call(
            {"op": "batch", "indices": indices, "staged": staged}, phase="timing"
        )
        elapsed = time.perf_counter() - start
        cpu_after = self._cpu()
        self._batch_faults[CANDIDATE] = self.calls.candidate.minor_faults() - faults
        if cpu_before is not None and cpu_after is not None:
            self._cpu_windows.append(CpuWindow(elapsed, *cpu_after.since(cpu_before)))
        commits = frame.header.get("commits")
        device_ms = frame.header.get("device_ms")
        if self.device == "cuda" and isinstance(device_ms, int | float) and indices:
            disagreement = judge_timing_disagreement(device_ms, elapsed * 1e3, len(indices))
            if disagreement is not None and not self._disagreed:
                self._disagreed = True
                self.record(disagreement)
        if not isinstance(commits, list) or len(commits) != len(indices):
            raise StopGradingError(
                Outcome.CRASHED, "candidate broke the timing protocol (wrong number of results)"
            )
        return elapsed, [str(c) for c in commits]

    def _audit(self, chunk: list[int], commits: list[str]) -> None:
        """A secret subset of the batch's outputs against their commitments and the reference's
        outputs for the same inputs (from its timed batch just before)."""
        positions = [p for p in range(len(chunk)) if self.rng.random() < self.audit_fraction]
        if not positions:
            return
        frame = self.calls.candidate_call({"op": "fetch", "positions": positions}, phase="audit")
        if len(frame.tensors) != len(positions):
            raise StopGradingError(Outcome.CRASHED, "candidate broke the audit protocol")
        expected = self.calls.reference_call({"op": "fetch", "positions": positions}).tensors
        for position, got, want in zip(positions, frame.tensors, expected, strict=True):
            call = chunk[position]
            if digest(got) != commits[position]:
                self._fail_audit(
                    "an audited output differs from what the candidate committed when its timed call returned",
                    f"timed call {call}",
                )
                return
            result = compare(got, want, self.meta)
            if not result.ok:
                self._fail_audit(
                    "a timed call's output was wrong although the correctness checks passed (correct only while checked)",
                    f"timed call {call}: {result.message}",
                )
                return

    def _fail_audit(self, message: str, evidence: str) -> None:
        self.record(Finding(check="audit", severity="block", message=message, evidence=evidence))
        self._audit_failed = True

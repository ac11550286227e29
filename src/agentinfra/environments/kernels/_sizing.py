"""How much memory a grading needs: the candidate's limit and the grading's reservation.

Pure functions of measurements (no I/O): the problem's sizes on torch's meta device
(`ProblemSizes`), and the reference worker's own figures from ``/proc``: its
``VmPeak`` (address space, what ``RLIMIT_AS`` limits) before it loads the problem
and after its self-check, and its ``VmHWM`` (resident high-water mark). Two figures
come out (`MemoryPlan`), in two units on purpose:

- the candidate's limit, in **address space** (``RLIMIT_AS``): the reference's peak
  (never less than the runtime plus twice the parameters, one input set and the
  output), plus a margin of a quarter of the problem's data (at least 256 MiB), plus
  one timed batch's inputs and outputs (the timing step holds up to 16 calls' outputs
  and a staged batch, beyond the one call the self-check measured), plus the address
  space of 8 more threads than the reference runs (each costs about 80 MiB of address
  space it never touches: glibc's 64 MiB arena reservation and its stack; a candidate
  that starts a thread pool is judged by the cores check, not killed by its limit);
- the grading's reservation in the machine's ledger, in **resident** bytes: the
  reference's high-water mark plus a batch, the candidate's limit less the part of
  the runtime's address space that is mapped but not resident (the reference's
  ``VmPeak - VmHWM``: the same interpreter and libraries) and the threads' allowance, and the
  supervisor's (`supervisor_bytes`: one call's frames, a comparison's chunks, and in the
  timing the pool file and the sealed copy of a batch made for each side as it stages it).

Before the reference has run (`admission_bytes`) only the sizes are known: the
reservation then counts each worker as the runtime plus three times the parameters
and twice the inputs and output (a lower bound; intermediates are unknown), and is
grown to the plan once the reference is measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentinfra._settings import format_size
from agentinfra.environments.kernels._compare import COMPARE_BYTES
from agentinfra.environments.kernels._timing import POOL_BYTES_LIMIT, largest_plan

__all__ = [
    "MARGIN_FLOOR_BYTES",
    "MARGIN_SHARE",
    "THREAD_ADDRESS_BYTES",
    "MemoryPlan",
    "ProblemSizes",
    "admission_bytes",
    "memory_plan",
]

MARGIN_SHARE = 0.25
"""Of the problem's data (the reference's peak above its runtime), the candidate may use beyond it."""
MARGIN_FLOOR_BYTES = 256 << 20
"""The least margin: allocator history, thread stacks and arenas (measured drift: 70 MiB over 5 calls)."""
RUNTIME_BYTES = 1 << 30
"""Address space of a worker before any problem data, where it was not measured (measured: 0.64 GiB)."""
RUNTIME_RESIDENT_BYTES = 256 << 20
"""Resident memory of a worker before any problem data (measured: 0.25 GiB)."""
MAX_BATCH_CALLS = 16
"""The most calls one timed batch makes (`_timing`'s plan)."""
EXTRA_THREADS = 8
THREAD_ADDRESS_BYTES = 80 << 20
"""Address space one more torch thread costs (measured: 8 threads 1989 MiB, 1 thread 1429 MiB)."""


@dataclass(frozen=True, slots=True)
class ProblemSizes:
    """Bytes of the parameters, one input set and one output, from the meta device (None: unknown)."""

    params_bytes: int | None
    inputs_bytes: int | None
    output_bytes: int | None

    @classmethod
    def from_header(cls, header: Mapping[str, Any]) -> ProblemSizes:
        values = [header.get(k) for k in ("params_bytes", "inputs_bytes", "output_bytes")]
        params, inputs, output = (v if isinstance(v, int) and v >= 0 else None for v in values)
        return cls(params, inputs, output)

    @property
    def entry_bytes(self) -> int:
        """One call's inputs and output (0 where unknown)."""
        return (self.inputs_bytes or 0) + (self.output_bytes or 0)

    def worker_bytes(self, runtime_bytes: int) -> int:
        """The least a worker holding the model and one call needs: the runtime, the parameters
        twice (its own and the copy it loads or sends), one input set and the output."""
        return runtime_bytes + 2 * (self.params_bytes or 0) + self.entry_bytes

    def describe(self) -> str:
        return (f"parameters {_size(self.params_bytes)}, one input set {_size(self.inputs_bytes)}, "
                f"output {_size(self.output_bytes)}")  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPlan:
    """The candidate's address-space limit and the grading's resident reservation (module docstring)."""

    limit_bytes: int
    """The candidate's ``RLIMIT_AS``."""
    reference_peak_bytes: int
    """The reference's address space the limit starts from (its ``VmPeak``, or the sizes' floor)."""
    margin_bytes: int
    batch_bytes: int
    threads_bytes: int
    """Address space for `EXTRA_THREADS` more threads than the reference's (not resident)."""
    reference_resident_bytes: int
    candidate_resident_bytes: int
    supervisor_bytes: int

    @property
    def reserve_bytes(self) -> int:
        """Resident bytes the grading reserves in the machine's ledger."""
        return self.reference_resident_bytes + self.candidate_resident_bytes + self.supervisor_bytes

    def describe(self) -> str:
        return (
            f"the candidate's limit {_size(self.limit_bytes)} of address space is the reference's peak "
            f"{_size(self.reference_peak_bytes)} plus a {_size(self.margin_bytes)} margin, a timed batch's "
            f"{_size(self.batch_bytes)} and {_size(self.threads_bytes)} for {EXTRA_THREADS} more threads; the grading holds about {_size(self.reserve_bytes)} resident "
            f"(reference {_size(self.reference_resident_bytes)}, candidate "
            f"{_size(self.candidate_resident_bytes)}, supervisor {_size(self.supervisor_bytes)})"
        )


def batch_bytes(sizes: ProblemSizes) -> int:
    """What one timed batch holds beyond a single call: up to 16 calls' inputs and outputs,
    at most what the timing pool allows per batch (at least one call's)."""
    entry = sizes.entry_bytes
    return min(MAX_BATCH_CALLS * entry, max(entry, POOL_BYTES_LIMIT // 4))


def supervisor_bytes(sizes: ProblemSizes, *, timing_pairs: int, measure_speed: bool) -> int:
    """The most the supervisor holds at once, phase by phase (frames are read in place and
    forwarded uncopied, `_wire`; a comparison needs `COMPARE_BYTES`, `_compare`):

    - the reference's self-check: the parameters it sent (kept for the candidate's load), its
      inputs and both outputs;
    - correctness: one case at a time, its inputs, the expected output and the reply;
    - timing: the planning call's inputs and output, the pool file, a batch's sealed copy for
      each side (`_timing_pool`: made as that side stages it; the copy a worker still maps from
      its previous batch is in that worker's own batch allowance), and an audit's outputs from
      both sides, at most a batch's outputs and at most what a worker's allowance lets its batch
      hold (`batch_bytes`).
    """
    inputs, output = sizes.inputs_bytes or 0, sizes.output_bytes or 0
    checks = (sizes.params_bytes or 0) + output
    timing = 0
    if measure_speed and inputs:
        pool, batch = largest_plan(inputs, timing_pairs)
        audited = min((batch // inputs) * output, batch_bytes(sizes))
        timing = pool + 2 * batch + 2 * audited
    return sizes.entry_bytes + COMPARE_BYTES + max(checks, timing)


def admission_bytes(sizes: ProblemSizes, *, timing_pairs: int, measure_speed: bool) -> int:
    """The reservation before the reference has run: each worker's least (`ProblemSizes.worker_bytes`,
    with the parameters three times for the reference's copies as it sends them) and the supervisor's."""
    worker = sizes.worker_bytes(RUNTIME_RESIDENT_BYTES)
    reference = worker + (sizes.params_bytes or 0)
    return (
        reference
        + worker
        + supervisor_bytes(sizes, timing_pairs=timing_pairs, measure_speed=measure_speed)
    )


def memory_plan(
    sizes: ProblemSizes,
    *,
    baseline_bytes: int | None,
    peak_bytes: int | None,
    resident_bytes: int | None,
    timing_pairs: int,
    measure_speed: bool,
) -> MemoryPlan:
    """The plan from the reference's ``VmPeak`` before loading (``baseline_bytes``) and after its
    self-check (``peak_bytes``), and its ``VmHWM`` (``resident_bytes``); None where unmeasured
    (CUDA: a CUDA process's address space says nothing of its data), then from the sizes alone."""
    runtime = baseline_bytes if baseline_bytes is not None else RUNTIME_BYTES
    floor = sizes.worker_bytes(runtime)
    peak = max(peak_bytes or 0, floor)
    margin = max(MARGIN_FLOOR_BYTES, int(MARGIN_SHARE * (peak - runtime)))
    batch = batch_bytes(sizes)
    threads = EXTRA_THREADS * THREAD_ADDRESS_BYTES
    limit = peak + margin + batch + threads
    resident = resident_bytes if resident_bytes is not None else peak
    unmapped = max(0, peak - resident)
    return MemoryPlan(
        limit_bytes=limit, reference_peak_bytes=peak, margin_bytes=margin, batch_bytes=batch,
        threads_bytes=threads, reference_resident_bytes=resident + batch,
        candidate_resident_bytes=max(resident, limit - threads - unmapped),
        supervisor_bytes=supervisor_bytes(sizes, timing_pairs=timing_pairs, measure_speed=measure_speed),
    )  # fmt: skip


def _size(count: int | None) -> str:
    return "unknown" if count is None else format_size(count)

"""The trusted supervisor: grades one submission against one problem, in isolation.

Threat model. The submission is an attacker that knows this code.

Covered:
- It never runs in the supervisor: it runs in a fresh candidate process (per
  submission) inside the sandbox of `_workers` (namespaces, an unprivileged uid
  drawn from the OS's randomness and reserved by flock for the grading's life,
  so no two live gradings share one and the uid-wide cleanup reaches only this
  candidate; limits); the reference runs in its own worker process, in the same
  kind of jail with its own reserved uid and no resource limits.
- What it can read is an allowlist (`agentinfra.sandbox`): a fresh root holding
  the interpreter, the standard library, torch, numpy and xxhash with the
  distributions they declare, the system library directories and the loader's
  cache, the two worker modules, a generated ``/etc/passwd`` and ``/etc/group``,
  a minimal ``/dev``, its own ``/proc``, and a private ``/tmp`` holding only its
  submission. The checkout, every run directory (other runs' submissions and
  evaluations included), home directories, the rest of ``/etc``, ``/srv``,
  ``/opt``, ``/mnt`` and the problem file do not exist in its view, so it can
  neither copy another rollout's kernel nor send host files out through its
  error text. The verdict's ``error`` quotes its stderr (capped; documented as
  candidate-controlled). The problem file is copied to a private directory and
  only into the reference's jail; the candidate never receives the problem's code.
- Correctness: several secret seeds chosen here, the problem's input
  distribution plus variants (scaled, shifted, sign-flipped, other shapes the
  problem allows), a variant counting only where the reference's own output is
  finite; inputs are private copies per side; the output must be a plain tensor
  of exact shape and dtype, finite where the reference is, within the problem's
  tolerance (scale-aware; NaN never passes); mutating an input blocks. The
  comparison runs here, on bytes copied out of the candidate when each call returns.
- Timing: batches of calls timed with this process's monotonic clock, minus the
  measured round-trip of an empty batch; every timed call gets fresh inputs from
  a pool that is never reused. The pool travels as a file, not through pipes:
  a memfd made here per grading, sent to the reference over a Unix socket, filled
  by it from secret seeds, then sealed here (no write, resize or further seal, by
  anyone). On a CPU the inputs are staged: each batch's bytes are copied here into
  a sealed file of their own, and a worker receives and maps a batch's inputs
  (private, populated) only in a ``stage`` request just before that batch is
  timed, so the candidate never holds inputs of a batch to come. Staging is not
  timed; a candidate that computes its outputs then spends the CPU there, and the
  ``staging`` check compares its staging CPU with the reference's for the same
  bytes (the corpus' ``precompute_untimed`` faked 22x when the whole pool arrived
  in one untimed request). On CUDA each worker reads a private copy of the whole
  pool. (A memfd can be reopened writable through ``/proc/self/fd``, so the seal,
  not the read-only descriptor, is what holds; the corpus' ``pool_tamper`` tries
  both.) Every timed output is committed (hash) before
  the batch returns and a secret random subset is audited against the
  reference's output for the same inputs, fetched from its timed batch,
  so call counting, replay, stale buffers and caller sniffing fail. The
  reference is timed in its own clean process with the same method, interleaved
  A B B A (who goes first alternates pair by pair, so each order times half the
  pairs), and the speedup is the median of the pairs' ratios with a bootstrap
  confidence interval. Patching timers inside the candidate changes nothing.
  Measurement hygiene, the same for both sides: this process's garbage collector
  is off while it times; each worker puts glibc's allocator in one fixed state
  before it runs anything (`_worker.fix_allocator`: no moving mmap threshold, no
  heap trim). The candidate may change its own allocator; that moves only its own
  time, which is what it is judged on.
- Runtime checks that block on a measurement, and their margins:
  - ``threads_processes``: the CPU time of the candidate's whole process tree,
    read from /proc just around each timed batch (nanosecond ``schedstat`` per
    thread; clock ticks from ``stat``, which keep exited threads and reaped
    children, for a batch during which threads came or went), minus the CPU of
    an empty batch measured the same way, over the batch's wall time minus the
    empty batch's. Blocks only when the cores used over all timed batches
    exceed ``threads * 1.5 + 0.25`` *and* at least half of the timed batches
    (and at least 3) exceed it on their own. A warning when the excess does not
    repeat; nothing is judged (a warning at most) when the timed work is under
    0.1 s of wall time or tick resolution could explain the excess.
  - ``staging``: the candidate's CPU from the start of a batch's ``stage``
    request to the start of that timed batch, minus the reference's CPU staging
    the same bytes from its own copy. Blocks when the sum over all batches
    exceeds a tenth of the reference's staging plus a tenth of the candidate's
    timed CPU plus 0.1 ms a batch, and at least half of the batches (and at
    least 3) exceed that on their own; a warning otherwise. Honest candidates
    measured 0.99-1.04x the reference's staging CPU.
  - ``threads_processes`` (idle): the candidate's CPU while the reference's
    timed batches run and the candidate has no call, over their wall time.
    Blocks above 0.25 cores plus the allotted threads beyond the first, when
    measurable and repeated as above: an honest candidate waits on its pipe.
  - ``plausibility``: a median time per call below half the physical floor
    (the problem's FLOPs and bytes at the peak FLOP/s and memory bandwidth the
    reference worker measured on this machine) blocks: a factor-2 margin.
  - ``timing_disagreement`` (CUDA events against the host clock) only warns.
- Nothing in the verdict comes from the candidate's stdout or its account of itself.
- Cached across gradings in one process, on the trusted side only: the machine's
  peaks (per device and thread count), and per problem hash the reference's
  self-check result and one call's time. All come from the reference worker (the
  problem's own code, never a submission) and live as long as the process; a
  candidate cannot write to them, and a changed problem file has another hash.
- Reused across gradings: one fork server per thread count (`worker_fork_server`,
  CPU, where namespaces exist; ``fork_server=False`` or
  ``AGENTINFRA_GRADER_FORK_SERVER=0`` turns it off), a process that imported
  torch, numpy, xxhash and the worker modules and ran one computation on torch's
  meta device, for as long as this process lives. Every worker, reference and
  candidate alike, is a fresh fork of it into a fresh jail (namespaces, root,
  uid, limits: the same as a new interpreter gets). The zygote runs no problem or
  submission code and never reads a request (the forked child reads its own), so
  there is nothing in it for a candidate to poison or find; a candidate's writes
  land in its own copy-on-write memory and die with it.

Problems, not candidates, are blamed for what is the problem's (KernelBench's own
problems load unchanged, and some are random or too large for the machine):
- A reference that disagrees with itself: the first correctness inputs are run
  through the reference twice. If the two outputs differ beyond the tolerance
  (``nn.Dropout`` in training mode, the default), both models are switched to
  eval mode and the check repeated; when it then agrees, grading goes on in eval
  mode with a ``nondeterministic_reference`` warning naming the random modules.
  When it still disagrees (random ops inside ``forward``) the outcome is
  ``grader_error`` with a ``problem`` finding: output comparison cannot grade it.
  The candidate is never ``failed`` for the reference's randomness.
- A problem too large: before the model is built, the reference worker sizes
  parameters, one input set and the output on torch's meta device (nothing is
  allocated). Over the candidate's memory limit, over the wire's 4 GiB reply
  frame (outputs are compared whole, here), or over three times the machine's
  available memory (reference, candidate and these copies): ``grader_error`` in
  seconds with a ``problem`` finding naming the sizes, the limit and the knob.
- A reference that needs more address space in one call than the candidate's
  memory limit (its ``VmPeak`` after the self-check, CPU): ``grader_error`` with a
  ``problem`` finding; a candidate doing the same work could not fit either.
- A slow problem's candidate gets the wall-clock budget its calls need: at least
  ``timeout_s``, extended to three times the reference's time for the calls the
  grading makes (plus 30 s). The reference's time decides, never the candidate's.
- A slow problem: when one reference call takes over 0.1 s the timing plan
  shrinks to fit about ``_SLOW_TIMED_S`` of timed reference work (at least 6
  pairs, or 3 where the 768 MiB input pool holds no more; one warm-up), and
  from the sixth pair on, after an even number of pairs, it stops once the speedup's
  95% interval is within ±5% of its median. The verdict's ``timed_calls`` says
  how many calls were timed per side.

Not covered:
- What the allowlist itself holds is readable: the interpreter and those
  packages (public code), the system libraries, and machine-wide facts in its
  ``/proc`` (``/proc/cpuinfo``, ``/proc/meminfo``, the kernel's version); its own
  command line names the worker module.
- Side channels and timing noise from other load on the machine; a candidate
  that is correct on every input we draw but wrong elsewhere (sampling); kernel
  exploits against the host; in ``rlimits-only`` mode (no namespaces) signalling
  or reading the supervisor (the verdict then carries a ``sandbox`` warning).
- GPU-specific attacks beyond device sync per batch (streams are flagged statically).
  On CUDA the whole timing pool reaches the candidate before timing (not staged),
  so work done then, untimed, is bounded only by the plausibility floor.
- Precomputation within the ``staging`` allowance: a tenth of the timed work
  plus a tenth of the staging plus 0.1 ms a batch could move untimed (on the
  fastest shipped candidate's 2 ms batches, about a quarter of its work).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import hashlib
import os
import random
import secrets
import shutil
import signal
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from agentinfra._settings import format_size
from agentinfra.environments.kernels._problem import ProblemMeta, load_problem_meta
from agentinfra.environments.kernels._settings import KernelSettings
from agentinfra.environments.kernels._static import static_findings
from agentinfra.environments.kernels._verdict import (
    ERROR_LIMIT,
    Finding,
    Outcome,
    Provenance,
    Utilisation,
    Verdict,
)
from agentinfra.environments.kernels._wire import Frame, TensorBytes, digest
from agentinfra.environments.kernels._workers import (
    MAX_REPLY_BYTES,
    CpuSample,
    ForkServerError,
    SandboxLimits,
    WorkerDiedError,
    WorkerProcess,
    WorkerTimeoutError,
    worker_fork_server,
)
from agentinfra.errors import ConfigError, TaskEnvironmentError, UidExhaustedError
from agentinfra.sandbox import ForkServer, probe_sandbox_mode, reserve_uid

__all__ = ["GRADER_VERSION", "GradeOptions", "grade", "grade_async"]

GRADER_VERSION = "1.0.0"
_POOL_BYTES_LIMIT = 768 << 20
_TARGET_BATCH_S = 0.05
_MAX_FINDINGS_PER_CHECK = 3
_MIN_CORE_WALL_S = 0.1
"""Below this much timed candidate work the core count is not judged (a warning at most)."""
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_SLOW_CALL_S = 0.1
"""A reference call slower than this makes the timing plan adapt (module docstring)."""
_SLOW_TIMED_S = 15.0
"""Timed reference work a slow problem's plan aims at, in seconds."""
_MIN_PAIRS = 6
_STAGE_SHARE = 0.1
_STAGE_SLACK_S = 0.0001
"""Staging CPU a candidate may spend beyond the reference's, per batch: ``_STAGE_SHARE`` of the
reference's staging and of its own timed work, plus this (honest candidates: 0.99-1.04x the
reference's staging, within 0.06 ms a batch)."""
_CI_STOP = 0.05
"""A slow problem's timing stops once the speedup's 95% interval is within this fraction of its median."""
_RUNTIME_BYTES = 1 << 30
"""Address space a worker holds for Python and torch before any problem data (measured: ~0.6 GiB)."""
_PEAKS: dict[tuple[str, int], dict[str, float]] = {}
_SELF_CHECK: dict[tuple[str, str], str | None] = {}
"""(problem sha256, device) -> None for a reference that agrees with itself, else the random modules'
names (graded in eval mode): the self-check runs once per problem per process (the reference is trusted)."""
_CALL_S: dict[tuple[str, str, int], float] = {}
"""(problem sha256, device, threads) -> one reference call's seconds, from its self-check."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GradeOptions:
    """How to grade; the defaults are the full protocol."""

    device: Literal["cpu", "cuda"] = "cpu"
    threads: int = 1
    """Torch threads on both sides (CPU)."""
    timeout_s: float = 120.0
    """Wall-clock budget of the candidate process."""
    memory_limit_bytes: int = 4 << 30
    max_processes: int = 64
    correctness_seeds: int = 2
    timing_pairs: int = 20
    audit_fraction: float = 0.3
    seed: int | None = None
    """Master secret seed; fresh from the OS when None. Fixed only for agent-visible checks."""
    measure_speed: bool = True
    fork_server: bool = True
    """Fork CPU workers from a process-wide zygote that has torch imported (`worker_fork_server`),
    instead of starting two interpreters per grading; the jail is the same either way."""

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device={self.device!r} must be 'cpu' or 'cuda' (--device)")
        if (
            self.threads < 1
            or self.timeout_s <= 0
            or self.timing_pairs < 3
            or self.correctness_seeds < 1
        ):
            raise ConfigError(
                "threads >= 1, timeout_s > 0, timing_pairs >= 3 and correctness_seeds >= 1 are required"
            )
        if not 0 < self.audit_fraction <= 1:
            raise ConfigError(f"audit_fraction={self.audit_fraction} must be in (0, 1]")

    @classmethod
    def from_settings(cls, settings: KernelSettings, **overrides: Any) -> GradeOptions:
        """The one conversion from a run's `KernelSettings` (and so from ``AGENTINFRA_GRADER_*``)."""
        given = {k: v for k, v in overrides.items() if v is not None or k == "seed"}
        values: dict[str, Any] = {
            "device": settings.device,
            "fork_server": settings.fork_server,
            **given,
        }
        return cls(
            threads=settings.threads, timeout_s=settings.timeout_s, timing_pairs=settings.timing_pairs,
            correctness_seeds=settings.correctness_seeds, memory_limit_bytes=settings.memory_limit_bytes,
            max_processes=settings.max_processes, **values,
        )  # fmt: skip


class _StopGradingError(Exception):
    """Ends grading early with an outcome."""

    def __init__(self, outcome: Outcome, error: str) -> None:
        super().__init__(error)
        self.outcome = outcome
        self.error = error


def _to_array(item: TensorBytes) -> np.ndarray[Any, Any]:
    import torch

    flat = (
        torch.frombuffer(bytearray(item.data), dtype=torch.uint8)
        if item.data
        else torch.empty(0, dtype=torch.uint8)
    )
    if item.dtype == "bool":
        return flat.numpy().astype(bool).reshape(item.shape)
    tensor = flat.view(getattr(torch, item.dtype)).reshape(item.shape)
    if tensor.is_floating_point():
        tensor = tensor.double()
    return tensor.numpy()


@dataclass(slots=True)
class _Staging:
    """Staged timing inputs (CPU): each batch's byte range in the pool file, each side's sealed
    copy of it, and the CPU each side spent staging each batch."""

    per_batch: int
    size: int
    ranges: list[tuple[int, int]] = field(default_factory=list)
    files: list[tuple[int, int]] = field(default_factory=list)
    """Per batch: the reference's and the candidate's sealed copy of its bytes."""
    reference_cpu: list[float] = field(default_factory=list)
    candidate_cpu: list[float] = field(default_factory=list)
    candidate_batch_cpu: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Comparison:
    ok: bool
    message: str


def _compare(got: TensorBytes, want: TensorBytes, meta: ProblemMeta) -> _Comparison:
    if got.dtype != want.dtype or got.shape != want.shape:
        return _Comparison(
            False, f"output {got.dtype}{list(got.shape)} != expected {want.dtype}{list(want.shape)}"
        )
    a, b = _to_array(got), _to_array(want)
    if a.dtype == bool or not np.issubdtype(b.dtype, np.floating):
        equal = bool(np.array_equal(a, b))
        return _Comparison(equal, "" if equal else "integer/bool output differs")
    finite = np.isfinite(b)
    if np.isnan(a).any() and not np.isnan(b).any():
        return _Comparison(
            False, f"output has {int(np.isnan(a).sum())} NaN values where the reference has none"
        )
    if not np.array_equal(np.isfinite(a), finite) or not np.array_equal(a[~finite], b[~finite]):
        return _Comparison(False, "non-finite values differ from the reference")
    scale = float(np.abs(b[finite]).max()) if finite.any() else 0.0
    error = np.abs(a[finite] - b[finite])
    limit = meta.atol * max(scale, 1e-6) + meta.rtol * np.abs(b[finite])
    bad = int((error > limit).sum())
    if bad:
        worst = float(error.max())
        return _Comparison(
            False,
            f"{bad} of {error.size} elements out of tolerance (max abs error {worst:.3g}, output scale {scale:.3g})",
        )
    return _Comparison(True, "")


class _Grading:
    """One grading, as named steps: prepare, start workers, correctness, timing, verdict."""

    def __init__(self, problem: Path, submission: Path, options: GradeOptions) -> None:
        self.options = options
        self.meta = load_problem_meta(problem)
        try:
            self.source = submission.read_bytes()
        except OSError as exc:
            raise TaskEnvironmentError(
                f"cannot read submission {submission}: {exc.strerror}"
            ) from None
        self.rng = random.Random(options.seed if options.seed is not None else secrets.randbits(64))
        self.findings: list[Finding] = []
        self.correct = False
        self.private = Path(tempfile.mkdtemp(prefix="agentinfra-grade-"))
        os.chmod(self.private, 0o700)
        self.reference: WorkerProcess | None = None
        self.candidate: WorkerProcess | None = None
        self.deadline = 0.0
        self.timing: dict[str, Any] = {}
        self._cpu_windows: list[tuple[float, float, bool]] = []
        self._idle_windows: list[tuple[float, float, bool]] = []
        """(wall s, cpu s, precise) of each candidate batch since the list was last reset."""
        self.utilisation: Utilisation | None = None
        self.timed_calls: int | None = None
        self.reference_call_s: float | None = None
        self.eval_mode = False
        self._pool_fds: list[int] = []
        """The pool file (and on a CPU each batch's two copies), closed by `close`."""
        self._staging: _Staging | None = None
        self._batch_cpu_before: CpuSample | None = None
        """The candidate's CPU sample that started its last timed batch."""
        self._fd_sockets: list[socket.socket] = []
        """Our ends of the Unix sockets that carry the pool file to the reference and the candidate."""
        self._uid_locks: list[int] = []
        """The reservations of the workers' uids, released after the workers are killed."""
        self.threads = options.threads
        self.cpus: tuple[int, ...] = ()
        """The cores this grading's workers are pinned to, claimed by `run` (`_claim_cpus`)."""

    def _add(self, finding: Finding) -> None:
        """Records a finding; a runtime check that fires on every call is kept three times."""
        if sum(1 for f in self.findings if f.check == finding.check) < _MAX_FINDINGS_PER_CHECK:
            self.findings.append(finding)

    # -- steps -------------------------------------------------------------------

    def prepare(self) -> None:
        try:
            self.findings += static_findings(self.source.decode(errors="replace"))
        except SyntaxError as exc:
            raise _StopGradingError(
                Outcome.INVALID, f"SyntaxError: line {exc.lineno}: {exc.msg}"
            ) from None
        shutil.copyfile(self.meta.path, self.private / "problem.py")
        (self.private / "submission.py").write_bytes(self.source)
        for sub in ("reference", "candidate"):
            (self.private / sub).mkdir()

    def _limits(self) -> SandboxLimits:
        return SandboxLimits(
            memory_limit_bytes=self.options.memory_limit_bytes,
            max_processes=self.options.max_processes,
            cpu_limit_s=int(self.options.timeout_s * max(self.threads, 1)) + 30,
            threads=self.threads,
            cpus=self.cpus,
        )

    def spawn_workers(self) -> None:
        """Starts both worker processes at once: their interpreter and torch start-ups overlap.

        A submission that signals processes is refused first where no namespaces
        could contain it (``rlimits-only``): it is never started.
        """
        if probe_sandbox_mode() == "rlimits-only" and any(
            f.severity == "block" and f.check in ("signals", "early_exit") for f in self.findings
        ):
            raise _StopGradingError(
                Outcome.HACK_FLAGGED,
                "not run: it signals processes and this machine has no namespaces to contain it",
            )
        server = self._fork_server()
        sockets = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(2)]
        self._fd_sockets = [ours for ours, _ in sockets]
        try:
            self.reference = WorkerProcess.start(
                workdir=self.private / "reference", role="reference", limits=self._limits(),
                program=self.private / "problem.py", uid=self._worker_uid(), device=self.options.device,
                fork_server=server, fd_socket=sockets[0][1].fileno(),
            )  # fmt: skip
            self.candidate = WorkerProcess.start(
                workdir=self.private / "candidate", role="candidate", limits=self._limits(),
                program=self.private / "submission.py", uid=self._worker_uid(), device=self.options.device,
                fork_server=server, fd_socket=sockets[1][1].fileno(),
            )  # fmt: skip
        except ForkServerError as exc:
            raise TaskEnvironmentError(
                f"the grader's fork server failed: {exc}; grade with GradeOptions(fork_server=False) "
                "(AGENTINFRA_GRADER_FORK_SERVER=0) to start workers without it"
            ) from None
        finally:
            for _, theirs in sockets:
                theirs.close()
        self.deadline = time.monotonic() + self.options.timeout_s

    def _seal_pool_file(self, fd: int, size: int) -> None:
        """No write, resize or further seal from here on, by anyone holding it; the size is the
        reference's account. Only then does the candidate receive it: a memfd can be reopened
        writable through ``/proc/self/fd``, so a read-only descriptor alone would not hold."""
        seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        if os.fstat(fd).st_size != size:
            raise _StopGradingError(
                Outcome.GRADER_ERROR, f"pool file holds {os.fstat(fd).st_size} bytes, not {size}"
            )

    def _fork_server(self) -> ForkServer | None:
        """The zygote to fork workers from: CPU gradings in a namespace jail, unless turned off."""
        if not self.options.fork_server or self.options.device != "cpu":
            return None
        if probe_sandbox_mode() not in ("namespaces+uid", "userns"):
            return None
        return worker_fork_server(self.threads)

    def start_reference(self) -> dict[str, Any]:
        assert self.reference is not None
        problem = self.private / "problem.py"
        hello = self._reference_call({"op": "hello"}, receive_only=True)
        if hello.header.get("allocator") != "glibc-fixed":
            self._add(
                Finding(
                    check="timing_environment",
                    severity="warn",
                    message="the workers' allocator could not be put in its fixed state (no glibc mallopt): "
                    "speedups of kernels that allocate megabytes per call vary more between gradings",
                    evidence=f"allocator {hello.header.get('allocator')!r}",
                )
            )
        sizes = self._reference_call(
            {"op": "estimate", "path": self.reference.program_path(problem)}
        )
        self._check_size(sizes.header)
        self.init_seed = self.rng.randrange(1 << 31)
        frame = self._reference_call(
            {"op": "load", "role": "reference", "path": self.reference.program_path(problem), "threads": self.threads,
             "seed": self.init_seed, "device": self.options.device}
        )  # fmt: skip
        return {"header": frame.header, "tensors": frame.tensors}

    def _blame_problem(self, message: str, evidence: str = "") -> _StopGradingError:
        """Stops grading with ``grader_error`` and a ``problem`` finding: the problem, not the candidate."""
        self._add(Finding(check="problem", severity="warn", message=message, evidence=evidence))
        return _StopGradingError(Outcome.GRADER_ERROR, message)

    def _check_size(self, sizes: dict[str, Any]) -> None:
        """Refuses in seconds a problem that cannot fit (module docstring); unknown sizes pass."""
        params, inputs, output = (
            sizes.get(k) if isinstance(sizes.get(k), int) else None
            for k in ("params_bytes", "inputs_bytes", "output_bytes")
        )
        need = sum(v for v in (params, inputs, output) if v is not None)
        if not need:
            return
        parts = f"parameters {_size(params)}, one input set {_size(inputs)}, output {_size(output)}"
        limit = self.options.memory_limit_bytes
        # the candidate receives the parameters and builds its own copy, then holds one call's
        # inputs and output, beside Python and torch (about 1 GiB of address space)
        candidate_need = 2 * (params or 0) + (inputs or 0) + (output or 0) + _RUNTIME_BYTES
        if candidate_need > limit:
            raise self._blame_problem(
                f"problem too large for the sandbox: the candidate needs at least {_size(candidate_need)} ({parts}; "
                f"the parameters twice while it loads, {_size(_RUNTIME_BYTES)} for Python and torch); its memory "
                f"limit is {_size(limit)} (AGENTINFRA_GRADER_MEMORY, GradeOptions.memory_limit_bytes): raise it, "
                "or shrink the problem's sizes"
            )
        if inputs is not None and output is not None and inputs + output > MAX_REPLY_BYTES:
            raise self._blame_problem(
                f"problem too large for the grader's wire: one input set and its output are {_size(inputs + output)} "
                f"({parts}), over the {_size(MAX_REPLY_BYTES)} frame the reference sends them in: shrink the "
                "problem's sizes to grade it here"
            )
        if output is not None and output > MAX_REPLY_BYTES:
            raise self._blame_problem(
                f"problem output too large: {_size(output)} per call, over the grader's {_size(MAX_REPLY_BYTES)} "
                f"reply frame (outputs are compared whole by the supervisor; {parts}): shrink the problem's "
                "sizes to grade it here"
            )
        available = _available_memory()
        if available is not None and 3 * need > available:
            raise self._blame_problem(
                f"problem too large for this machine: grading holds about 3 x {_size(need)} (reference, "
                f"candidate and the supervisor's copies; {parts}) and {_size(available)} is available: "
                "run it on a larger machine, or shrink the problem's sizes"
            )

    def _reference_call(
        self,
        header: dict[str, Any],
        tensors: list[TensorBytes] | None = None,
        *,
        receive_only: bool = False,
    ) -> Frame:
        assert self.reference is not None
        timeout = max(60.0, self.options.timeout_s)
        try:
            frame = (
                self.reference.receive(timeout_s=timeout)
                if receive_only
                else self.reference.request(header, tensors, timeout_s=timeout)
            )
        except WorkerTimeoutError:
            raise self._blame_problem(
                f"the reference took over {timeout:.0f} s for one {header.get('op')} request: the problem is too "
                "slow for this machine; raise --timeout-s (GradeOptions.timeout_s) or shrink the problem's sizes"
            ) from None
        except WorkerDiedError as exc:
            with contextlib.suppress(Exception):
                self.reference.process.wait(timeout=5)
            code = self.reference.process.poll()
            killed = code in (-signal.SIGKILL, 128 + signal.SIGKILL)
            why = (
                "it was killed (SIGKILL: most likely the machine ran out of memory; see dmesg)"
                if killed
                else f"exit status {code}"
            )
            raise self._blame_problem(
                f"the reference process died during {header.get('op')}: {why}; the problem may be too large for "
                "this machine: shrink its sizes",
                f"{exc}; {self.reference.stderr_tail()}",
            ) from None
        if not frame.header.get("ok"):
            raise self._blame_problem(
                f"the problem's own code failed in {header.get('op')}: {frame.header.get('error')}"
            )
        return frame

    def start_candidate(self, loaded: dict[str, Any]) -> None:
        assert self.candidate is not None
        submission = self.private / "submission.py"
        if self.candidate.mode == "rlimits-only":
            self._add(
                Finding(
                    check="sandbox",
                    severity="warn",
                    message="no namespaces on this machine: the candidate ran with resource limits only",
                )
            )
        self._candidate_call({"op": "hello"}, receive_only=True, phase="start")
        header = loaded["header"]
        path = self.candidate.program_path(submission)
        reply = self._candidate_call(
            {"op": "load", "role": "candidate", "path": path, "threads": self.threads, "seed": self.init_seed,
             "device": self.options.device, "init": header["init"], "state_names": header["state_names"],
             "init_tensor_count": header["init_tensor_count"]},
            loaded["tensors"], phase="load", allow_error=True,
        )  # fmt: skip
        if not reply.header.get("ok"):
            raise _StopGradingError(
                Outcome.INVALID, str(reply.header.get("error", "load failed"))[:2000]
            )
        if self.eval_mode:
            self._candidate_call({"op": "mode", "eval": True}, phase="load")

    def _worker_uid(self) -> int:
        """A uid for one worker, reserved for this grading's life (`_reserve_uid`)."""
        uid, lock = _reserve_uid()
        self._uid_locks.append(lock)
        return uid

    def _candidate_call(self, header: dict[str, Any], tensors: list[TensorBytes] | None = None, *, phase: str,
                        receive_only: bool = False, allow_error: bool = False) -> Frame:  # fmt: skip
        assert self.candidate is not None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _StopGradingError(
                Outcome.TIMEOUT,
                f"candidate exceeded its {self.options.timeout_s:.0f} s budget during {phase}",
            )
        try:
            frame = (
                self.candidate.receive(timeout_s=left)
                if receive_only
                else self.candidate.request(header, tensors, timeout_s=left)
            )
        except WorkerTimeoutError:
            raise _StopGradingError(
                Outcome.TIMEOUT,
                f"candidate exceeded its {self.options.timeout_s:.0f} s budget during {phase}",
            ) from None
        except WorkerDiedError as exc:
            raise self._death(exc, phase) from None
        if not frame.header.get("ok") and not allow_error:
            kind = frame.header.get("error_type", "")
            outcome = (
                Outcome.CRASHED if kind in ("MemoryError", "RecursionError") else Outcome.FAILED
            )
            raise _StopGradingError(
                outcome, f"candidate raised during {phase}: {str(frame.header.get('error'))[:1500]}"
            )
        if not frame.header.get("ok") and frame.header.get("error_type") == "MemoryError":
            raise _StopGradingError(Outcome.CRASHED, f"candidate ran out of memory during {phase}")
        return frame

    def _death(self, exc: WorkerDiedError, phase: str) -> _StopGradingError:
        assert self.candidate is not None
        with contextlib.suppress(Exception):
            self.candidate.process.wait(timeout=5)
        code = self.candidate.process.poll()
        tail = self.candidate.stderr_tail(600)
        if code is not None and code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
            return _StopGradingError(
                Outcome.TIMEOUT, f"candidate hit its CPU-time limit during {phase}"
            )
        return _StopGradingError(
            Outcome.CRASHED,
            f"candidate process ended during {phase} (exit status {code}): {exc}; stderr: {tail}",
        )

    def _reference_agrees_with_itself(self) -> tuple[bool, list[str], str]:
        """Runs the reference twice on the same fresh inputs: (agrees, its random modules, why not)."""
        started = time.monotonic()
        twice = self._reference_call(
            {"op": "gen", "seed": self.rng.randrange(1 << 31), "variant": "base", "shape": {},
             "repeat": True}
        )  # fmt: skip
        self.reference_call_s = (time.monotonic() - started) / 2
        result = _compare(twice.tensors[-1], twice.tensors[-2], self.meta)
        return result.ok, list(twice.header.get("random_modules", [])), result.message

    def check_reference(self) -> None:
        """The reference's own self-check, its memory against the sandbox's limit, and the candidate's budget.

        A reference that needs more address space than the candidate may have cannot be
        matched by a candidate doing the same work: the problem is refused. A slow
        reference extends the candidate's wall-clock budget to what its calls need
        (the reference's time, never the candidate's, decides).
        """
        self.check_determinism()
        assert self.reference is not None
        peak = self.reference.peak_address_space() if self.options.device == "cpu" else None
        if peak is not None and peak > self.options.memory_limit_bytes:
            raise self._blame_problem(
                f"problem too large for the sandbox: the reference itself reached {_size(peak)} of address "
                f"space running one call; the candidate's memory limit is {_size(self.options.memory_limit_bytes)} "
                "(AGENTINFRA_GRADER_MEMORY, GradeOptions.memory_limit_bytes): raise it, or shrink the problem's sizes"
            )
        key = (self.meta.sha256, self.options.device, self.threads)
        call_s = _CALL_S.setdefault(key, self.reference_call_s or 0.0)
        calls = (
            self.options.correctness_seeds * len(self.meta.variants)
            + len(self.meta.shape_variants)
            + 2 * (self.options.timing_pairs + 2)
        )
        self.deadline = max(self.deadline, time.monotonic() + 3 * calls * call_s + 30)

    def check_determinism(self) -> None:
        """The policy for a reference that is random (module docstring): eval mode, else blame the problem."""
        key = (self.meta.sha256, self.options.device)
        why = "measured earlier in this process"
        if key in _SELF_CHECK and _SELF_CHECK[key] is None:
            return
        named = _SELF_CHECK.get(key)
        if named is None:
            agrees, modules, why = self._reference_agrees_with_itself()
            if agrees:
                _SELF_CHECK[key] = None
                return
            named = ", ".join(modules) or "no dropout-like module: random ops in forward"
            self._reference_call({"op": "mode", "eval": True})
            agrees, _, why_eval = self._reference_agrees_with_itself()
            if not agrees:
                raise self._blame_problem(
                    "the reference gives different outputs for the same inputs, in training and in eval "
                    f"mode: output comparison cannot grade this problem (random modules: {named})",
                    f"training mode: {why}; eval mode: {why_eval}",
                )
        else:
            self._reference_call({"op": "mode", "eval": True})
        _SELF_CHECK[key] = named
        self.eval_mode = True  # the candidate follows right after its load
        self._add(
            Finding(
                check="nondeterministic_reference",
                severity="warn",
                message="the reference gives different outputs for the same inputs in training mode "
                f"({named}): both models were graded in eval mode",
                evidence=why,
            )
        )

    def check_correctness(self) -> None:
        cases: list[tuple[int, str, dict[str, int]]] = [
            (self.rng.randrange(1 << 31), variant, {})
            for _ in range(self.options.correctness_seeds)
            for variant in self.meta.variants
        ]
        cases += [
            (self.rng.randrange(1 << 31), "base", dict(shape)) for shape in self.meta.shape_variants
        ]
        checked = 0
        failures: list[str] = []
        for seed, variant, shape in cases:
            gen = self._reference_call(
                {"op": "gen", "seed": seed, "variant": variant, "shape": shape}
            )
            if not gen.header["finite"] and variant != "base":
                continue
            inputs, expected = gen.tensors[:-1], gen.tensors[-1]
            reply = self._candidate_call(
                {"op": "call", "inputs": gen.header["inputs"]}, inputs, phase="correctness"
            )
            checked += 1
            label = f"seed {seed}, variant {variant}" + (f", shape {shape}" if shape else "")
            if reply.header.get("output_type") != "torch.Tensor" or not reply.tensors:
                self._add(
                    Finding(
                        check="output_type",
                        severity="block",
                        message=f"output is {reply.header.get('output_type')}, not a plain torch.Tensor",
                        evidence=label,
                    )
                )
                failures.append(label)
                continue
            sent = [digest(t) for t in inputs]
            after = [
                a
                for a in reply.header.get("inputs_after", [])
                if isinstance(a, str) and len(a) == 32
            ]
            if after != sent[: len(after)] or len(after) != len(sent):
                self._add(
                    Finding(
                        check="input_mutation",
                        severity="block",
                        message="an input was modified by the call",
                        evidence=label,
                    )
                )
            result = _compare(reply.tensors[0], expected, self.meta)
            if not result.ok:
                failures.append(f"{label}: {result.message}")
        self.correct = checked > 0 and not failures
        if failures:
            self._add(
                Finding(
                    check="correctness",
                    severity="warn",
                    message=f"{len(failures)} of {checked} checks failed",
                    evidence="; ".join(failures[:4]),
                )
            )

    def measure(self) -> None:
        peaks = self._peaks()
        probe = self._reference_call(
            {"op": "gen", "seed": self.rng.randrange(1 << 31), "variant": "base", "shape": {}}
        )
        entry_bytes = sum(len(t.data) for t in probe.tensors) or 1
        reference_s = self._time_single(probe)
        per_batch = max(1, min(16, int(_TARGET_BATCH_S / max(reference_s, 1e-6))))
        pairs = self.options.timing_pairs
        warmup = 2
        slow = reference_s > _SLOW_CALL_S
        if slow:  # fewer, single-call batches within a time budget; early stop below
            warmup = 1
            pairs = max(_MIN_PAIRS, min(pairs, int(_SLOW_TIMED_S / reference_s)))
        pool_size = (pairs + warmup) * per_batch
        if pool_size * entry_bytes > _POOL_BYTES_LIMIT:
            per_batch = max(1, _POOL_BYTES_LIMIT // entry_bytes // (pairs + warmup))
            pool_size = (pairs + warmup) * per_batch
        if pool_size * entry_bytes > _POOL_BYTES_LIMIT:
            pairs = max(3, _POOL_BYTES_LIMIT // entry_bytes - warmup)
            pool_size = pairs + warmup
        staged = self._share_pool(pool_size, per_batch)
        order = list(range(pool_size))
        if not staged:  # staged batches are runs of the pool, which is in random order already
            self.rng.shuffle(order)
        ref_times: list[float] = []
        cand_times: list[float] = []
        with _gc_paused():
            overhead_ref = self._empty_overhead(reference=True)
            # The candidate controls how long its own empty batch takes: it may only lower
            # the overhead subtracted from its time, never raise it.
            self._cpu_windows = []
            overhead_cand = min(self._empty_overhead(reference=False), overhead_ref)
            empty_windows, self._cpu_windows, self._idle_windows = self._cpu_windows, [], []
            self._timing_loop(order, per_batch, pairs, warmup, slow, overhead_ref, overhead_cand,
                              ref_times, cand_times)  # fmt: skip
        self.timed_calls = len(cand_times) * per_batch
        self._check_staging()
        self._check_cores(empty_windows, self._cpu_windows[warmup:])
        self._check_idle(self._idle_windows[warmup:])
        self._finish_timing(ref_times, cand_times, peaks, entry_bytes)

    def _timing_loop(
        self, order: list[int], per_batch: int, pairs: int, warmup: int, slow: bool,
        overhead_ref: float, overhead_cand: float, ref_times: list[float], cand_times: list[float],
    ) -> None:  # fmt: skip
        """The timed pairs, appending per-call seconds to ``ref_times`` and ``cand_times``."""
        for index in range(pairs + warmup):
            chunk = order[index * per_batch : (index + 1) * per_batch]
            # ABBA: who goes first alternates, so neither side gains from its place in the pair
            if index % 2 == 0:
                ref_s = self._staged_batch_reference(index, chunk)
                cand_s, commits = self._staged_batch_candidate(index, chunk)
            else:
                cand_s, commits = self._staged_batch_candidate(index, chunk)
                ref_s = self._staged_batch_reference(index, chunk)
            self._audit(chunk, commits)
            if index >= warmup:
                ref_times.append(max(ref_s - overhead_ref, 1e-9) / len(chunk))
                cand_times.append(max(cand_s - overhead_cand, 1e-9) / len(chunk))
            if (
                slow
                and len(ref_times) >= _MIN_PAIRS
                and len(ref_times) % 2 == 0
                and _interval_tight(ref_times, cand_times, self.rng)
            ):
                break

    def _peaks(self) -> dict[str, float]:
        key = (self.options.device, self.threads)
        if key not in _PEAKS:
            _PEAKS[key] = {
                k: float(v)
                for k, v in self._reference_call({"op": "peaks"}).header.items()
                if k in ("flops_per_s", "bytes_per_s")
            }
        return _PEAKS[key]

    def _time_single(self, probe: Frame) -> float:
        self._reference_call(
            {"op": "pool", "entries": [probe.header["inputs"]]}, probe.tensors[:-1]
        )
        best = float("inf")
        for _ in range(3):
            best = min(best, self._timed_batch_reference([0]))
            if best > _SLOW_CALL_S:  # a slow call: once is enough to plan with
                break
        return best

    def _share_pool(self, size: int, per_batch: int) -> bool:
        """``size`` timing inputs from fresh secret seeds: the reference writes them into the pool
        file and this process seals it. On a CPU the inputs are staged (True): each run of
        ``per_batch`` entries gets two sealed copies, one per side, and each side maps a
        batch's inputs (`_stage`) only just before that batch is timed, so the candidate never
        holds inputs it could work on ahead of time. Elsewhere each worker reads a private
        copy of the whole pool."""
        staged = self.options.device == "cpu"
        seeds = [self.rng.randrange(1 << 31) for _ in range(size)]
        pool = os.memfd_create("agentinfra-pool", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self._pool_fds.append(pool)
        self._send_fd(0, pool)
        made = self._reference_call(
            {"op": "pool_make", "seeds": seeds, "receive_fd": True,
             "align_every": per_batch if staged else 0}
        )  # fmt: skip
        total = int(made.header["bytes"])
        self._seal_pool_file(pool, total)
        shared = {
            "op": "pool",
            "shared": True,
            "staged": staged,
            "entries": made.header["entries"],
            "specs": made.header["specs"],
        }
        if staged:
            starts = [int(x) for x in made.header.get("starts", [])]
            if len(starts) != -(-size // per_batch):
                raise _StopGradingError(
                    Outcome.GRADER_ERROR, f"reference pool has {len(starts)} batch starts"
                )
            ends = [*starts[1:], total]
            self._staging = _Staging(per_batch=per_batch, size=size)
            for start, end in zip(starts, ends, strict=True):
                self._staging.ranges.append((start, end - start))
                # one copy per side, made the same way, so that both stage alike
                self._staging.files.append(
                    (self._batch_file(pool, start, end - start), self._batch_file(pool, start, end - start))
                )  # fmt: skip
        pooled = self._reference_call(shared)
        if pooled.header.get("size") != size:
            raise _StopGradingError(
                Outcome.GRADER_ERROR,
                f"reference pool has {pooled.header.get('size')} entries, not {size}",
            )
        if staged:
            self._candidate_call(shared, phase="pool")
            return True
        readonly = os.open(f"/proc/self/fd/{pool}", os.O_RDONLY | os.O_CLOEXEC)
        self._pool_fds.append(readonly)
        self._send_fd(1, readonly)
        self._candidate_call({**shared, "receive_fd": True}, phase="pool")
        return False

    def _batch_file(self, pool: int, start: int, length: int) -> int:
        """A sealed copy of ``length`` bytes of the pool file at ``start``: one batch's inputs."""
        fd = os.memfd_create("agentinfra-batch", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self._pool_fds.append(fd)
        offset = 0
        while offset < length:
            try:
                copied = os.copy_file_range(pool, fd, length - offset, start + offset, offset)
            except OSError:  # a kernel without copy_file_range between these files: through here
                chunk = os.pread(pool, min(length - offset, 1 << 24), start + offset)
                copied = os.pwrite(fd, chunk, offset) if chunk else 0
            if copied <= 0:
                raise _StopGradingError(
                    Outcome.GRADER_ERROR, "pool file ended while copying a batch"
                )
            offset += copied
        self._seal_pool_file(fd, length)
        return fd

    def _stage(self, index: int, *, reference: bool) -> None:
        """Batch ``index``'s inputs mapped into one worker, from that worker's own copy."""
        staging = self._staging
        assert staging is not None
        start, length = staging.ranges[index]
        first = index * staging.per_batch
        header = {"op": "stage", "first": first, "count": min(staging.per_batch, staging.size - first),
                  "length": length, "base": start}  # fmt: skip
        self._send_fd(0 if reference else 1, staging.files[index][0 if reference else 1])
        if reference:
            self._reference_call(header)
        else:
            self._candidate_call(header, phase="timing")

    def _staged_batch_reference(self, index: int, chunk: list[int]) -> float:
        if self._staging is None:
            return self._timed_batch_reference(chunk)
        assert self.reference is not None
        before = self.reference.cpu_sample()
        self._stage(index, reference=True)
        after = self.reference.cpu_sample()
        self._staging.reference_cpu.append(after.since(before)[0])
        return self._timed_batch_reference(chunk, staged=True)

    def _staged_batch_candidate(self, index: int, chunk: list[int]) -> tuple[float, list[str]]:
        if self._staging is None:
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
            self._staging.candidate_cpu.append(self._batch_cpu_before.since(before)[0])
            self._staging.candidate_batch_cpu.append(self._cpu_windows[-1][1])
        return elapsed, commits

    def _send_fd(self, worker: int, fd: int) -> None:
        """``fd`` to the reference (0) or the candidate (1); a worker gone is noticed by its next frame."""
        with contextlib.suppress(OSError):
            socket.send_fds(self._fd_sockets[worker], [b"pool"], [fd])

    def _empty_overhead(self, *, reference: bool) -> float:
        samples = [
            self._timed_batch_reference([]) if reference else self._timed_batch_candidate([])[0]
            for _ in range(7)
        ]
        return statistics.median(samples)

    def _timed_batch_reference(self, indices: list[int], *, staged: bool = False) -> float:
        assert self.reference is not None
        cpu_before = self._cpu()
        start = time.perf_counter()
        self._reference_call({"op": "batch", "indices": indices, "staged": staged})
        elapsed = time.perf_counter() - start
        cpu_after = self._cpu()
        if cpu_before is not None and cpu_after is not None:
            # the candidate is waiting for its next call: what does it compute meanwhile?
            self._idle_windows.append((elapsed, *cpu_after.since(cpu_before)))
        return elapsed

    def _cpu(self) -> CpuSample | None:
        return self.candidate.cpu_sample() if self.candidate is not None else None

    def _timed_batch_candidate(
        self, indices: list[int], *, staged: bool = False
    ) -> tuple[float, list[str]]:
        cpu_before = self._batch_cpu_before = self._cpu()
        start = time.perf_counter()
        frame = self._candidate_call(
            {"op": "batch", "indices": indices, "staged": staged}, phase="timing"
        )
        elapsed = time.perf_counter() - start
        cpu_after = self._cpu()
        if cpu_before is not None and cpu_after is not None:
            self._cpu_windows.append((elapsed, *cpu_after.since(cpu_before)))
        commits = frame.header.get("commits")
        device_ms = frame.header.get("device_ms")
        if self.options.device == "cuda" and isinstance(device_ms, int | float) and indices:
            host_ms = elapsed * 1e3
            # Events only see the default stream: work elsewhere, or patched events, read low.
            if (
                device_ms < 0.25 * host_ms
                and host_ms > 1.0
                and not any(f.check == "timing_disagreement" for f in self.findings)
            ):
                self._add(
                    Finding(
                        check="timing_disagreement",
                        severity="warn",
                        message=f"CUDA events report {device_ms:.3f} ms for a batch the supervisor's clock measured at {host_ms:.3f} ms",
                        evidence=f"batch of {len(indices)} calls",
                    )
                )
        if not isinstance(commits, list) or len(commits) != len(indices):
            raise _StopGradingError(
                Outcome.CRASHED, "candidate broke the timing protocol (wrong number of results)"
            )
        return elapsed, [str(c) for c in commits]

    def _audit(self, chunk: list[int], commits: list[str]) -> None:
        """A secret subset of the batch's outputs against their commitments and the reference's
        outputs for the same inputs (from its timed batch just before)."""
        positions = [
            p for p in range(len(chunk)) if self.rng.random() < self.options.audit_fraction
        ]
        if not positions:
            return
        frame = self._candidate_call({"op": "fetch", "positions": positions}, phase="audit")
        if len(frame.tensors) != len(positions):
            raise _StopGradingError(Outcome.CRASHED, "candidate broke the audit protocol")
        expected = self._reference_call({"op": "fetch", "positions": positions}).tensors
        for position, got, want in zip(positions, frame.tensors, expected, strict=True):
            call = chunk[position]
            if digest(got) != commits[position]:
                self._fail_audit(
                    "an audited output differs from what the candidate committed when its timed call returned",
                    f"timed call {call}",
                )
                return
            result = _compare(got, want, self.meta)
            if not result.ok:
                self._fail_audit(
                    "a timed call's output was wrong although the correctness checks passed (correct only while checked)",
                    f"timed call {call}: {result.message}",
                )
                return

    def _fail_audit(self, message: str, evidence: str) -> None:
        self._add(Finding(check="audit", severity="block", message=message, evidence=evidence))
        self.correct = False

    def _check_staging(self) -> None:
        """CPU the candidate spent staging batches beyond what the reference spent staging the
        same bytes the same way (each from its own copy, made alike).

        Staging maps a batch's inputs just before the batch is timed. A candidate that
        computes its outputs then, untimed, and only returns them from the timed batch,
        spends the work here instead. Allowed beyond the reference, per batch and over all
        batches: a tenth of the reference's staging, a tenth of the candidate's timed work
        and 0.1 ms. Blocks when the total is over and at least half of the batches (and at
        least 3) are over on their own; a warning when only a few are.
        """
        staging = self._staging
        if staging is None or not staging.candidate_cpu:
            return
        batches = list(zip(staging.candidate_cpu, staging.reference_cpu, staging.candidate_batch_cpu, strict=False))  # fmt: skip

        def allowed(reference: float, timed: float) -> float:
            return _STAGE_SHARE * (reference + timed) + _STAGE_SLACK_S

        excess = sum(c - r for c, r, _ in batches)
        if excess <= sum(allowed(r, t) for _, r, t in batches):
            return
        over = sum(1 for c, r, t in batches if c - r > allowed(r, t))
        repeated = over >= max(3, (len(batches) + 1) // 2)
        timed = sum(t for _, _, t in batches)
        self._add(
            Finding(
                check="staging",
                severity="block" if repeated else "warn",
                message=f"the candidate used {excess * 1e3:.1f} ms more CPU than the reference staging "
                f"the same {len(batches)} batches of inputs (untimed), against {timed * 1e3:.1f} ms "
                "in its timed batches"
                + ("" if repeated else " (in a few batches only: not counted)"),
                evidence=f"{over} of {len(batches)} batches over a tenth of the reference's staging "
                f"and of their timed work plus {_STAGE_SLACK_S * 1e3:.1f} ms",
            )
        )

    def _check_cores(
        self, empty: list[tuple[float, float, bool]], timed: list[tuple[float, float, bool]]
    ) -> None:
        """Cores the candidate's computation used while timed, beyond the plumbing of a batch.

        ``empty`` and ``timed`` hold (wall s, cpu s, precise) per candidate batch.
        """
        if not empty or not timed:
            return
        empty_wall = statistics.median(w for w, _, _ in empty)
        empty_cpu = statistics.median(c for _, c, _ in empty)
        work = [(max(w - empty_wall, 0.0), max(c - empty_cpu, 0.0), p) for w, c, p in timed]
        self._judge_cpu(
            work, self.threads * 1.5 + 0.25, "while timed",
            f"after subtracting an empty batch's {empty_cpu * 1e3:.2f} ms cpu and {empty_wall * 1e3:.2f} ms wall",
        )  # fmt: skip

    def _check_idle(self, windows: list[tuple[float, float, bool]]) -> None:
        """CPU the candidate uses while the reference is timed and the candidate has no call.

        An honest candidate waits on its pipe; one that burns CPU, or finishes work in
        the background after returning, shows up here. The allowance is one quarter of
        a core plus the allotted threads beyond the first (an OpenMP pool may spin
        briefly after a parallel region).
        """
        self._judge_cpu(windows, 0.25 + (self.threads - 1), "while it had no call to run",
                        "during the reference's timed batches")  # fmt: skip

    def _judge_cpu(
        self, windows: list[tuple[float, float, bool]], allowed: float, when: str, how: str
    ) -> None:
        """A ``threads_processes`` finding when ``windows`` (wall s, cpu s, precise) use more
        than ``allowed`` cores: a block only when measurable and repeated, else a warning."""
        wall = sum(w for w, _, _ in windows)
        cpu = sum(c for _, c, _ in windows)
        if wall <= 0 or cpu / wall <= allowed:
            return
        coarse = sum(1 for _, _, p in windows if not p)
        # A window measured in clock ticks can read up to two ticks high; is the excess beyond that?
        resolution_s = 2 * coarse / _TICKS_PER_S
        over = sum(1 for w, c, _ in windows if w > 0.005 and c / w > allowed)
        measurable = wall >= _MIN_CORE_WALL_S and cpu - resolution_s > allowed * wall
        repeated = over >= max(3, (len(windows) + 1) // 2)
        message = f"the candidate used {cpu / wall:.2f} cores {when}; {self.threads} allotted"
        if wall < _MIN_CORE_WALL_S:
            message += " (too little timed work to judge: not counted)"
        elif not measurable:
            message += " (within clock-tick resolution: not counted)"
        elif not repeated:
            message += " (in a few batches only: not counted)"
        self._add(
            Finding(
                check="threads_processes",
                severity="block" if measurable and repeated else "warn",
                message=message,
                evidence=f"cpu {cpu:.3f} s over wall {wall:.3f} s across {len(windows)} batches, {how}; "
                f"{over} batches over {allowed:.2f} cores; {coarse} measured in clock ticks",
            )
        )

    def _finish_timing(
        self,
        ref_times: list[float],
        cand_times: list[float],
        peaks: dict[str, float],
        io_bytes: int,
    ) -> None:
        baseline = statistics.median(ref_times)
        candidate = statistics.median(cand_times)
        ratios = [r / c for r, c in zip(ref_times, cand_times, strict=True)]
        self.timing = {
            "baseline_ms": baseline * 1e3,
            "candidate_ms": candidate * 1e3,
            "speedup": statistics.median(ratios),
            "speedup_ci": _bootstrap_ci(ratios, self.rng, 400),
        }
        floor = 0.0
        if self.meta.flops and peaks.get("flops_per_s"):
            floor = max(floor, self.meta.flops / peaks["flops_per_s"])
        if self.meta.bytes and peaks.get("bytes_per_s"):
            floor = max(floor, self.meta.bytes / peaks["bytes_per_s"])
        self.utilisation = _utilisation(self.meta, peaks, candidate, io_bytes)
        if floor and candidate < 0.5 * floor:
            self._add(
                Finding(
                    check="plausibility",
                    severity="block",
                    message=f"{candidate * 1e3:.4f} ms per call is below the physical floor of {floor * 1e3:.4f} ms for this problem's work on this machine",
                    evidence=f"peaks {peaks}",
                )
            )

    # -- verdict -----------------------------------------------------------------

    def provenance(self) -> Provenance:
        import platform

        import torch

        mode = self.candidate.mode if self.candidate else "none"
        model = platform.processor() or platform.machine()
        with contextlib.suppress(OSError):
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        if self.options.device == "cuda" and torch.cuda.is_available():
            model = torch.cuda.get_device_name()
        return Provenance(
            grader_version=GRADER_VERSION, torch_version=str(torch.__version__), device=self.options.device,
            device_model=model, threads=self.threads, sandbox=mode, problem_sha256=self.meta.sha256,
            submission_sha256=hashlib.sha256(self.source).hexdigest(),
        )  # fmt: skip

    def verdict(self, stop: _StopGradingError | None) -> Verdict:
        blocking = any(f.severity == "block" for f in self.findings)
        if blocking:
            outcome = Outcome.HACK_FLAGGED
        elif stop is not None and stop.outcome is Outcome.INVALID:
            outcome = Outcome.INVALID
        elif stop is not None:
            outcome = stop.outcome
        else:
            outcome = Outcome.PASSED if self.correct else Outcome.FAILED
        timing = (
            self.timing
            if outcome is Outcome.PASSED or (outcome is Outcome.HACK_FLAGGED and self.correct)
            else {}
        )
        return Verdict(
            outcome=outcome, correct=self.correct and stop is None and not any(f.check == "audit" for f in self.findings),
            speedup=timing.get("speedup"), speedup_ci=timing.get("speedup_ci"), candidate_ms=timing.get("candidate_ms"),
            baseline_ms=timing.get("baseline_ms"), findings=self.findings, provenance=self.provenance(),
            utilisation=self.utilisation, timed_calls=self.timed_calls if timing else None,
            error=_capped(stop.error) if stop else None,
        )  # fmt: skip

    def close(self) -> None:
        for worker in (self.candidate, self.reference):
            if worker is not None:
                with contextlib.suppress(Exception):
                    worker.kill()
        shutil.rmtree(self.private, ignore_errors=True)
        while self._pool_fds:
            os.close(self._pool_fds.pop())
        for sock in self._fd_sockets:
            sock.close()
        _release_cpus(self.cpus)
        self.cpus = ()
        while self._uid_locks:  # after the kill: the uids' processes are gone
            os.close(self._uid_locks.pop())

    def run(self) -> Verdict:
        stop: _StopGradingError | None = None
        self.cpus = _claim_cpus(self.threads)
        try:
            self.prepare()
            self.spawn_workers()
            loaded = self.start_reference()
            self.check_reference()
            self.start_candidate(loaded)
            self.check_correctness()
            if self.correct and self.options.measure_speed:
                self.measure()
        except _StopGradingError as exc:
            stop = exc
        finally:
            self.close()
        return self.verdict(stop)


def _utilisation(
    meta: ProblemMeta, peaks: dict[str, float], seconds: float, io_bytes: int
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


def _bootstrap_ci(ratios: list[float], rng: random.Random, resamples: int) -> tuple[float, float]:
    """The 95% bootstrap interval of the median of ``ratios``."""
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return boot[int(0.025 * len(boot))], boot[int(0.975 * len(boot)) - 1]


def _interval_tight(ref_times: list[float], cand_times: list[float], rng: random.Random) -> bool:
    """Whether the speedup's bootstrap 95% interval is within ``_CI_STOP`` of its median."""
    ratios = [r / c for r, c in zip(ref_times, cand_times, strict=True)]
    middle = statistics.median(ratios)
    low, high = _bootstrap_ci(ratios, rng, 200)
    return middle > 0 and (high - low) / 2 <= _CI_STOP * middle


def _size(count: int | None) -> str:
    return "unknown" if count is None else format_size(count)


def _available_memory() -> int | None:
    """The machine's ``MemAvailable`` in bytes, or None where /proc/meminfo has none."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _capped(error: str) -> str:
    """``error`` within `ERROR_LIMIT` characters: its head and tail, the cut marked."""
    if len(error) <= ERROR_LIMIT:
        return error
    half = (ERROR_LIMIT - 40) // 2
    return f"{error[:half]} [... {len(error) - 2 * half} characters cut ...] {error[-half:]}"


_GC_PAUSES = 0
"""Gradings of this process inside their timing loop now (`_gc_paused`)."""
_GC_LOCK = threading.Lock()
_GC_STATE = {"was_enabled": True}


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while any grading of this process times batches.

    The supervisor's clock times each batch, and the audits between pairs allocate enough
    objects to start a collection, which then ran inside the next timed batch: up to about
    6 ms on a 13 ms batch (02_softmax), always on whichever side went first after an audit.
    Collection resumes when the last timing loop ends (as it was, if it was off before).
    """
    global _GC_PAUSES
    with _GC_LOCK:
        if _GC_PAUSES == 0:
            _GC_STATE["was_enabled"] = gc.isenabled()
            gc.disable()
        _GC_PAUSES += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_PAUSES -= 1
            if _GC_PAUSES == 0 and _GC_STATE["was_enabled"]:
                gc.enable()


_CPU_USERS: dict[int, int] = {}
"""CPU -> gradings of this process pinned to it now."""
_CPU_LOCK = threading.Lock()


def _claim_cpus(threads: int) -> tuple[int, ...]:
    """The ``threads`` CPUs with the fewest live gradings of this process (lowest numbers first).

    Concurrent gradings (``--eval-workers``) get different cores where the machine has
    them, so one grading's timed batches never share a core with another's work;
    one grading at a time still runs on the first CPUs, as before.
    """
    with _CPU_LOCK:
        allowed = sorted(os.sched_getaffinity(0))
        chosen = tuple(
            sorted(sorted(allowed, key=lambda cpu: (_CPU_USERS.get(cpu, 0), cpu))[:threads])
        )
        for cpu in chosen:
            _CPU_USERS[cpu] = _CPU_USERS.get(cpu, 0) + 1
    return chosen


def _release_cpus(cpus: tuple[int, ...]) -> None:
    with _CPU_LOCK:
        for cpu in cpus:
            _CPU_USERS[cpu] -= 1


def _reserve_uid() -> tuple[int, int]:
    """A candidate uid reserved for this grading's life (`agentinfra.sandbox.reserve_uid`)."""
    try:
        return reserve_uid()
    except UidExhaustedError as exc:
        raise TaskEnvironmentError(f"{exc}; lower --eval-workers") from exc


def grade(problem: Path, submission: Path, options: GradeOptions | None = None) -> Verdict:
    """Grades ``submission`` against ``problem`` and returns the verdict.

    A verdict is returned for every outcome of the submission (crash, timeout,
    cheating included).

    Raises:
        TaskEnvironmentError: the problem or submission file cannot be read, or the
            problem is not in KernelBench format (a usage error, not a verdict).
    """
    return _Grading(Path(problem), Path(submission), options or GradeOptions()).run()


async def grade_async(
    problem: Path, submission: Path, options: GradeOptions | None = None
) -> Verdict:
    """`grade` on a worker thread, for event-loop callers such as the harness."""
    return await asyncio.to_thread(grade, problem, submission, options)

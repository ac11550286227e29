"""The trusted supervisor: grades one submission against one problem, in isolation.

`grade` takes the problem's and the submission's bytes. `_Grading` is the
orchestrator: named steps (prepare, spawn workers, start and check the reference,
start the candidate, correctness, timing, verdict) that record what the other
modules return. Where each part lives:
- `_compare`: the output comparison (pure);
- `_judgements`: the runtime checks and refusals below, pure functions of measurements;
- `_timing`: the timing step (plan, ABBA pairs, audits, CPU windows);
- `_timing_pool`: the pool's memfds, seals, per-batch copies and descriptor sockets;
- `_worker_calls`: requests to the two workers, and who is blamed when one fails;
- `_process_state`: what lives across gradings (trusted caches, CPU claims, GC pause, uids);
- `_workers` and `_worker`: the worker processes, outside and inside the jail.

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
  candidate-controlled). The problem's bytes are written to a private directory and
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
  before it runs anything (`_worker.fix_allocator`: every block from the heap, no
  heap trim). The candidate may change its own allocator; that moves only its own
  time, which is what it is judged on.
- Runtime checks that block on a measurement, and their margins:
  - ``threads_processes``: the CPU time of the candidate's whole process tree,
    read from /proc just around each timed batch (nanosecond ``schedstat`` per
    thread; clock ticks from ``stat``, which keep exited threads and reaped
    children, for a batch during which threads came or went), minus the CPU of
    an empty batch measured the same way, over the batch's wall time minus the
    empty batch's (at most the reference's empty batch: a candidate may only lower
    what is subtracted, so sleeping in empty batches reads as nothing). Blocks only
    when the cores used over all timed batches exceed ``threads * 1.5 + 0.25`` *and* at least half of the timed batches
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
- Cached across gradings in one process (`_process_state.TRUSTED`), on the trusted side only: the machine's
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
- Memory is sized per problem and reserved machine-wide (`_sizing`, decision 0024):
  before the model is built, the reference worker sizes parameters, one input
  set and the output on torch's meta device (nothing is allocated); over the
  wire's 4 GiB reply frame (outputs are compared whole, here) the problem is
  refused in seconds, naming the machine's figure too when it would not fit here
  either. The grading then reserves its memory in the host's ledger
  (`agentinfra.sandbox.MemoryLedger`, shared by every grading process of this
  user), waiting in turn while other gradings hold it; only a grading that could
  not fit even on this machine with no other grading is refused (``grader_error``
  with a ``problem`` finding naming the machine's figure). The candidate starts
  after the reference's self-check, with an address-space limit sized from the
  reference's measured peak (`_sizing.memory_plan`: plus a quarter of the data,
  at least 256 MiB, a timed batch, and 8 more threads' untouched reservations),
  never over ``AGENTINFRA_GRADER_MEMORY`` where set (a cap: over it the problem is
  refused, naming the knob).
- A candidate that runs out of memory is ``crashed`` when the reference, measured
  again then, still fits the limit with the margin's floor to spare; when the
  reference itself has come that close, the grader's sizing is to blame
  (``grader_error`` with a ``memory_limit`` finding), never the candidate.
- The candidate's budget is wall-clock time the grader spends waiting on its
  replies, all calls together: the reference's own work (its self-check, making
  the timing pools, its timed batches) never spends it (``level1/56`` once timed
  out "during pool" after the reference had used the budget). A slow problem's
  candidate gets the budget its calls need: at least ``timeout_s``, extended to
  three times the reference's time for the calls the grading makes (plus 30 s).
  The reference's time decides, never the candidate's.
- A slow problem: when one reference call takes over 0.1 s the timing plan
  shrinks to fit about ``_timing.SLOW_TIMED_S`` of timed reference work (at least 6
  pairs; one warm-up; inputs that do not fit the 768 MiB pool come from pools
  made again from fresh seeds, never from fewer pairs), and
  from the sixth pair on, after an even number of pairs, it stops once the speedup's
  95% interval is within ±5% of its median. The verdict's ``timed_calls`` says
  how many calls were timed per side. Its correctness checks take fewer seeds
  (`_correctness.seeds_for`), never fewer variants or shapes.

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
import hashlib
import logging
import os
import random
import secrets
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agentinfra.environments.kernels._correctness import check_candidate, reference_self_check
from agentinfra.environments.kernels._grading_memory import (
    GradingMemory,
    MemoryRules,
    RestartGradingError,
)
from agentinfra.environments.kernels._judgements import (
    SpeedupResult,
    both_refusals,
    judge_cores,
    judge_idle,
    judge_plausibility,
    judge_staging,
    size_refusal,
    speedup_result,
    utilisation,
)
from agentinfra.environments.kernels._problem import parse_problem_meta
from agentinfra.environments.kernels._process_state import (
    TRUSTED,
    claim_cpus,
    release_cpus,
)
from agentinfra.environments.kernels._settings import KernelSettings
from agentinfra.environments.kernels._sizing import MemoryPlan, ProblemSizes
from agentinfra.environments.kernels._static import static_findings
from agentinfra.environments.kernels._timing import Measurements, TimingRun
from agentinfra.environments.kernels._timing_pool import TimingPool
from agentinfra.environments.kernels._verdict import (
    Finding,
    Outcome,
    Provenance,
    StopGradingError,
    Utilisation,
    Verdict,
    capped_error,
)
from agentinfra.environments.kernels._worker_calls import WorkerCalls, blame_problem
from agentinfra.environments.kernels._workers import (
    GLIBC_TUNABLES,
    MAX_REPLY_BYTES,
    SandboxLimits,
)
from agentinfra.errors import ConfigError
from agentinfra.sandbox import MemoryLedger, probe_sandbox_mode

__all__ = ["GRADER_VERSION", "GradeOptions", "grade", "grade_async"]

GRADER_VERSION = "1.0.0"
_MAX_FINDINGS_PER_CHECK = 3
_CUDA_LIMIT_BYTES = 4 << 30
"""The candidate's limit on CUDA without a cap: a CUDA process's address space is mostly the
driver's reservations, so the reference's is not measured there (the former fixed limit)."""
_MEMORY_WAIT_FACTOR = 10
"""A grading waits for memory at most this many times ``timeout_s`` (at least 600 s)."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class GradeOptions:
    """How to grade; the defaults are the full protocol."""

    device: Literal["cpu", "cuda"] = "cpu"
    threads: int = 1
    """Torch threads on both sides (CPU)."""
    timeout_s: float = 120.0
    """Wall-clock budget of the candidate process."""
    memory_limit_bytes: int | None = None
    """A cap on the candidate's address-space limit, which is sized per problem (`_sizing`);
    over it a problem is refused. None: no cap beyond what the machine can give."""
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
    memory_ledger: MemoryLedger | None = None
    """Where the grading reserves its memory; None: this host's (`MemoryLedger()`)."""

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
        if self.memory_limit_bytes is not None and self.memory_limit_bytes < 64 << 20:
            raise ConfigError(
                f"memory_limit_bytes={self.memory_limit_bytes} must be >= 64 MiB or None "
                "(AGENTINFRA_GRADER_MEMORY)"
            )

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


class _Grading:
    """One grading, as named steps: prepare, spawn workers, start and check the reference,
    start the candidate, correctness, timing, verdict."""

    def __init__(self, problem_source: bytes, submission_source: bytes, options: GradeOptions,
                 problem_name: str, *, restarted: bool = False) -> None:  # fmt: skip
        self.options = options
        self.meta = parse_problem_meta(problem_source, Path(problem_name))
        self.problem_source = problem_source
        self.source = submission_source
        self.rng = random.Random(options.seed if options.seed is not None else secrets.randbits(64))
        self.findings: list[Finding] = []
        self.correct = False
        self.private = Path(tempfile.mkdtemp(prefix="agentinfra-grade-"))
        os.chmod(self.private, 0o700)
        self.calls = WorkerCalls(timeout_s=options.timeout_s)
        self.pool = TimingPool()
        self.timing: SpeedupResult | None = None
        self.utilisation: Utilisation | None = None
        self.timed_calls: int | None = None
        self.reference_call_s: float | None = None
        self.eval_mode = False
        self.init_seed = 0
        self.threads = options.threads
        self.cpus: tuple[int, ...] = ()
        """The cores this grading's workers are pinned to, claimed by `run` (`claim_cpus`)."""
        self.memory = GradingMemory(
            MemoryRules(
                key=(self.meta.sha256, options.device, options.threads),
                label=f"{self.meta.path.name} ({self.meta.sha256[:12]})",
                cap_bytes=options.memory_limit_bytes, timing_pairs=options.timing_pairs,
                measure_speed=options.measure_speed, is_cpu=options.device == "cpu",
                max_wait_s=max(600.0, _MEMORY_WAIT_FACTOR * options.timeout_s),
            ),
            options.memory_ledger or MemoryLedger(), restarted=restarted,
        )  # fmt: skip
        self.plan: MemoryPlan | None = None
        self.budget_s = 0.0
        """The candidate's wall-clock budget beyond ``timeout_s`` that a slow reference's calls need."""
        self.candidate_socket: Any = None
        """The candidate's end of its descriptor socket, until the candidate starts."""

    def _add(self, finding: Finding | None) -> None:
        """Records a finding; a runtime check that fires on every call is kept three times."""
        if finding is None:
            return
        if sum(1 for f in self.findings if f.check == finding.check) < _MAX_FINDINGS_PER_CHECK:
            self.findings.append(finding)

    # -- steps -------------------------------------------------------------------

    def prepare(self) -> None:
        """Static checks, and the private copies the workers' jails receive."""
        try:
            self.findings += static_findings(self.source.decode(errors="replace"))
        except SyntaxError as exc:
            raise StopGradingError(
                Outcome.INVALID, f"SyntaxError: line {exc.lineno}: {exc.msg}"
            ) from None
        (self.private / "problem.py").write_bytes(self.problem_source)
        (self.private / "submission.py").write_bytes(self.source)
        for sub in ("reference", "candidate"):
            (self.private / sub).mkdir()

    def _limits(self, memory_limit_bytes: int) -> SandboxLimits:
        return SandboxLimits(
            memory_limit_bytes=memory_limit_bytes,
            max_processes=self.options.max_processes,
            cpu_limit_s=int(self.options.timeout_s * max(self.threads, 1)) + 30,
            threads=self.threads,
            cpus=self.cpus,
        )

    def spawn_reference(self) -> None:
        """Starts the reference worker; the candidate starts once its limit is sized (`spawn_candidate`).

        A submission that signals processes is refused first where no namespaces
        could contain it (``rlimits-only``): it is never started.
        """
        if probe_sandbox_mode() == "rlimits-only" and any(
            f.severity == "block" and f.check in ("signals", "early_exit") for f in self.findings
        ):
            raise StopGradingError(
                Outcome.HACK_FLAGGED,
                "not run: it signals processes and this machine has no namespaces to contain it",
            )
        theirs = self.pool.worker_sockets()
        self.candidate_socket = theirs[1]
        try:
            self.calls.start_reference(  # the reference has no limits: only threads and cores apply
                self.private, self._limits(_CUDA_LIMIT_BYTES), device=self.options.device,
                use_fork_server=self.options.fork_server, fd_socket=theirs[0].fileno(),
            )  # fmt: skip
        finally:
            theirs[0].close()

    def spawn_candidate(self) -> None:
        """Starts the candidate with the limit `check_reference` sized, and its budget."""
        assert self.plan is not None
        limit = self.plan.limit_bytes
        if self.options.device == "cuda":
            limit = self.options.memory_limit_bytes or max(limit, _CUDA_LIMIT_BYTES)
        try:
            self.calls.start_candidate(
                self.private, self._limits(limit), device=self.options.device,
                use_fork_server=self.options.fork_server, fd_socket=self.candidate_socket.fileno(),
            )  # fmt: skip
        finally:
            self.candidate_socket.close()
            self.candidate_socket = None
        self.calls.budget_s += self.budget_s

    def start_reference(self) -> dict[str, Any]:
        """The reference's hello, its sizes (a problem too large is refused), the grading's memory
        reservation (`admit`: it may wait) and the reference's load."""
        reference = self.calls.reference
        assert reference is not None
        problem = self.private / "problem.py"
        hello = self.calls.reference_call({"op": "hello"}, receive_only=True)
        self._check_allocator("reference", hello.header)
        sizes = self.calls.reference_call(
            {"op": "estimate", "path": reference.program_path(problem)}
        )
        cpu = self.options.device == "cpu"
        problem_sizes = ProblemSizes.from_header(sizes.header)
        baseline = reference.peak_address_space() if cpu else None
        # the wire's and the cap's limits first (a larger machine would not lift them), then the machine's;
        # a problem over both names both, so the machine's figure is always there when it does not fit
        limit = size_refusal(
            sizes.header, memory_cap_bytes=self.options.memory_limit_bytes, max_reply_bytes=MAX_REPLY_BYTES
        )  # fmt: skip
        machine = self.memory.unfit(problem_sizes, baseline)
        refusal = both_refusals(limit, machine) if limit and machine else limit or machine
        if refusal is not None:
            raise blame_problem(refusal)
        self.memory.admit(problem_sizes, baseline)
        self.init_seed = self.rng.randrange(1 << 31)
        frame = self.calls.reference_call(
            {"op": "load", "role": "reference", "path": reference.program_path(problem), "threads": self.threads,
             "seed": self.init_seed, "device": self.options.device}
        )  # fmt: skip
        return {"header": frame.header, "tensors": frame.tensors}

    def _check_allocator(self, role: str, hello: dict[str, Any]) -> None:
        """A warning when a worker's allocator is not in the state both sides share (`_worker.fix_allocator`
        and `_workers.GLIBC_TUNABLES`): its hello, sent before any problem or submission code runs, says.
        """
        allocator, tunables = hello.get("allocator"), hello.get("tunables")
        if allocator == "glibc-fixed" and tunables == GLIBC_TUNABLES:
            return
        if any(f.check == "timing_environment" and "allocator" in f.message for f in self.findings):
            return  # one warning a grading
        self._add(
            Finding(
                check="timing_environment",
                severity="warn",
                message="the workers' allocator could not be put in its fixed state (no glibc mallopt, or "
                "the malloc tunables missing): speedups of kernels that allocate megabytes per call vary "
                "more between gradings",
                evidence=f"{role}: allocator {allocator!r}, GLIBC_TUNABLES {tunables!r} (wanted {GLIBC_TUNABLES!r})",
            )
        )

    def check_reference(self) -> None:
        """The reference's own self-check, the candidate's memory limit sized from it, and its budget.

        The reference's peak address space and resident high-water mark after the
        self-check size the candidate's limit and the grading's reservation
        (`_sizing.memory_plan`); over the user's cap the problem is refused. When the
        reservation cannot grow to the plan now, the grading starts again from the
        ledger's queue with the plan known (`RestartGradingError`). A slow reference extends the
        candidate's wall-clock budget to what its calls need (the reference's time,
        never the candidate's, decides).
        """
        self.check_determinism()
        assert self.calls.reference is not None
        self.plan = self.memory.size(self.calls.reference)
        key = (self.meta.sha256, self.options.device, self.threads)
        call_s = TRUSTED.call_s.setdefault(key, self.reference_call_s or 0.0)
        self.reference_call_s = call_s or None  # also when the self-check was cached
        calls = (
            self.options.correctness_seeds * len(self.meta.variants)
            + len(self.meta.shape_variants)
            + 2 * (self.options.timing_pairs + 2)
        )
        self.budget_s = max(0.0, 3 * calls * call_s + 30 - self.options.timeout_s)

    def check_determinism(self) -> None:
        """The reference's self-check (`reference_self_check`): eval mode, else blame the problem."""
        checked = reference_self_check(
            self.calls, self.meta, self.rng, self.options.device, self._add
        )
        self.eval_mode = checked.eval_mode  # the candidate follows right after its load
        self.reference_call_s = checked.call_s

    def start_candidate(self, loaded: dict[str, Any]) -> None:
        """The candidate's hello and load, with the reference's initial state; eval mode if the reference's."""
        self.spawn_candidate()
        candidate = self.calls.candidate
        assert candidate is not None
        if candidate.mode == "rlimits-only":
            self._add(
                Finding(
                    check="sandbox",
                    severity="warn",
                    message="no namespaces on this machine: the candidate ran with resource limits only",
                )
            )
        hello = self.calls.candidate_call({"op": "hello"}, receive_only=True, phase="start")
        self._check_allocator("candidate", hello.header)
        header = loaded["header"]
        path = candidate.program_path(self.private / "submission.py")
        reply = self.calls.candidate_call(
            {"op": "load", "role": "candidate", "path": path, "threads": self.threads, "seed": self.init_seed,
             "device": self.options.device, "init": header["init"], "state_names": header["state_names"],
             "init_tensor_count": header["init_tensor_count"]},
            loaded["tensors"], phase="load", allow_error=True,
        )  # fmt: skip
        if not reply.header.get("ok"):
            raise StopGradingError(
                Outcome.INVALID, str(reply.header.get("error", "load failed"))[:2000]
            )
        if self.eval_mode:
            self.calls.candidate_call({"op": "mode", "eval": True}, phase="load")

    def check_correctness(self) -> None:
        """The candidate on secret seeds, variants and shapes, against the reference's outputs."""
        self.correct = check_candidate(
            self.calls, self.meta, self.rng, self.options.correctness_seeds, self._add,
            case_s=self.reference_call_s,
        )  # fmt: skip

    def measure(self) -> None:
        """The timing step (`TimingRun`), then the judgements on what it measured."""
        peaks = self._peaks()
        measured = TimingRun(
            self.calls, self.pool, self.meta, rng=self.rng, device=self.options.device,
            timing_pairs=self.options.timing_pairs, audit_fraction=self.options.audit_fraction,
            record=self._add,
        ).run()  # fmt: skip
        if measured.audit_failed:
            self.correct = False
        self.timed_calls = measured.timed_calls
        if measured.staging is not None:
            self._add(judge_staging(measured.staging))
        self._add(judge_cores(measured.empty_windows, measured.timed_windows, self.threads,
                              measured.reference_empty_s))  # fmt: skip
        self._add(judge_idle(measured.idle_windows, self.threads))
        self.finish_timing(measured, peaks)

    def _peaks(self) -> dict[str, float]:
        key = (self.options.device, self.threads)
        if key not in TRUSTED.peaks:
            TRUSTED.peaks[key] = {
                k: float(v)
                for k, v in self.calls.reference_call({"op": "peaks"}).header.items()
                if k in ("flops_per_s", "bytes_per_s")
            }
        return TRUSTED.peaks[key]

    def finish_timing(self, measured: Measurements, peaks: dict[str, float]) -> None:
        """The speedup with its interval, the roofline position and the plausibility check."""
        self.timing = speedup_result(measured.ref_times, measured.cand_times, self.rng)
        candidate_s = statistics.median(measured.cand_times)
        self.utilisation = utilisation(self.meta, peaks, candidate_s, measured.entry_bytes)
        self._add(judge_plausibility(self.meta, peaks, measured.candidate_s_at_least))

    # -- verdict -----------------------------------------------------------------

    def provenance(self) -> Provenance:
        import platform

        import torch

        candidate = self.calls.candidate
        mode = candidate.mode if candidate else "none"
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

    def verdict(self, stop: StopGradingError | None) -> Verdict:
        blocking = any(f.severity == "block" for f in self.findings)
        if blocking:
            outcome = Outcome.HACK_FLAGGED
        elif stop is not None and stop.outcome is Outcome.INVALID:
            outcome = Outcome.INVALID
        elif stop is not None:
            outcome = stop.outcome
        else:
            outcome = Outcome.PASSED if self.correct else Outcome.FAILED
        shown = (
            self.timing
            if outcome is Outcome.PASSED or (outcome is Outcome.HACK_FLAGGED and self.correct)
            else None
        )
        return Verdict(
            outcome=outcome, correct=self.correct and stop is None and not any(f.check == "audit" for f in self.findings),
            speedup=shown.speedup if shown else None, speedup_ci=shown.speedup_ci if shown else None,
            candidate_ms=shown.candidate_ms if shown else None, baseline_ms=shown.baseline_ms if shown else None,
            findings=self.findings, provenance=self.provenance(), utilisation=self.utilisation,
            timed_calls=self.timed_calls if shown else None, error=capped_error(stop.error) if stop else None,
        )  # fmt: skip

    def close(self) -> None:
        self.calls.close()
        shutil.rmtree(self.private, ignore_errors=True)
        self.pool.close()
        if self.candidate_socket is not None:
            self.candidate_socket.close()
            self.candidate_socket = None
        self.memory.release()
        release_cpus(self.cpus)
        self.cpus = ()

    def run(self) -> Verdict:
        stop: StopGradingError | None = None
        self.cpus = claim_cpus(self.threads)
        try:
            self.prepare()
            self.spawn_reference()
            loaded = self.start_reference()
            self.check_reference()
            self.start_candidate(loaded)
            loaded.clear()  # the parameters: the candidate has them now (`_sizing.supervisor_bytes`)
            self.check_correctness()
            if self.correct and self.options.measure_speed:
                self.measure()
        except StopGradingError as exc:
            stop = self.memory.blame(exc, self.calls.reference)
            self._add(stop.finding)
        finally:
            self.close()
        return self.verdict(stop)


def grade(
    problem_source: bytes,
    submission_source: bytes,
    options: GradeOptions | None = None,
    *,
    problem_name: str = "problem.py",
) -> Verdict:
    """Grades the submission ``submission_source`` against the problem ``problem_source``.

    Both are a file's bytes; ``problem_name`` names the problem in error messages.
    A verdict is returned for every outcome of the submission (crash, timeout,
    cheating included).

    Raises:
        TaskEnvironmentError: the problem is not in KernelBench format (a usage error,
            not a verdict).
    """
    for label, value in (
        ("problem_source", problem_source),
        ("submission_source", submission_source),
    ):
        if not isinstance(value, bytes):
            raise TypeError(f"grade() takes the {label} as bytes, not {type(value).__name__}")
    options = options or GradeOptions()
    try:
        return _Grading(problem_source, submission_source, options, problem_name).run()
    except (
        RestartGradingError
    ):  # the plan is known now (`TRUSTED.memory`): reserved whole this time
        logger.info("grading of %s starts again to wait for its measured memory", problem_name)
        return _Grading(
            problem_source, submission_source, options, problem_name, restarted=True
        ).run()


async def grade_async(
    problem_source: bytes,
    submission_source: bytes,
    options: GradeOptions | None = None,
    *,
    problem_name: str = "problem.py",
) -> Verdict:
    """`grade` on a worker thread, for event-loop callers such as the harness."""
    return await asyncio.to_thread(
        grade, problem_source, submission_source, options, problem_name=problem_name
    )

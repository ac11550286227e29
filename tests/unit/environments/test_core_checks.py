"""The grader's judgements on constructed measurements, table-driven with exact findings and
messages (honest work is never blocked), and the process-wide state and the timing pool's files.

No grading is built and no problem file written: the judgements are pure functions.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentinfra.environments import Finding
from agentinfra.environments.kernels._judgements import (
    CpuWindow,
    Refusal,
    SpeedupResult,
    StagingCpu,
    cap_refusal,
    interval_tight,
    judge_cores,
    judge_idle,
    judge_plausibility,
    judge_staging,
    judge_timing_disagreement,
    size_refusal,
    speedup_result,
)
from agentinfra.environments.kernels._problem import ProblemMeta
from agentinfra.environments.kernels._timing import Measurements
from agentinfra.environments.kernels._timing_pool import CANDIDATE, REFERENCE, TimingPool
from agentinfra.environments.kernels._verdict import Outcome, StopGradingError

EMPTY = [CpuWindow(0.0002, 0.0001, True)] * 7
GIB = 1 << 30
MIB = 1 << 20


def windows(*runs: tuple[int, float, float, bool]) -> list[CpuWindow]:
    """``(count, wall s, cpu s, precise)`` runs of identical windows."""
    return [
        CpuWindow(wall, cpu, precise) for count, wall, cpu, precise in runs for _ in range(count)
    ]


def cores(cores_used: str, threads: int, suffix: str, severity: str, cpu: str, wall: str,
          batches: int, over: int, allowed: str, ticks: int) -> Finding:  # fmt: skip
    return Finding(
        check="threads_processes", severity=severity,  # type: ignore[arg-type]
        message=f"the candidate used {cores_used} cores while timed; {threads} allotted{suffix}",
        evidence=f"cpu {cpu} s over wall {wall} s across {batches} batches, after subtracting an empty "
        f"batch's 0.10 ms cpu and 0.20 ms wall; {over} batches over {allowed} cores; {ticks} measured in clock ticks",
    )  # fmt: skip


TOO_LITTLE = " (too little timed work to judge: not counted)"
FEW = " (in a few batches only: not counted)"
TICKS = " (within clock-tick resolution: not counted)"


@pytest.mark.parametrize(
    ("threads", "timed", "expected"),
    [
        # 20 batches of 8 ms: 8.2 ms of CPU each, of which 0.1 ms is the empty batch's plumbing
        (1, windows((20, 0.0082, 0.0083, True)), None),
        (1, windows((20, 0.010, 0.030, True)),  # 3 cores in every batch
         cores("3.05", 1, "", "block", "0.598", "0.196", 20, 20, "1.75", 0)),
        (2, windows((20, 0.010, 0.030, True)), None),  # within 2 threads' allowance
        (1, windows((20, 0.002, 0.006, True)),  # 3 cores, but 40 ms in all
         cores("3.28", 1, TOO_LITTLE, "warn", "0.118", "0.036", 20, 0, "1.75", 0)),
        (1, windows((17, 0.010, 0.010, True), (3, 0.010, 0.200, True)),
         cores("3.92", 1, FEW, "warn", "0.768", "0.196", 20, 3, "1.75", 0)),
        # batches measured in 10 ms clock ticks (threads came and went): 20 ms too much is within resolution
        (1, windows((12, 0.010, 0.020, False)),
         cores("2.03", 1, TICKS, "warn", "0.239", "0.118", 12, 12, "1.75", 12)),
        (1, windows((12, 0.010, 0.040, False)),  # beyond the ticks' resolution
         cores("4.07", 1, "", "block", "0.479", "0.118", 12, 12, "1.75", 12)),
        (2, windows((12, 0.010, 0.040, False)),
         cores("4.07", 2, TICKS, "warn", "0.479", "0.118", 12, 12, "3.25", 12)),
        (1, [], None),
    ],
    ids=["honest", "3-cores", "3-cores-2-threads", "too-little", "few", "ticks", "ticks-over",
         "ticks-2-threads", "no-batches"],
)  # fmt: skip
def test_cores_used_while_timed(
    threads: int, timed: list[CpuWindow], expected: Finding | None
) -> None:
    assert judge_cores(EMPTY, timed, threads, 0.0002) == expected
    assert judge_cores([], timed, threads, 0.0002) is None  # nothing to subtract: not judged


def test_empty_batches_slowed_by_the_candidate_do_not_read_as_cores() -> None:
    """The overhead_inflation cheat sleeps 50 ms in each empty batch (CI saw it blocked at 3.80
    cores): only the reference's empty batch, and no more CPU than that wall, is subtracted."""
    sleeping = [CpuWindow(0.0505, 0.0003, True)] * 7
    timed = windows((6, 0.068, 0.067, True))  # one core, the batch's own work
    assert judge_cores(sleeping, timed, 1, 0.0005) is None
    # nor can CPU burnt in its empty batches hide three cores while timed
    burning = [CpuWindow(0.0005, 0.040, True)] * 7
    assert judge_cores(burning, windows((20, 0.010, 0.030, True)), 1, 0.0005) is not None


def idle(cores_used: str, threads: int, cpu: str, allowed: str) -> Finding:
    return Finding(
        check="threads_processes", severity="block",
        message=f"the candidate used {cores_used} cores while it had no call to run; {threads} allotted",
        evidence=f"cpu {cpu} s over wall 0.200 s across 20 batches, during the reference's timed batches; "
        f"20 batches over {allowed} cores; 0 measured in clock ticks",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("threads", "cpu_s", "expected"),
    [
        (1, 0.0001, None),  # waiting on its pipe
        (1, 0.0098, idle("0.98", 1, "0.196", "0.25")),  # burning a core while it has no call
        (1, 0.014, idle("1.40", 1, "0.280", "0.25")),
        (2, 0.0098, None),  # an OpenMP pool may spin: one more thread, one more core allowed
        (2, 0.014, idle("1.40", 2, "0.280", "1.25")),
    ],
)
def test_cpu_used_while_the_candidate_has_no_call(
    threads: int, cpu_s: float, expected: Finding | None
) -> None:
    assert judge_idle(windows((20, 0.010, cpu_s, True)), threads) == expected


def staging(excess_ms: str, timed_ms: str, over: int, suffix: str, severity: str) -> Finding:
    return Finding(
        check="staging", severity=severity,  # type: ignore[arg-type]
        message=f"the candidate used {excess_ms} ms more CPU than the reference staging the same 22 "
        f"batches of inputs (untimed), against {timed_ms} ms in its timed batches{suffix}",
        evidence=f"{over} of 22 batches over a tenth of the reference's staging and of their timed work plus 0.1 ms",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("candidate", "reference", "timed", "expected"),
    [
        # measured on honest submissions: the candidate's staging 0.99-1.04x the reference's;
        # here 6% over on 3 ms stagings and 8% (0.05 ms) over on small ones, with cheap timed work
        ([0.0032] * 22, [0.003] * 22, [0.0005] * 22, None),
        ([0.00065] * 22, [0.0006] * 22, [0.0005] * 22, None),
        # precompute_untimed's shape: 30 ms of work moved into each staging, 1.4 ms left timed
        ([0.0314] * 22, [0.0014] * 22, [0.0014] * 22, staging("660.0", "30.8", 22, "", "block")),
        ([0.002] * 19 + [0.050] * 3, [0.002] * 22, [0.010] * 22,
         staging("144.0", "220.0", 3, FEW, "warn")),
        ([], [], [], None),  # nothing staged
    ],
    ids=["honest-3ms", "honest-small", "precompute", "few", "none"],
)  # fmt: skip
def test_cpu_spent_staging_beyond_the_reference(
    candidate: list[float], reference: list[float], timed: list[float], expected: Finding | None
) -> None:
    measured = StagingCpu(reference_s=reference, candidate_s=candidate, candidate_batch_s=timed)
    assert judge_staging(measured) == expected


def meta(flops: float | None = None, bytes_: float | None = None) -> ProblemMeta:
    return ProblemMeta(path=Path("p.py"), sha256="0" * 64, flops=flops, bytes=bytes_)


def implausible(per_call_ms: str, floor_ms: str, peaks: dict[str, float]) -> Finding:
    return Finding(
        check="plausibility", severity="block", evidence=f"peaks {peaks}",
        message=f"{per_call_ms} ms per call is below the physical floor of {floor_ms} ms for this problem's work on this machine",
    )  # fmt: skip


PEAKS = {"flops_per_s": 1e9, "bytes_per_s": 1e9}


@pytest.mark.parametrize(
    ("problem", "peaks", "candidate_s", "expected"),
    [
        (meta(flops=2e9), PEAKS, 0.9, implausible("900.0000", "2000.0000", PEAKS)),
        (meta(flops=2e9), PEAKS, 1.0, None),  # exactly half the floor: the factor-2 margin
        (meta(bytes_=4e9), {**PEAKS, "bytes_per_s": 2e9}, 0.5,
         implausible("500.0000", "2000.0000", {**PEAKS, "bytes_per_s": 2e9})),
        (meta(flops=1e9, bytes_=3e9), PEAKS, 1.4, implausible("1400.0000", "3000.0000", PEAKS)),
        (meta(flops=2e9), {}, 0.001, None),  # no peaks measured: no floor
        (meta(), PEAKS, 1e-9, None),  # no work declared: no floor
    ],
    ids=["flops", "half", "bytes", "larger-of-both", "no-peaks", "no-work"],
)  # fmt: skip
def test_plausibility_against_the_physical_floor(
    problem: ProblemMeta, peaks: dict[str, float], candidate_s: float, expected: Finding | None
) -> None:
    assert judge_plausibility(problem, peaks, candidate_s) == expected


def test_a_loaded_machines_plumbing_never_makes_an_honest_candidate_implausible() -> None:
    """Seen in CI: three gradings on two cores. The median empty batch, measured before the
    pairs, took 5.7 ms; a cumsum's 16-call batches then took 0.4-0.9 ms, read as ~0 per call."""
    measured = Measurements(
        per_batch=16, entry_bytes=1, cand_times=[1e-9 / 16] * 5,
        cand_batch_s=[0.0009, 0.0004, 0.0006, 0.0005, 0.0007], quietest_empty_s=0.0001,
    )  # fmt: skip
    floor = meta(bytes_=262_144.0)  # 17.5 us at 15 GB/s, the CI machine's peak
    peaks = {"bytes_per_s": 1.5e10}
    assert judge_plausibility(floor, peaks, statistics.median(measured.cand_times)) is not None
    assert measured.candidate_s_at_least == pytest.approx((0.0006 - 0.0001) / 16)
    assert judge_plausibility(floor, peaks, measured.candidate_s_at_least) is None


def test_a_batch_that_returns_at_once_is_still_implausible() -> None:
    """Precomputed outputs: batches as quick as the quietest empty batch."""
    measured = Measurements(
        per_batch=16, entry_bytes=1, cand_batch_s=[0.00012, 0.00011, 0.00013],
        quietest_empty_s=0.0001,
    )  # fmt: skip
    assert measured.candidate_s_at_least == pytest.approx(0.00002 / 16)
    assert judge_plausibility(meta(bytes_=262_144.0), {"bytes_per_s": 1.5e10},
                              measured.candidate_s_at_least) is not None  # fmt: skip


@pytest.mark.parametrize(
    ("ref", "cand", "seed", "expected", "tight"),
    [
        ([0.002] * 6, [0.001] * 6, 0, SpeedupResult(baseline_ms=2.0, candidate_ms=1.0, speedup=2.0,
                                                     speedup_ci=(2.0, 2.0)), True),
        ([0.004, 0.0041, 0.0039, 0.0042, 0.0038, 0.004], [0.001, 0.0011, 0.0009, 0.001, 0.00105, 0.00095], 7,
         SpeedupResult(baseline_ms=4.0, candidate_ms=1.0, speedup=4.1,
                       speedup_ci=(3.7272727272727275, 4.271929824561403)), False),
    ],
    ids=["constant", "spread"],
)  # fmt: skip
def test_the_speedup_is_the_median_pair_ratio_with_a_bootstrap_interval(
    ref: list[float], cand: list[float], seed: int, expected: SpeedupResult, tight: bool
) -> None:
    result = speedup_result(ref, cand, random.Random(seed))
    assert result == expected
    assert result.speedup_ci[0] <= result.speedup <= result.speedup_ci[1]
    assert interval_tight(ref, cand, random.Random(seed)) is tight


CAP_KNOB = "(AGENTINFRA_GRADER_MEMORY, GradeOptions.memory_limit_bytes): raise or unset the cap, or shrink the problem's sizes"


@pytest.mark.parametrize(
    ("sizes", "cap", "expected"),
    [
        ({}, 4 * GIB, None),  # unknown sizes pass
        ({"params_bytes": "x"}, 4 * GIB, None),
        ({"params_bytes": MIB, "inputs_bytes": MIB, "output_bytes": MIB}, 4 * GIB, None),
        ({"params_bytes": 2 * GIB, "inputs_bytes": MIB, "output_bytes": MIB}, None, None),  # no cap: sized
        ({"params_bytes": 2 * GIB, "inputs_bytes": MIB, "output_bytes": MIB}, 4 * GIB, Refusal(
            "problem too large for the sandbox: the candidate needs at least 5.0 GiB (parameters 2.0 GiB, "
            "one input set 1.0 MiB, output 1.0 MiB; the parameters twice while it loads, 1.0 GiB for Python "
            f"and torch); its memory is capped at 4.0 GiB {CAP_KNOB}")),
        ({"inputs_bytes": 3 * GIB, "output_bytes": 2 * GIB}, None, Refusal(
            "problem too large for the grader's wire: one input set and its output are 5.0 GiB (parameters "
            "unknown, one input set 3.0 GiB, output 2.0 GiB), over the 4.0 GiB frame the reference sends them "
            "in: shrink the problem's sizes to grade it here")),
        ({"output_bytes": 5 * GIB}, None, Refusal(
            "problem output too large: 5.0 GiB per call, and the reference's self-check sends two in one "
            "frame, over the grader's 4.0 GiB (outputs are compared by the supervisor; parameters unknown, "
            "one input set unknown, output 5.0 GiB): shrink the problem's sizes to grade it here")),
        # KernelBench level2/2 (ConvTranspose2d, stride 2): 0.5 GiB in, 2 GiB out. Its self-check
        # once sent inputs and both outputs, 4.5 GiB, and the reference "died: exit status None"
        ({"inputs_bytes": GIB // 2, "output_bytes": 2 * GIB}, None, None),
        ({"inputs_bytes": GIB // 2, "output_bytes": 2 * GIB + 1}, None, Refusal(
            "problem output too large: 2.0 GiB per call, and the reference's self-check sends two in one "
            "frame, over the grader's 4.0 GiB (outputs are compared by the supervisor; parameters unknown, "
            "one input set 512.0 MiB, output 2.0 GiB): shrink the problem's sizes to grade it here")),
    ],
    ids=["unknown", "not-int", "fits", "no-cap", "over-cap", "wire", "output", "two-outputs-fit",
         "two-outputs-over"],
)  # fmt: skip
def test_a_problem_too_large_is_refused_with_its_sizes_and_the_knob(
    sizes: dict[str, object], cap: int | None, expected: Refusal | None
) -> None:
    assert size_refusal(sizes, memory_cap_bytes=cap, max_reply_bytes=4 * GIB) == expected


@pytest.mark.parametrize(
    ("limit", "cap", "expected"),
    [
        (5 * GIB, None, None),
        (4 * GIB, 4 * GIB, None),
        (5 * GIB, 4 * GIB, Refusal("problem too large for the sandbox under its cap: sized so; the "
                                   f"candidate's memory is capped at 4.0 GiB {CAP_KNOB}")),
    ],
)  # fmt: skip
def test_a_limit_sized_over_the_users_cap_is_refused_naming_the_knob(
    limit: int, cap: int | None, expected: Refusal | None
) -> None:
    assert cap_refusal(limit, "sized so", cap) == expected


@pytest.mark.parametrize(
    ("device_ms", "host_ms", "expected"),
    [
        (3.9, 4.0, None),
        (0.5, 4.0, Finding(check="timing_disagreement", severity="warn", evidence="batch of 8 calls",
                           message="CUDA events report 0.500 ms for a batch the supervisor's clock measured at 4.000 ms")),
        (0.1, 0.9, None),  # under a millisecond on the host clock: not judged
    ],
)  # fmt: skip
def test_cuda_events_against_the_host_clock(
    device_ms: float, host_ms: float, expected: Finding | None
) -> None:
    assert judge_timing_disagreement(device_ms, host_ms, 8) == expected


def test_candidate_uids_are_reserved_until_released() -> None:
    from agentinfra.environments.kernels._process_state import reserve_worker_uid

    held = [reserve_worker_uid() for _ in range(20)]
    uids = [uid for uid, _ in held]
    assert len(set(uids)) == 20  # never the same uid twice while held, whatever the seed
    for _, fd in held:
        os.close(fd)


def test_concurrent_gradings_are_pinned_to_different_cores() -> None:
    from agentinfra.environments.kernels._process_state import claim_cpus, release_cpus

    allowed = sorted(os.sched_getaffinity(0))
    first = claim_cpus(1)
    second = claim_cpus(1)
    try:
        assert first == (allowed[0],)
        if len(allowed) > 1:
            assert second == (allowed[1],), "a second live grading shares the first one's core"
    finally:
        release_cpus(second)
        release_cpus(first)
    again = claim_cpus(1)
    release_cpus(again)
    assert again == first, "a released core is not claimed again"


def test_gc_is_paused_until_the_last_timing_loop_ends() -> None:
    import gc

    from agentinfra.environments.kernels._process_state import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # a concurrent grading's loop
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()  # a caller that had it off keeps it off
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_workers_allocator_is_fixed_on_glibc() -> None:
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    code = (
        "from agentinfra.environments.kernels._worker import fix_allocator; print(fix_allocator())"
    )
    # in a child: the allocator's settings would otherwise stay with the test process
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "True"


_LARGE_BLOCK_FAULTS = """
import ctypes, resource, sys
from agentinfra.environments.kernels._worker import fix_allocator
assert fix_allocator()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 64 << 20  # over glibc's largest mmap threshold (32 MiB)
if sys.argv[1] == "grown":  # the reference's history: its heap grew before it was timed
    small = [libc.malloc(16 << 20) for _ in range(8)]
    for block in small:
        ctypes.memset(block, 1, 16 << 20)
    for block in small:
        libc.free(block)
faults = []
for _ in range(3):  # one call's temporary, three calls
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[1], faults[2])
"""


@pytest.mark.parametrize("history", ["fresh", "grown"])
def test_a_large_block_is_warm_from_its_second_use_whatever_ran_before(history: str) -> None:
    """level1/72's identity read 0.34x: its 216 MiB of temporaries a call came from fresh pages in
    the candidate (55,000 page faults a call) and from the reference's grown heap (none)."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    result = subprocess.run(
        [sys.executable, "-c", _LARGE_BLOCK_FAULTS, history],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    # 64 MiB from fresh pages is 16,384 faults; warm heap memory takes none
    assert [int(x) for x in result.stdout.split()] == [0, 0]


@pytest.mark.parametrize("copy_file_range", [True, False], ids=["copy_file_range", "read-write"])
def test_a_batch_file_is_a_sealed_copy_of_its_range(
    monkeypatch: pytest.MonkeyPatch, copy_file_range: bool
) -> None:
    import fcntl

    if not copy_file_range:

        def unsupported(*args: object) -> int:
            raise OSError(18, "Invalid cross-device link")

        monkeypatch.setattr(os, "copy_file_range", unsupported)
    pool = os.memfd_create("pool", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    data = os.urandom(3 * 4096 + 100)
    os.write(pool, data)
    files = TimingPool()
    try:
        batch = files.batch_file(pool, 4096, 2 * 4096 + 50)
        assert os.pread(batch, len(data), 0) == data[4096 : 3 * 4096 + 50]
        seals = fcntl.fcntl(batch, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_WRITE
        assert seals & fcntl.F_SEAL_SEAL
        with pytest.raises(PermissionError):
            os.pwrite(batch, b"x", 0)
        os.close(batch)
    finally:
        os.close(pool)
        files.close()


@pytest.fixture
def pool() -> Iterator[tuple[TimingPool, list[socket.socket]]]:
    """A timing pool with a fresh pool file, and the workers' ends of its descriptor sockets."""
    files = TimingPool()
    theirs = files.worker_sockets()
    files.create()
    yield files, theirs
    files.close()
    for sock in theirs:
        sock.close()


def test_a_pool_file_of_the_wrong_size_stops_grading(
    pool: tuple[TimingPool, list[socket.socket]],
) -> None:
    files, _ = pool
    assert files.pool is not None
    os.write(files.pool, b"x" * 100)
    with pytest.raises(StopGradingError) as stopped:
        files.seal_pool(99)
    assert (stopped.value.outcome, stopped.value.error) == (
        Outcome.GRADER_ERROR,
        "pool file holds 100 bytes, not 99",
    )


def test_each_side_is_sent_its_own_sealed_copy_of_a_staged_batch(
    pool: tuple[TimingPool, list[socket.socket]],
) -> None:
    files, theirs = pool
    assert files.pool is not None
    data = os.urandom(5000)
    os.write(files.pool, data)
    files.seal_pool(len(data))
    files.split([0, 3000], len(data), per_batch=4, size=6)
    assert files.stage(1, CANDIDATE) == {
        "op": "stage", "first": 4, "count": 2, "length": 2000, "base": 3000,
    }  # fmt: skip
    theirs[CANDIDATE].settimeout(5)
    _, staged, _, _ = socket.recv_fds(theirs[CANDIDATE], 16, 4)
    assert len(staged) == 1
    assert os.pread(staged[0], 5000, 0) == data[3000:]
    with pytest.raises(PermissionError):
        os.pwrite(staged[0], b"x", 0)
    os.close(staged[0])


def test_batch_starts_outside_the_pool_stop_grading(
    pool: tuple[TimingPool, list[socket.socket]],
) -> None:
    files, _ = pool
    assert files.pool is not None
    os.write(files.pool, b"x" * 100)
    files.seal_pool(100)
    with pytest.raises(StopGradingError) as stopped:
        files.split([0, 120], 100, per_batch=1, size=2)
    assert stopped.value.error == "reference pool's batch starts [0, 120] leave its 100 bytes"


def batch_files() -> set[int]:
    """This process's descriptors of batch copies (`TimingPool.batch_file`'s memfds)."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            if os.readlink(f"/proc/self/fd/{name}").startswith("/memfd:agentinfra-batch"):
                found.add(int(name))
    return found


def test_a_batchs_copies_are_made_as_each_side_stages_it_and_not_kept(
    pool: tuple[TimingPool, list[socket.socket]],
) -> None:
    """Each side gets its own file, made when it stages; once sent, only the worker holds it, so a
    grading never holds copies of the whole pool (`_sizing.supervisor_bytes` counts two batches)."""
    files, theirs = pool
    assert files.pool is not None
    data = os.urandom(5000)
    os.write(files.pool, data)
    files.seal_pool(len(data))
    theirs[REFERENCE].settimeout(5)
    _, (pool_file,), _, _ = socket.recv_fds(theirs[REFERENCE], 16, 4)  # `create` sent it the pool
    os.close(pool_file)
    files.split([0, 3000], len(data), per_batch=4, size=6)
    assert batch_files() == set()  # splitting copies nothing
    received = []
    for side in (REFERENCE, CANDIDATE):
        files.stage(0, side)
        theirs[side].settimeout(5)
        _, fds, _, _ = socket.recv_fds(theirs[side], 16, 4)
        received += fds
    assert len(received) == 2
    assert os.fstat(received[0]).st_ino != os.fstat(received[1]).st_ino  # a file per side
    # this process kept no copy: the received descriptors are the only batch files, and they read the batch
    assert batch_files() == set(received)
    for fd in received:
        assert os.pread(fd, 5000, 0) == data[:3000]
        os.close(fd)


@pytest.mark.parametrize("madvise", [True, False], ids=["MADV_POPULATE_READ", "one-byte-per-page"])
def test_staged_inputs_are_populated_before_they_are_timed(madvise: bool) -> None:
    """Every page of a staged batch is mapped before its calls run, with either way of doing it."""
    import ctypes
    import mmap

    from agentinfra.environments.kernels._worker import _populate

    class NoPopulateRead(mmap.mmap):  # a kernel before 5.14
        def madvise(self, *args: int) -> None:
            raise OSError(22, "Invalid argument")

    pages = 8
    fd = os.memfd_create("batch", os.MFD_CLOEXEC)
    os.write(fd, os.urandom(pages * mmap.PAGESIZE))
    kind = mmap.mmap if madvise else NoPopulateRead
    buffer = kind(
        fd, pages * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
    )
    os.close(fd)
    start = ctypes.addressof(ctypes.c_char.from_buffer(buffer))

    def resident_kib() -> int:
        lines = Path("/proc/self/smaps").read_text().splitlines()
        for index, line in enumerate(lines):
            if line.split()[0].split("-")[0] == f"{start:x}":
                return next(int(x.split()[1]) for x in lines[index:] if x.startswith("Rss:"))
        raise AssertionError("mapping not found")

    try:
        assert resident_kib() == 0
        _populate(buffer)
        assert resident_kib() == pages * mmap.PAGESIZE // 1024
    finally:
        buffer.close()


_ALIGNED_TEMPORARIES_FAULTS = """
import ctypes, resource
from agentinfra.environments.kernels._worker import fix_allocator
assert fix_allocator()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
faults = []
for _ in range(4):  # one call's temporaries, allocated as PyTorch allocates them, four calls
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = []
    for size in (1200 << 20, 1000 << 20):
        block = ctypes.c_void_p()
        assert libc.posix_memalign(ctypes.byref(block), 64, size) == 0
        ctypes.memset(block, 1, size)
        blocks.append(block)
        libc.malloc(100)  # a small allocation between them, held (a tensor's metadata)
    for block in blocks:
        libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults[1:])
"""


def test_aligned_temporaries_over_two_gib_are_warm_from_their_second_call() -> None:
    """level2/20's identity read 0.48-1.33x: its 2.1 GiB of temporaries a call were faulted in fresh
    on every call in one worker (524,256 faults) and not in the other. Without the workers'
    tunables, the alignment slivers put blocks above their old holes; with a trim threshold
    glibc could hold in an int (2 GiB), the freed heap was given back after every call."""
    import os
    import platform
    import subprocess
    import sys

    from agentinfra.environments.kernels._workers import GLIBC_TUNABLES

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt and its tunables are glibc's")
    result = subprocess.run(
        [sys.executable, "-c", _ALIGNED_TEMPORARIES_FAULTS],
        capture_output=True, text=True, check=True,
        env={**os.environ, "GLIBC_TUNABLES": GLIBC_TUNABLES},
    )  # fmt: skip
    assert [int(x) for x in result.stdout.split()] == [0, 0, 0]

"""The core-count, idle and staging checks on constructed measurements: honest work is never blocked."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentinfra.environments.kernels._grader import _Grading

ROOT = Path(__file__).resolve().parents[3]
EMPTY = [(0.0002, 0.0001, True)] * 7


@pytest.fixture
def grading() -> Iterator[_Grading]:
    from agentinfra.environments.kernels import GradeOptions

    problem = ROOT / "examples" / "kernels" / "problems" / "13_relu_scale.py"
    made = _Grading(
        problem, ROOT / "examples/kernels/submissions/13_relu_scale_inplace.py", GradeOptions()
    )
    yield made
    shutil.rmtree(made.private, ignore_errors=True)


def severities(grading: _Grading) -> list[str]:
    return [f.severity for f in grading.findings if f.check == "threads_processes"]


def test_one_busy_core_plus_plumbing_is_not_flagged(grading: _Grading) -> None:
    # 20 batches of 8 ms: 8.2 ms of CPU each, of which 0.1 ms is the empty batch's plumbing
    grading._check_cores(EMPTY, [(0.0082, 0.0083, True)] * 20)
    assert severities(grading) == []


def test_a_repeated_measurable_excess_blocks(grading: _Grading) -> None:
    grading._check_cores(EMPTY, [(0.010, 0.030, True)] * 20)  # 3 cores in every batch
    assert severities(grading) == ["block"]


def test_too_little_timed_work_is_never_blocked(grading: _Grading) -> None:
    grading._check_cores(EMPTY, [(0.002, 0.006, True)] * 20)  # 3 cores, but 40 ms in all
    assert severities(grading) == ["warn"]
    assert "too little timed work" in grading.findings[0].message


def test_an_excess_in_a_few_batches_only_warns(grading: _Grading) -> None:
    grading._check_cores(EMPTY, [(0.010, 0.010, True)] * 17 + [(0.010, 0.200, True)] * 3)
    assert severities(grading) == ["warn"]
    assert "a few batches only" in grading.findings[0].message


def test_tick_resolution_does_not_block(grading: _Grading) -> None:
    # batches measured in 10 ms clock ticks (threads came and went): 20 ms too much is within resolution
    grading._check_cores(EMPTY, [(0.010, 0.020, False)] * 12)
    assert severities(grading) != ["block"]


def test_an_idle_candidate_is_fine_and_a_busy_one_blocks(grading: _Grading) -> None:
    grading._check_idle([(0.010, 0.0001, True)] * 20)
    assert severities(grading) == []
    grading._check_idle([(0.010, 0.0098, True)] * 20)  # burning a core while it has no call
    assert severities(grading) == ["block"]


def staging_findings(
    grading: _Grading, candidate: list[float], reference: list[float], timed: list[float]
) -> list[str]:
    from agentinfra.environments.kernels._grader import _Staging

    grading._staging = _Staging(per_batch=8, size=8 * len(candidate))
    grading._staging.candidate_cpu.extend(candidate)
    grading._staging.reference_cpu.extend(reference)
    grading._staging.candidate_batch_cpu.extend(timed)
    grading._check_staging()
    return [f.severity for f in grading.findings if f.check == "staging"]


def test_honest_staging_is_never_flagged(grading: _Grading) -> None:
    # measured on honest submissions: the candidate's staging 0.99-1.04x the reference's;
    # here 6% over on 3 ms stagings and 8% (0.05 ms) over on small ones, with cheap timed work
    assert staging_findings(grading, [0.0032] * 22, [0.003] * 22, [0.0005] * 22) == []
    assert staging_findings(grading, [0.00065] * 22, [0.0006] * 22, [0.0005] * 22) == []


def test_outputs_computed_while_staging_block(grading: _Grading) -> None:
    # precompute_untimed's shape: 30 ms of work moved into each staging, 1.4 ms left timed
    assert staging_findings(grading, [0.0314] * 22, [0.0014] * 22, [0.0014] * 22) == ["block"]


def test_staging_work_in_a_few_batches_only_warns(grading: _Grading) -> None:
    candidate = [0.002] * 19 + [0.050] * 3
    assert staging_findings(grading, candidate, [0.002] * 22, [0.010] * 22) == ["warn"]


def test_candidate_uids_are_reserved_until_released() -> None:
    import os

    from agentinfra.environments.kernels._grader import _reserve_uid

    held = [_reserve_uid() for _ in range(20)]
    uids = [uid for uid, _ in held]
    assert len(set(uids)) == 20  # never the same uid twice while held, whatever the seed
    for _, fd in held:
        os.close(fd)


def test_concurrent_gradings_are_pinned_to_different_cores() -> None:
    from agentinfra.environments.kernels._grader import _claim_cpus, _release_cpus

    allowed = sorted(os.sched_getaffinity(0))
    first = _claim_cpus(1)
    second = _claim_cpus(1)
    try:
        assert first == (allowed[0],)
        if len(allowed) > 1:
            assert second == (allowed[1],), "a second live grading shares the first one's core"
    finally:
        _release_cpus(second)
        _release_cpus(first)
    again = _claim_cpus(1)
    _release_cpus(again)
    assert again == first, "a released core is not claimed again"


def test_gc_is_paused_until_the_last_timing_loop_ends() -> None:
    import gc

    from agentinfra.environments.kernels._grader import _gc_paused

    assert gc.isenabled()
    with _gc_paused():
        assert not gc.isenabled()
        with _gc_paused():  # a concurrent grading's loop
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()  # a caller that had it off keeps it off
    try:
        with _gc_paused():
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


@pytest.mark.parametrize("copy_file_range", [True, False], ids=["copy_file_range", "read-write"])
def test_a_batch_file_is_a_sealed_copy_of_its_range(
    grading: _Grading, monkeypatch: pytest.MonkeyPatch, copy_file_range: bool
) -> None:
    import fcntl

    if not copy_file_range:

        def unsupported(*args: object) -> int:
            raise OSError(18, "Invalid cross-device link")

        monkeypatch.setattr(os, "copy_file_range", unsupported)
    pool = os.memfd_create("pool", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    data = os.urandom(3 * 4096 + 100)
    os.write(pool, data)
    try:
        batch = grading._batch_file(pool, 4096, 2 * 4096 + 50)
        assert os.pread(batch, len(data), 0) == data[4096 : 3 * 4096 + 50]
        seals = fcntl.fcntl(batch, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_WRITE
        assert seals & fcntl.F_SEAL_SEAL
        with pytest.raises(PermissionError):
            os.pwrite(batch, b"x", 0)
    finally:
        os.close(pool)
        grading.close()


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

"""Starting, talking to and killing worker processes (reference and candidate).

Sandbox modes for the candidate, strongest first (`probe_sandbox_mode` picks):

- ``namespaces+uid`` (grader runs as root): new pid, network and mount
  namespaces via ``unshare``; private tmpfs ``/tmp``; the supervisor's files
  hidden; a fresh unprivileged uid per grading with RLIMIT_NPROC (which binds
  because the uid is not root), no capabilities, ``no_new_privs``.
- ``userns`` (non-root grader with unprivileged user namespaces): the same
  namespaces and mounts; the process keeps the caller's uid, so RLIMIT_NPROC
  counts that user's processes.
- ``rlimits-only`` (neither available): a new session with resource limits only.
  It cannot stop the candidate from signalling or reading the supervisor; the
  verdict carries a warning finding saying so.

In every mode the candidate gets a scrubbed environment, a private working
directory, address-space, CPU-time and file-size limits, a wall-clock deadline
enforced by the supervisor, and every process it started is killed when its
grading ends (the pid namespace dies with its init; in ``rlimits-only`` the
process group is killed).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agentinfra.environments.kernels._wire import (
    Frame,
    TensorBytes,
    WireError,
    encode_frame,
    read_frame,
)

__all__ = [
    "CpuSample",
    "SandboxMode",
    "WorkerDiedError",
    "WorkerProcess",
    "WorkerTimeoutError",
    "probe_sandbox_mode",
]

SandboxMode = Literal["namespaces+uid", "userns", "rlimits-only", "none"]
_MAX_REPLY = 4 << 30


class WorkerTimeoutError(Exception):
    """The worker did not answer before its deadline."""


class WorkerDiedError(Exception):
    """The worker exited or broke the protocol; ``returncode`` says how it ended."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


_PROBED: dict[str, SandboxMode] = {}


def probe_sandbox_mode() -> SandboxMode:
    """The strongest sandbox mode this machine allows (probed once per process)."""
    if "mode" in _PROBED:
        return _PROBED["mode"]
    mode: SandboxMode = "rlimits-only"
    if shutil.which("unshare") and shutil.which("setpriv"):
        flags = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        probe = subprocess.run(
            ["unshare", *flags, "--pid", "--fork", "--net", "--mount", "--mount-proc", "--propagation", "private",
             "mount", "-t", "tmpfs", "tmpfs", "/mnt"],
            capture_output=True, check=False, timeout=30,
        )  # fmt: skip
        if probe.returncode == 0:
            mode = "namespaces+uid" if os.geteuid() == 0 else "userns"
    _PROBED["mode"] = mode
    return mode


class _DeadlineReader:
    """File-like ``read(n)`` over a pipe fd that raises `WorkerTimeoutError` past a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.deadline = float("inf")

    def read(self, count: int) -> bytes:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WorkerTimeoutError("deadline passed")
        ready, _, _ = select.select([self.fd], [], [], None if left == float("inf") else left)
        if not ready:
            raise WorkerTimeoutError("deadline passed")
        return os.read(self.fd, min(count, 1 << 22))


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxLimits:
    """Limits for one candidate process tree."""

    memory_limit_bytes: int
    max_processes: int
    cpu_limit_s: int
    threads: int
    cpus: tuple[int, ...]


def _needed_paths() -> list[str]:
    """What the worker reads: the interpreter, its prefixes, site-packages and agentinfra itself."""
    import site

    import agentinfra

    paths = {os.path.realpath(sys.executable), sys.base_prefix, sys.prefix}
    paths.update(os.path.realpath(p) for p in site.getsitepackages() if os.path.isdir(p))
    paths.add(os.path.realpath(Path(agentinfra.__file__).parent.parent))
    return sorted(os.path.realpath(p) for p in paths)


def _scrubbed_env(threads: int, home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
    }


class WorkerProcess:
    """One worker, reference or candidate, driven with blocking frames and deadlines."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        to_worker: int,
        from_worker: int,
        mode: SandboxMode,
        uid: int | None,
        stderr_path: Path,
    ) -> None:
        self.process = process
        self._to = to_worker
        self._reader = _DeadlineReader(from_worker)
        self.mode = mode
        self.uid = uid
        self.stderr_path = stderr_path

    @classmethod
    def start(
        cls,
        *,
        workdir: Path,
        sandboxed: bool,
        limits: SandboxLimits,
        submission: Path | None = None,
        uid: int | None = None,
        hide: tuple[Path, ...] = (),
    ) -> WorkerProcess:
        """Starts a worker; ``sandboxed`` puts it in the candidate jail with ``submission``."""
        to_read, to_write = os.pipe()
        from_read, from_write = os.pipe()
        worker = [
            sys.executable,
            "-I",
            "-m",
            "agentinfra.environments.kernels._worker",
            str(to_read),
            str(from_write),
        ]
        mode: SandboxMode = probe_sandbox_mode() if sandboxed else "none"
        stderr_path = workdir / ("candidate.stderr" if sandboxed else "reference.stderr")
        env = _scrubbed_env(
            limits.threads, "/tmp/work" if mode in ("namespaces+uid", "userns") else str(workdir)
        )
        if mode in ("namespaces+uid", "userns"):
            config = {
                "uid": uid if mode == "namespaces+uid" and uid is not None else 0,
                "submission": str(submission),
                "needed_paths": _needed_paths(),
                "hide_paths": [str(p) for p in hide],
                "memory_limit_bytes": limits.memory_limit_bytes,
                "max_processes": limits.max_processes,
                "cpu_limit_s": limits.cpu_limit_s,
                "cpus": list(limits.cpus),
                "env": env,
            }
            flags = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
            command = ["unshare", *flags, "--pid", "--fork", "--kill-child", "--net", "--mount", "--mount-proc",
                       "--propagation", "private", sys.executable, "-I", "-m", "agentinfra.environments.kernels._jail",
                       json.dumps(config), "--", *worker]  # fmt: skip
            preexec = None
        elif mode == "rlimits-only":
            command = worker
            preexec = _rlimits_preexec(limits)
        else:
            command = worker
            preexec = _affinity_preexec(limits.cpus)
        with open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, pass_fds=(to_read, from_write),
                cwd=str(workdir), env=env if mode != "none" else {**env, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                preexec_fn=preexec, start_new_session=True,
            )  # fmt: skip
        os.close(to_read)
        os.close(from_write)
        return cls(process, to_write, from_read, mode, uid, stderr_path)

    def request(
        self,
        header: dict[str, object],
        tensors: list[TensorBytes] | None = None,
        *,
        timeout_s: float,
    ) -> Frame:
        """Sends one command and waits for its answer.

        Raises:
            WorkerTimeoutError: no answer before ``timeout_s``.
            WorkerDiedError: the worker exited or sent a malformed frame.
        """
        self.send(header, tensors)
        return self.receive(timeout_s=timeout_s)

    def send(self, header: dict[str, object], tensors: list[TensorBytes] | None = None) -> None:
        data = memoryview(encode_frame(header, tensors))
        try:
            while data:
                written = os.write(self._to, data[: 1 << 22])
                data = data[written:]
        except (BrokenPipeError, OSError) as exc:
            raise WorkerDiedError(f"worker pipe closed ({exc})", self.process.poll()) from None

    def receive(self, *, timeout_s: float) -> Frame:
        self._reader.deadline = time.monotonic() + timeout_s
        try:
            return read_frame(self._reader, max_payload_bytes=_MAX_REPLY)  # type: ignore[arg-type]
        except WireError as exc:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=2)
            raise WorkerDiedError(str(exc), self.process.poll()) from None

    def stderr_tail(self, limit: int = 1500) -> str:
        try:
            data = self.stderr_path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode(errors="replace")

    def cpu_sample(self) -> CpuSample:
        """The process tree's CPU time, two ways (see `CpuSample`)."""
        coarse = precise = 0.0
        threads: set[tuple[int, int]] = set()
        for pid in _descendants(self.process.pid):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            # utime + stime (exited threads included) + cutime + cstime (reaped children)
            coarse += sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICK
            for tid in tids:
                with contextlib.suppress(OSError, ValueError, IndexError):
                    precise += (
                        int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
                    )
                    threads.add((pid, int(tid)))
        return CpuSample(coarse, precise, frozenset(threads))

    def kill(self) -> None:
        """Kills the worker and everything it started; reaps it."""
        for pid in reversed(_descendants(self.process.pid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        if self.uid is not None and self.mode == "namespaces+uid":
            deadline = time.monotonic() + 10
            while _kill_uid(self.uid) and time.monotonic() < deadline:
                time.sleep(0.01)
        for fd in (self._to, self._reader.fd):
            with contextlib.suppress(OSError):
                os.close(fd)


_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class CpuSample:
    """CPU time of a process tree at one instant.

    ``coarse_s`` comes from ``/proc/PID/stat`` in clock ticks (10 ms): it includes
    threads that have exited and reaped children. ``precise_s`` sums each live
    thread's ``schedstat`` run time in nanoseconds: exact, but a thread that exits
    takes its time with it, so it is only valid between two samples with the same
    ``threads``.
    """

    coarse_s: float
    precise_s: float
    threads: frozenset[tuple[int, int]]

    def since(self, before: CpuSample) -> tuple[float, bool]:
        """CPU seconds between ``before`` and this sample, and whether the figure is precise."""
        if self.threads == before.threads and self.precise_s > 0:
            return self.precise_s - before.precise_s, True
        return self.coarse_s - before.coarse_s, False


def _descendants(root: int) -> list[int]:
    found = [root]
    index = 0
    while index < len(found):
        pid = found[index]
        index += 1
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    found.extend(
                        int(c)
                        for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                    )
        except OSError:
            continue
    return found


def _kill_uid(uid: int) -> int:
    """SIGKILLs every process of ``uid``; returns how many were still there (zombies included)."""
    left = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    left += 1
                    os.kill(int(entry), signal.SIGKILL)
    return left


def _affinity_preexec(cpus: tuple[int, ...]):  # type: ignore[no-untyped-def]
    def apply() -> None:
        os.sched_setaffinity(0, cpus)

    return apply


def _rlimits_preexec(limits: SandboxLimits):  # type: ignore[no-untyped-def]
    import resource

    def apply() -> None:
        os.sched_setaffinity(0, limits.cpus)
        resource.setrlimit(
            resource.RLIMIT_AS, (limits.memory_limit_bytes, limits.memory_limit_bytes)
        )
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_limit_s, limits.cpu_limit_s + 5))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply

"""The worker client: starting, talking to and killing worker processes (reference and candidate).

Each worker is an `agentinfra.sandbox.JailedProcess` (the one channel to a jailed
process: its pipes, deadlines, stderr, process tree and end); this module adds
the worker's jail, its framing (`_wire` frames over the channel) and its
measurements (CPU time, peak address space of its process tree).

Sandbox modes, strongest first (`agentinfra.sandbox.probe_sandbox_mode` picks):

- ``namespaces+uid`` (grader runs as root): each worker runs in an
  `agentinfra.sandbox` jail: a fresh minimal root (the interpreter, the standard
  library, torch, numpy, xxhash and what they declare they need, the system
  libraries, and the two worker modules; nothing else of the host), private pid,
  network and mount namespaces, a fresh unprivileged uid per worker with
  RLIMIT_NPROC (which binds because the uid is not root), no capabilities,
  ``no_new_privs``.
- ``userns`` (non-root grader with unprivileged user namespaces): the same jail;
  the process keeps the caller's uid, so RLIMIT_NPROC counts that user's processes.
- ``rlimits-only`` (neither available): the candidate gets a new session with
  resource limits only, and the reference runs unconfined. It cannot stop the
  candidate from signalling or reading the supervisor; the verdict carries a
  warning finding saying so.

In every mode the candidate gets a scrubbed environment, a private working
directory, address-space, CPU-time and file-size limits, a wall-clock deadline
enforced by the supervisor, and every process it started is killed when its
grading ends (the pid namespace dies with its init; in ``rlimits-only`` the
process group is killed).

Inside a jail the worker is not started as ``-m agentinfra...`` (that would need
agentinfra's whole package and its dependencies in the jail): ``_worker.py`` and
``_wire.py`` are bound read-only into a package skeleton under
``/opt/agentinfra-sandbox`` and run from there.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agentinfra.environments.kernels._wire import (
    Frame,
    TensorBytes,
    WireError,
    frame_parts,
    read_frame,
)
from agentinfra.errors import ChannelClosedError, ChannelTimeoutError, ForkServerError
from agentinfra.sandbox import (
    ForkedProcess,
    ForkServer,
    JailedProcess,
    JailLimits,
    JailSpec,
    SandboxMode,
    probe_sandbox_mode,
    python_runtime_paths,
    system_library_paths,
)

__all__ = [
    "CpuSample",
    "ForkServerError",
    "SandboxLimits",
    "WorkerDiedError",
    "WorkerProcess",
    "WorkerTimeoutError",
    "worker_fork_server",
    "worker_jail",
]

MAX_REPLY_BYTES = 4 << 30
"""The largest frame the supervisor reads from a worker."""


class WorkerTimeoutError(Exception):
    """The worker did not answer before its deadline."""


class WorkerDiedError(Exception):
    """The worker exited or broke the protocol; ``returncode`` says how it ended."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxLimits:
    """Limits for one candidate process tree."""

    memory_limit_bytes: int
    """``RLIMIT_AS``: sized per problem by the grader (`_sizing.memory_plan`)."""
    max_processes: int
    cpu_limit_s: int
    threads: int
    cpus: tuple[int, ...]


WORKER_DISTRIBUTIONS = ("torch", "numpy", "xxhash")
"""What the worker imports; the jail holds these and their declared dependencies."""
JAILED_WORKDIR = "/tmp/work"
_RUNTIME_ROOT = "/opt/agentinfra-sandbox"
_WORKER_MODULE = "agentinfra.environments.kernels._worker"
_BOOT = (
    f"import runpy, sys; sys.path.insert(0, {_RUNTIME_ROOT!r}); "
    f"runpy.run_module({_WORKER_MODULE!r}, run_name='__main__', alter_sys=True)"
)


def worker_jail(
    *,
    argv_tail: tuple[str, ...],
    env: dict[str, str],
    uid: int,
    program: Path,
    limits: SandboxLimits | None,
    cpus: tuple[int, ...],
    device: str,
) -> JailSpec:
    """The jail a worker runs in: the worker modules, the Python runtime, ``program`` in its workdir."""
    here = Path(__file__).resolve().parent
    package = f"{_RUNTIME_ROOT}/agentinfra/environments/kernels"
    binds = tuple((str(here / name), f"{package}/{name}") for name in ("_worker.py", "_wire.py"))
    skeleton = ("agentinfra", "agentinfra/environments", "agentinfra/environments/kernels")
    files = tuple((f"{_RUNTIME_ROOT}/{folder}/__init__.py", "") for folder in skeleton)
    return JailSpec(
        argv=(sys.executable, "-I", "-c", _BOOT, *argv_tail),
        env=env,
        uid=uid,
        ro_paths=python_runtime_paths(WORKER_DISTRIBUTIONS) + system_library_paths(),
        binds=binds,
        files=files,
        copy_in=((str(program), program.name),),
        devices=_cuda_devices() if device == "cuda" else (),
        sys_paths=_sys_paths(device),
        workdir=JAILED_WORKDIR,
        cpus=cpus,
        limits=None if limits is None else JailLimits(
            memory_limit_bytes=limits.memory_limit_bytes, max_processes=limits.max_processes,
            cpu_limit_s=limits.cpu_limit_s,
        ),
    )  # fmt: skip


def _cuda_devices() -> tuple[str, ...]:
    """The NVIDIA device nodes a CUDA worker opens (``/dev/nvidia*``, the uvm and caps nodes)."""
    found = [str(p) for p in sorted(Path("/dev").glob("nvidia*")) if not p.is_dir()]
    caps = Path("/dev/nvidia-caps")
    found += [str(p) for p in sorted(caps.glob("*"))] if caps.is_dir() else []
    return tuple(found)


def _sys_paths(device: str) -> tuple[str, ...]:
    """The parts of ``/sys`` a worker reads.

    None on x86-64 CPUs (torch needs none there); the CPU topology elsewhere
    (cpuinfo reads it on ARM); all of ``/sys`` read-only for CUDA (the driver and
    NVML walk the PCI tree).
    """
    if device == "cuda":
        return ("/sys",)
    if platform.machine() not in ("x86_64", "AMD64"):
        return ("/sys/devices/system/cpu",)
    return ()


GLIBC_TUNABLES = "glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0"
"""No per-thread cache and no fast bins in a worker's allocator, read when it starts.

PyTorch allocates CPU tensors with ``posix_memalign(64)``, and glibc frees the few dozen
bytes it carved to align a block into its thread cache or a fast bin, which are never
merged with their neighbours. Such a sliver then sat between a freed temporary and the
rest of the free heap, and the next call's request for the same size (plus the alignment
slack) no longer fitted in the hole: it came from fresh pages above, faulted in and zeroed
on every call. KernelBench's ``level2/20`` did that with 2 GiB of temporaries in one
worker and not the other, and its identity read 0.48-1.33x. With both turned off a freed
block merges at once, so a call reuses the same warm memory, on both sides. The heap's
never being trimmed (`_worker.fix_allocator`) is the other half; decision 0034 has the
measurements.
"""


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
        "GLIBC_TUNABLES": GLIBC_TUNABLES,
    }


_FORK_SERVERS: dict[tuple[int, str], ForkServer] = {}
_FORK_SERVERS_LOCK = threading.Lock()


def worker_fork_server(threads: int) -> ForkServer:
    """The process-wide fork server for CPU workers with ``threads`` torch threads (started lazily).

    Its zygote imports what every worker imports (torch, ``torch.distributions``,
    which the size estimate reads, numpy, xxhash and the two worker modules) and
    runs one computation on torch's meta device (`_worker.warm_up`), with the
    worker's scrubbed environment, once per supervisor process; each worker
    is then a fork into a fresh jail (`agentinfra.sandbox.ForkServer`).
    """
    key = (threads, sys.executable)
    with _FORK_SERVERS_LOCK:
        server = _FORK_SERVERS.get(key)
        if server is None:
            here = Path(__file__).resolve().parent
            package = "agentinfra.environments.kernels"
            log = (
                Path(tempfile.gettempdir())
                / f"agentinfra-forkserver-{os.getuid()}-{os.getpid()}-{threads}.log"
            )
            server = ForkServer(
                preload=(("torch", ""), ("torch.distributions", ""), ("numpy", ""), ("xxhash", ""),
                         (f"{package}._wire", str(here / "_wire.py")),
                         (f"{package}._worker", str(here / "_worker.py")), (f"{package}._worker:warm_up", "")),
                target=f"{package}._worker:serve", env=_scrubbed_env(threads, JAILED_WORKDIR), log_path=log,
            )  # fmt: skip
            _FORK_SERVERS[key] = server
    return server


@atexit.register
def _close_fork_servers() -> None:
    for server in list(_FORK_SERVERS.values()):
        with contextlib.suppress(Exception):
            server.close()


class WorkerProcess:
    """One worker, reference or candidate, driven with blocking frames and deadlines."""

    def __init__(self, channel: JailedProcess) -> None:
        self.channel = channel

    @property
    def process(self) -> subprocess.Popen[bytes] | ForkedProcess:
        return self.channel.process

    @property
    def mode(self) -> SandboxMode:
        return self.channel.mode

    @property
    def uid(self) -> int | None:
        return self.channel.uid

    @property
    def stderr_path(self) -> Path:
        return self.channel.stderr_path

    @classmethod
    def start(
        cls,
        *,
        workdir: Path,
        role: Literal["reference", "candidate"],
        limits: SandboxLimits,
        program: Path,
        uid: int | None = None,
        device: str = "cpu",
        fork_server: ForkServer | None = None,
        fd_socket: int | None = None,
    ) -> WorkerProcess:
        """Starts a worker for ``role``, with ``program`` (problem or submission) in its workdir.

        Where namespaces work, both roles run in a jail (`worker_jail`); the
        candidate with ``limits``, the reference without. Otherwise the candidate
        gets resource limits only and the reference runs as a plain process.
        With ``fork_server`` (a CPU jail) the worker is forked into its jail with
        torch already imported instead of started as a new interpreter.
        ``fd_socket`` (a Unix socket that later carries the timing inputs' file)
        is passed on as the worker's third descriptor.

        Raises:
            ForkServerError: ``fork_server`` could not start the worker.
        """
        probed = probe_sandbox_mode()
        jailed = probed in ("namespaces+uid", "userns")
        mode: SandboxMode = probed if jailed or role == "candidate" else "none"
        env = _scrubbed_env(limits.threads, JAILED_WORKDIR if jailed else str(workdir))
        if not jailed:
            shutil.copyfile(program, workdir / program.name)

        def spawn(child: tuple[int, int], stderr: int) -> subprocess.Popen[bytes] | ForkedProcess:
            passed = child if fd_socket is None else (*child, fd_socket)
            fds = tuple(str(fd) for fd in passed)
            if jailed:
                jail = worker_jail(
                    argv_tail=fds, env=env, uid=uid if uid is not None else 0, program=program,
                    limits=limits if role == "candidate" else None, cpus=limits.cpus, device=device,
                )  # fmt: skip
                if fork_server is not None:
                    return fork_server.spawn(
                        config=jail.config(mode), mode=mode, fds=passed, stderr_fd=stderr
                    )
                return _popen(jail.command(mode), passed, stderr, workdir, env, None)
            command = [sys.executable, "-I", "-m", _WORKER_MODULE, *fds]
            if role == "candidate":
                return _popen(command, passed, stderr, workdir, env, _rlimits_preexec(limits))
            env_path = {**env, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            return _popen(
                command, passed, stderr, workdir, env_path, _affinity_preexec(limits.cpus)
            )

        channel = JailedProcess.start(
            spawn, mode=mode, uid=uid, stderr_path=workdir / f"{role}.stderr"
        )
        return cls(channel)

    def program_path(self, program: Path) -> str:
        """Where the worker finds ``program`` (``/tmp/work/NAME`` inside a jail, else its workdir)."""
        folder = JAILED_WORKDIR if self.channel.is_jailed else str(self.stderr_path.parent)
        return f"{folder}/{program.name}"

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
        try:
            for part in frame_parts(header, tensors):  # inputs forwarded as they are, uncopied
                self.channel.send(part)
        except ChannelClosedError as exc:
            raise WorkerDiedError(f"worker pipe closed ({exc})", self.process.poll()) from None

    def receive(self, *, timeout_s: float) -> Frame:
        reader = self.channel.reader(time.monotonic() + timeout_s)
        try:
            return read_frame(reader, max_payload_bytes=MAX_REPLY_BYTES)  # type: ignore[arg-type]
        except ChannelTimeoutError as exc:
            raise WorkerTimeoutError(str(exc)) from None
        except WireError as exc:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=2)
            raise WorkerDiedError(str(exc), self.process.poll()) from None

    def stderr_tail(self, limit: int = 1500) -> str:
        return self.channel.stderr_tail(limit)

    def cpu_sample(self) -> CpuSample:
        """The process tree's CPU time, two ways (see `CpuSample`)."""
        coarse = precise = 0.0
        threads: set[tuple[int, int]] = set()
        for pid in self.channel.descendants():
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

    def minor_faults(self) -> int:
        """Page faults without I/O taken so far by the process tree (``minflt`` in ``stat``)."""
        total = 0
        for pid in self.channel.descendants():
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])
        return total

    def peak_address_space(self) -> int | None:
        """The largest ``VmPeak`` (peak virtual memory, what ``RLIMIT_AS`` limits) in the process tree."""
        return self._largest("VmPeak:")

    def peak_resident(self) -> int | None:
        """The largest ``VmHWM`` (peak resident memory, what the machine gives) in the process tree."""
        return self._largest("VmHWM:")

    def _largest(self, field: str) -> int | None:
        peaks = []
        for pid in self.channel.descendants():
            with contextlib.suppress(OSError, ValueError, IndexError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith(field):
                        peaks.append(int(line.split()[1]) * 1024)
        return max(peaks, default=None)

    def kill(self) -> None:
        """Kills the worker and everything it started; reaps it; sweeps its uid (`JailedProcess.kill`)."""
        self.channel.kill(grace_s=_WORKER_GRACE_S)


_WORKER_GRACE_S = 2.0
"""How long a worker jail's ``unshare`` gets to reap the jail's pid 1 before its session is killed."""


def _popen(
    command: list[str],
    fds: tuple[int, ...],
    stderr: int,
    workdir: Path,
    env: dict[str, str],
    preexec: Callable[[], None] | None,
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, pass_fds=fds,
        cwd=str(workdir), env=env, preexec_fn=preexec, start_new_session=True,
    )  # fmt: skip


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


def _affinity_preexec(cpus: tuple[int, ...]) -> Callable[[], None]:
    def apply() -> None:
        os.sched_setaffinity(0, cpus)

    return apply


def _rlimits_preexec(limits: SandboxLimits) -> Callable[[], None]:
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

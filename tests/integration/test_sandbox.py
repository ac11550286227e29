"""The jail (`agentinfra.sandbox`): a minimal root, no capabilities, nothing of the host outside the allowlist.

Real namespaces and real mounts; each jail here runs a short Python program
that reports what it can see as JSON on stdout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentinfra.errors import ChannelClosedError, ChannelTimeoutError, ForkServerError
from agentinfra.sandbox import (
    UID_RANGE,
    ForkServer,
    JailedProcess,
    JailLimits,
    JailSpec,
    kill_uid,
    pids_by_uid,
    probe_sandbox_mode,
    python_runtime_paths,
    reserve_uid,
    system_library_paths,
    uid_is_orphaned,
)

ROOT = Path(__file__).resolve().parents[2]
MODE = probe_sandbox_mode()
pytestmark = pytest.mark.skipif(
    MODE not in ("namespaces+uid", "userns"), reason="no namespaces on this machine"
)
RUNTIME = python_runtime_paths(("xxhash",)) + system_library_paths()

REPORT = """
import json, os, socket, sys
secrets_ = json.loads(sys.argv[1])
readable = []
for path in secrets_:
    try:
        with open(path, 'rb') as handle:
            handle.read(1)
        readable.append(path)
    except OSError:
        pass
status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines() if ':' in line)
def writable(path):
    try:
        with open(path, 'w') as handle:
            handle.write('x')
        return True
    except OSError:
        return False
try:
    socket.create_connection(('127.0.0.1', int(sys.argv[2])), timeout=2).close()
    network = True
except OSError:
    network = False
print(json.dumps({
    'root': sorted(os.listdir('/')), 'etc': sorted(os.listdir('/etc')), 'dev': sorted(os.listdir('/dev')),
    'readable': readable, 'uid': os.getuid(), 'gid': os.getgid(), 'groups': os.getgroups(),
    'cap_eff': status['CapEff'].strip(), 'cap_bnd': status['CapBnd'].strip(), 'cap_inh': status['CapInh'].strip(),
    'no_new_privs': status['NoNewPrivs'].strip(), 'cwd': os.getcwd(),
    'copied': open('given.txt').read(), 'copied_owner': os.stat('given.txt').st_uid,
    'write_tmp': writable('/tmp/work/out.txt'), 'write_root': writable('/new.txt'),
    'write_runtime': writable(sys.executable + '.new'), 'network': network,
    'pids': sorted(int(p) for p in os.listdir('/proc') if p.isdigit()),
    'limits': open('/proc/self/limits').read(),
    'files': open('/opt/tool/generated.txt').read(),
    'allowed_under_tmp': open(sys.argv[3]).read(),
    'fds': sorted(int(fd) for fd in os.listdir('/proc/self/fd')),
}))
"""


@pytest.fixture
def uid() -> Iterator[int]:
    """A uid reserved machine-wide for the test (`reserve_uid`, as the grader and desktop do), swept after."""
    reserved, lock = reserve_uid()
    assert UID_RANGE[0] <= reserved < UID_RANGE[1]
    try:
        yield reserved
    finally:
        kill_uid(reserved)
        os.close(lock)


NON_DUMPABLE = (
    "import ctypes; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); print('hidden', flush=True); input()"
)
"""A process that makes itself non-dumpable (PR_SET_DUMPABLE = 4), as the desktop's controller does."""


def _non_dumpable(uid: int) -> subprocess.Popen[str]:
    child = subprocess.Popen(["/usr/bin/python3", "-c", NON_DUMPABLE], user=uid, group=uid, extra_groups=[],
                             cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout is not None
    assert child.stdout.readline() == "hidden\n"
    # The files under a non-dumpable process's /proc entry read as root's; only the
    # directory itself keeps the effective uid. The walk reads the Uid: line instead.
    assert os.stat(f"/proc/{child.pid}/status").st_uid == 0
    return child


def _reap(child: subprocess.Popen[str]) -> None:
    child.kill()
    child.communicate()


def test_a_non_dumpable_process_is_still_its_uids_and_is_killed(uid: int) -> None:
    child = _non_dumpable(uid)
    try:
        assert child.pid in pids_by_uid()[uid]  # so reserve_uid will not hand this uid out
        assert not uid_is_orphaned(uid)  # the fixture holds the reservation
        assert kill_uid(uid) == 1
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        _reap(child)


def test_a_non_dumpable_orphan_is_swept_after_its_owner_died() -> None:
    from agentinfra.rollouts import sweep_orphaned_jails

    reserved, lock = reserve_uid()
    child = _non_dumpable(reserved)
    try:
        os.close(lock)  # the owner dies: its flock goes with it
        assert uid_is_orphaned(reserved)
        assert reserved in sweep_orphaned_jails()
        assert child.wait(timeout=10) == -signal.SIGKILL
        assert reserved not in pids_by_uid()
    finally:
        _reap(child)


@pytest.fixture
def planted() -> Iterator[list[Path]]:
    """Secret files where a grading host keeps them: the checkout, another run, a home, /srv, /mnt."""
    token = secrets.token_hex(4)
    folders = [
        ROOT / "runs" / f"jail-test-{token}" / "submissions",
        ROOT / "runs" / f"jail-test-{token}" / "evaluations",
        Path("/home") / f"jail-test-{token}",
        Path("/srv") / f"jail-test-{token}",
        Path("/mnt") / f"jail-test-{token}",
        Path("/opt") / f"jail-test-{token}",
    ]
    files = [ROOT / "pyproject.toml", Path(sys.prefix) / "bin" / "pip"]
    for folder in folders:
        folder.mkdir(parents=True)
        (folder / "secret.txt").write_text("secret")
        files.append(folder / "secret.txt")
    try:
        yield files
    finally:
        shutil.rmtree(ROOT / "runs" / f"jail-test-{token}", ignore_errors=True)
        for folder in folders[2:]:
            shutil.rmtree(folder, ignore_errors=True)


FORK_TARGET = """
import json, sys
def main():
    sys.argv = ['probe', *json.load(open('/opt/tool/args.json'))]
    exec(compile(REPORT, 'probe', 'exec'), {'__name__': '__main__'})
"""


def _fork_launch(tmp_path: Path, spec: JailSpec) -> subprocess.CompletedProcess[str]:
    """The same jail forked by a `ForkServer` whose target runs `REPORT` (argv from a generated file)."""
    module = tmp_path / "jailprobe.py"
    module.write_text(f"REPORT = {REPORT!r}\n{FORK_TARGET}")
    args = ("/opt/tool/args.json", json.dumps(list(spec.argv[4:])))  # after python -I -c REPORT
    spec = dataclasses.replace(
        spec, files=(*spec.files, args), ro_paths=(*spec.ro_paths, str(module))
    )
    server = ForkServer(
        preload=(("jailprobe", str(module)),), target="jailprobe:main",
        env=spec.env, log_path=tmp_path / "forkserver.log",
    )  # fmt: skip
    read, write = os.pipe()
    try:
        process = server.spawn(config=spec.config(MODE), mode=MODE, fds=(), stderr_fd=write)
        os.close(write)
        with os.fdopen(read) as output:
            text = output.read()
        code = process.wait(timeout=60)
    finally:
        server.close()
    out, _, err = text.partition("\n")
    return subprocess.CompletedProcess(
        [], code, out if code == 0 else "", err if code == 0 else text
    )


def run_jail(
    tmp_path: Path, planted: list[Path], uid: int, launch: str = "exec", **changes: object
) -> dict[str, object]:
    given = tmp_path / "given.txt"
    given.write_text("handed in")
    allowed = tmp_path / "allowed.txt"  # under the host's /tmp, as a checkout or venv may be
    allowed.write_text("allowlisted")
    server = socket.create_server(("127.0.0.1", 0))
    spec = JailSpec(
        argv=(sys.executable, "-I", "-c", REPORT, json.dumps([str(p) for p in planted]),
              str(server.getsockname()[1]), str(allowed)),
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        uid=uid,
        ro_paths=(*RUNTIME, str(allowed)),
        files=(("/opt/tool/generated.txt", "generated"),),
        copy_in=((str(given), "given.txt"),),
        **{"limits": JailLimits(memory_limit_bytes=2 << 30, max_processes=16, cpu_limit_s=30),
           **changes},  # type: ignore[arg-type]
    )  # fmt: skip
    try:
        done = (
            subprocess.run(
                spec.command(MODE), capture_output=True, text=True, timeout=60, check=False
            )
            if launch == "exec"
            else _fork_launch(tmp_path, spec)
        )
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


LAUNCHES = pytest.mark.parametrize("launch", ["exec", "fork"])
"""Each jail started by ``unshare`` and a new interpreter, and forked by a `ForkServer`: the same jail."""


@LAUNCHES
def test_the_jail_root_holds_only_the_allowlist(
    tmp_path: Path, planted: list[Path], uid: int, launch: str
) -> None:
    for path in planted:
        assert path.exists(), f"{path} should be readable outside the jail"
    seen = run_jail(tmp_path, planted, uid, launch)
    allowed_tops = {p.split("/")[1] for p in RUNTIME} | {"dev", "etc", "proc", "tmp", "opt"}
    assert set(seen["root"]) <= allowed_tops, seen["root"]  # type: ignore[arg-type]
    assert "home" not in seen["root"]
    assert "srv" not in seen["root"]
    assert "mnt" not in seen["root"]
    assert seen["readable"] == [], "host files visible in the jail"
    assert seen["etc"] == ["group", "ld.so.cache", "passwd"]
    assert seen["fds"] == [0, 1, 2, 3], (
        "descriptors beyond stdio and the probe's own listing leaked in"
    )
    assert seen["dev"] == [
        "fd",
        "full",
        "null",
        "random",
        "shm",
        "stderr",
        "stdin",
        "stdout",
        "urandom",
        "zero",
    ]
    assert seen["files"] == "generated"
    assert seen["allowed_under_tmp"] == "allowlisted"
    assert seen["pids"] == [1], "the jail's pid namespace holds only its own program"
    assert not seen["network"]


def test_an_address_space_ceiling_is_the_hard_limit_above_the_soft_one(
    tmp_path: Path, planted: list[Path], uid: int
) -> None:
    """The desktop lets its browser raise its own address-space limit this far, and no further."""
    limits = JailLimits(memory_limit_bytes=2 << 30, max_processes=16, cpu_limit_s=30,
                        address_space_ceiling_bytes=4 << 30)  # fmt: skip
    seen = run_jail(tmp_path, planted, uid, limits=limits)
    assert re.search(r"Max address space\s+2147483648\s+4294967296\s", str(seen["limits"]))
    with pytest.raises(ValueError, match="address_space_ceiling_bytes 1024 is below"):
        JailLimits(memory_limit_bytes=2 << 30, max_processes=1, cpu_limit_s=1,
                   address_space_ceiling_bytes=1024)  # fmt: skip


@LAUNCHES
def test_the_jail_drops_every_privilege(
    tmp_path: Path, planted: list[Path], uid: int, launch: str
) -> None:
    seen = run_jail(tmp_path, planted, uid, launch)
    expected_uid = uid if MODE == "namespaces+uid" else 0
    assert (seen["uid"], seen["gid"]) == (expected_uid, expected_uid)
    assert seen["groups"] == [] or MODE == "userns"
    assert seen["cap_eff"] == seen["cap_bnd"] == seen["cap_inh"] == "0000000000000000"
    assert seen["no_new_privs"] == "1"
    assert (seen["cwd"], seen["copied"], seen["copied_owner"]) == (
        "/tmp/work",
        "handed in",
        expected_uid,
    )
    assert seen["write_tmp"]
    assert not seen["write_root"]
    assert not seen["write_runtime"]
    limits = str(seen["limits"])
    assert "Max address space         2147483648" in limits
    assert "Max processes             16" in limits
    assert "Max core file size        0" in limits


@LAUNCHES
def test_a_jail_that_cannot_be_built_says_why_and_runs_nothing(
    tmp_path: Path, uid: int, launch: str
) -> None:
    marker = tmp_path / "ran"
    spec = JailSpec(
        argv=(sys.executable, "-I", "-c", f"open({str(marker)!r}, 'w')"),
        env={}, uid=uid, ro_paths=RUNTIME, copy_in=((str(tmp_path / "missing.py"), "x.py"),),
    )  # fmt: skip
    done = (
        subprocess.run(spec.command(MODE), capture_output=True, text=True, timeout=60, check=False)
        if launch == "exec"
        else _fork_launch(tmp_path, spec)
    )
    assert done.returncode == 125
    assert done.stderr.startswith("agentinfra jail: ")
    assert "missing.py" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not marker.exists()


def test_a_program_outside_the_allowlist_is_refused_in_one_line(tmp_path: Path, uid: int) -> None:
    outside = ROOT / ".venv" / "bin" / "pip"  # exists on the host, not bound into the jail
    spec = JailSpec(argv=(str(outside), "--version"), env={}, uid=uid, ro_paths=RUNTIME)
    done = subprocess.run(
        spec.command(MODE), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 125
    assert done.stderr.startswith("agentinfra jail: ")
    assert "No such file" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_jail_needs_namespaces(uid: int) -> None:
    spec = JailSpec(argv=("true",), env={}, uid=uid, ro_paths=())
    with pytest.raises(ValueError, match="rlimits-only"):
        spec.command("rlimits-only")


def test_the_python_runtime_is_the_interpreter_and_the_named_distributions_only() -> None:
    paths = python_runtime_paths(("xxhash",))
    site = [p for p in paths if "-packages" in p]
    assert site
    assert all("xxhash" in Path(p).name for p in site), site
    assert sys.executable in paths
    assert not any(p.startswith(str(ROOT / "src")) for p in paths)
    torch_paths = python_runtime_paths(("torch",))
    names = {Path(p).name.split("-")[0] for p in torch_paths if "-packages" in p}
    assert {"torch", "sympy", "filelock"} <= names  # declared dependencies follow
    assert "openai" not in names
    assert "pydantic" not in names


def test_a_fork_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    server = ForkServer(
        preload=(("agentinfra_no_such_module", ""),), target="agentinfra_no_such_module:main",
        env={"PATH": "/usr/bin:/bin"}, log_path=tmp_path / "forkserver.log",
    )  # fmt: skip
    with pytest.raises(ForkServerError, match="No module named 'agentinfra_no_such_module'"):
        server.start()
    server.close()
    assert not (tmp_path / "forkserver.log").exists(), "close leaves its log behind"


ECHO = """
import sys
sys.stderr.write('echo started\\n')
sys.stderr.flush()
for line in sys.stdin:
    if line != 'quiet\\n':
        sys.stdout.write(line)
        sys.stdout.flush()
"""


def _start_echo(tmp_path: Path, uid: int) -> JailedProcess:
    """A jailed echo program on the channel (stdin and stdout, as the desktop controller speaks)."""
    spec = JailSpec(argv=(sys.executable, "-I", "-c", ECHO), env={"PATH": "/usr/bin:/bin"}, uid=uid,
                    ro_paths=RUNTIME)  # fmt: skip

    def spawn(child: tuple[int, int], stderr: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(spec.command(MODE), stdin=child[0], stdout=child[1], stderr=stderr,
                                start_new_session=True)  # fmt: skip

    uid_seen = uid if MODE == "namespaces+uid" else None
    return JailedProcess.start(spawn, mode=MODE, uid=uid_seen, stderr_path=tmp_path / "echo.stderr")


def _read_line(channel: JailedProcess, timeout_s: float) -> bytes:
    deadline = time.monotonic() + timeout_s
    data = b""
    while not data.endswith(b"\n"):
        chunk = channel.read(1 << 16, deadline=deadline)
        if not chunk:
            break
        data += chunk
    return data


def test_the_channel_talks_to_a_jail_with_deadlines_and_ends_it(tmp_path: Path, uid: int) -> None:
    channel = _start_echo(tmp_path, uid)
    try:
        channel.send(b"ping\n", deadline=time.monotonic() + 10)
        assert _read_line(channel, 30) == b"ping\n"
        assert channel.stderr_tail(100) == "echo started\n"
        tree = channel.descendants()
        assert tree[0] == channel.process.pid
        assert len(tree) >= 2, "unshare and the jail's program"
        if MODE == "namespaces+uid":
            assert channel.signal(signal.SIGCONT) >= 1
        channel.send(b"quiet\n")
        started = time.monotonic()
        with pytest.raises(ChannelTimeoutError, match="deadline passed"):
            channel.read(10, deadline=time.monotonic() + 0.3)
        assert 0.25 <= time.monotonic() - started < 5
    finally:
        channel.kill(grace_s=2)
    assert channel.poll() is not None
    assert all(not Path(f"/proc/{pid}").exists() for pid in tree)
    if MODE == "namespaces+uid":
        assert kill_uid(uid) == 0, "a process of the jail's uid outlived kill"


def test_the_channel_on_the_event_loop(tmp_path: Path, uid: int) -> None:
    async def talk() -> tuple[bytes, bytes]:
        channel = _start_echo(tmp_path, uid)
        try:
            big = (
                b"x" * (1 << 20) + b"\n"
            )  # larger than a pipe's buffer: the send waits on the loop
            sending = asyncio.ensure_future(channel.send_async(big, deadline=time.monotonic() + 30))
            received = b""
            while not received.endswith(b"\n"):
                received += await channel.read_async(1 << 20, deadline=time.monotonic() + 30)
            await sending
            await channel.send_async(b"quiet\n", deadline=time.monotonic() + 10)
            with pytest.raises(ChannelTimeoutError):
                await channel.read_async(10, deadline=time.monotonic() + 0.3)
            await channel.send_async(b"last\n", deadline=time.monotonic() + 10)
            last = await channel.read_async(100, deadline=time.monotonic() + 30)
        finally:
            await channel.kill_async(grace_s=2)
        assert channel.poll() is not None
        return received, last

    received, last = asyncio.run(talk())
    assert received == b"x" * (1 << 20) + b"\n"
    assert last == b"last\n"


def test_a_closed_channel_says_so(tmp_path: Path, uid: int) -> None:
    channel = _start_echo(tmp_path, uid)
    try:
        channel.send(b"ping\n")
        assert _read_line(channel, 30) == b"ping\n"
        for pid in reversed(channel.descendants()[1:]):
            os.kill(pid, signal.SIGKILL)
        channel.process.wait(timeout=30)
        assert channel.read(10, deadline=time.monotonic() + 10) == b""
        with pytest.raises(ChannelClosedError, match="Broken pipe"):
            channel.send(b"x" * (1 << 20))
    finally:
        channel.kill(grace_s=2)

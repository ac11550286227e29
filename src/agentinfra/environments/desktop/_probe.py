"""The probe jail: runs what a desktop check executes, away from the gold, and returns its output as data.

A check that runs a program (OSWorld's ``vm_command_line``: ``bash ~/eval.sh``,
``python ~/Desktop/script.py``, ``which spotify``) runs something the agent may
have written. So it runs here, in a third party between the desktop and the
grading jail, and only its bounded output goes on to the grader:

* its own reserved uid (neither the desktop's nor the grading jail's), a fresh
  pid namespace per command (it cannot see or ptrace the grader, nor an earlier
  command), no network;
* a private writable copy of the snapshot at ``/home/user``, owned by that uid,
  with the episode's permission bits restored from the snapshot manifest
  (set-id bits dropped), made afresh for every command, so one command cannot
  prepare the home for the next;
* the desktop's system view, read-only (`_session._SYSTEM_PATHS`: ``/usr``,
  ``/etc/alternatives``, fonts, the system interpreters), not the desktop's
  virtual environment (no check needs pyautogui, and the grader's libraries are
  not there either);
* the episode's recorded facts read-only at ``/run/agentinfra/facts.json``;
  never ``/expected``, the mirror or the task;
* interpreters started isolated: ``python``, ``python3`` and ``python3.11``
  resolve first to read-only wrappers that exec the system interpreter with
  ``-I`` (no user site, no ``PYTHON*`` variables, and since 3.11 no script
  folder on ``sys.path``), and ``PYTHONNOUSERSITE``/``PYTHONSAFEPATH`` do the
  same for one started by its absolute path or a script's shebang; shells start as ``bash --noprofile --norc`` in a
  clean environment without ``BASH_ENV``/``ENV``: ``HOME=/home/user``,
  ``USER=LOGNAME=user``, ``SHELL=/bin/bash``, ``LANG=C.UTF-8``, the desktop's
  ``PATH`` minus its virtual environment, the working directory ``/home/user``;
* each command's stdout is kept up to `PROBE_OUTPUT_BYTES` (then the command is
  killed and the output marked truncated), each runs at most
  `PROBE_COMMAND_TIMEOUT_S`, all of them together `PROBE_TOTAL_TIMEOUT_S`.

What runs here is the agent's as much as the desktop was: its output is an
untrusted string that metrics compare, never code or a path the grader opens.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentinfra.environments.desktop._session import _SYSTEM_PATHS
from agentinfra.errors import TaskEnvironmentError, UidExhaustedError
from agentinfra.sandbox import JailLimits, JailSpec, kill_uid, reserve_uid

__all__ = [
    "PROBE_COMMAND_TIMEOUT_S",
    "PROBE_OUTPUT_BYTES",
    "PROBE_TOTAL_TIMEOUT_S",
    "ProbeCommand",
    "ProbeOutput",
    "copy_home",
    "run_probe",
    "safe_child",
]

PROBE_OUTPUT_BYTES = 1 << 20
PROBE_COMMAND_TIMEOUT_S = 30.0
PROBE_TOTAL_TIMEOUT_S = 90.0
PROBE_PATH = "/run/agentinfra/bin:/usr/local/bin:/usr/bin:/bin"
"""The desktop's PATH without its virtual environment, after the interpreter wrappers."""
_SYSTEM_PYTHON = "/usr/bin/python3"
_PYTHON_NAMES = ("python", "python3", "python3.11")
_HOME = "/home/user"


@dataclass(frozen=True, slots=True)
class ProbeCommand:
    """One program a check runs: an argv list, or a string (split on spaces, or run by bash when ``shell``)."""

    command: str | list[str]
    shell: bool = False

    def argv(self) -> list[str]:
        if self.shell:
            text = self.command if isinstance(self.command, str) else " ".join(self.command)
            return ["/bin/bash", "--noprofile", "--norc", "-c", text]
        return (
            [str(a) for a in self.command]
            if isinstance(self.command, list)
            else self.command.split()
        )


@dataclass(frozen=True, slots=True)
class ProbeOutput:
    """What one command printed (stdout, decoded), how it ended, and why it was cut short if it was."""

    stdout: str
    returncode: int | None
    error: str = ""


def safe_child(root: Path, relative: str) -> Path:
    """``root / relative`` after checking that no component is a link and none leaves ``root``.

    Raises:
        TaskEnvironmentError: an absolute or ``..`` path, or a component that is a symbolic link
            (the snapshot holds the agent's links; following one would leave the home).
    """
    parts = Path(relative).parts
    if not parts or Path(relative).is_absolute() or any(p in ("..", ".") for p in parts):
        raise TaskEnvironmentError(f"path {relative!r} is not a plain path inside the home")
    current = root
    for part in parts:
        current = current / part
        if os.path.islink(current):
            raise TaskEnvironmentError(f"{relative!r}: component {part!r} is a symbolic link")
    return current


def copy_home(snapshot: Path, target: Path, uid: int, modes: dict[str, int]) -> None:
    """Copies ``snapshot`` to ``target`` (links kept as links, never followed), owned by ``uid``,
    with the recorded permission bits (set-id bits dropped) applied where the manifest has them."""
    shutil.copytree(snapshot, target, symlinks=True, copy_function=_copy_sparse)
    for directory, folders, files in os.walk(target):
        for name in [*folders, *files]:
            os.lchown(os.path.join(directory, name), uid, uid)
    os.lchown(target, uid, uid)
    target.chmod(0o700)
    for relative, mode in sorted(modes.items(), key=lambda item: -len(Path(item[0]).parts)):
        try:
            path = safe_child(target, relative)
            info = os.lstat(path)
        except (TaskEnvironmentError, OSError):
            continue  # a manifest entry for what is not in the copy (left out, or a link) changes nothing
        if stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode):
            os.chmod(path, int(mode) & 0o1777, follow_symlinks=False)


def _copy_sparse(source: str, destination: str) -> None:
    """Copies a regular file's data extents only, so a sparse file stays sparse (its holes unwritten)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW
    with open(os.open(source, flags), "rb") as src, open(destination, "xb") as dst:
        size = os.fstat(src.fileno()).st_size
        offset = 0
        while offset < size:
            try:
                start = os.lseek(src.fileno(), offset, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(src.fileno(), start, os.SEEK_HOLE)
            while start < end:
                copied = os.copy_file_range(src.fileno(), dst.fileno(), end - start, start, start)
                if copied == 0:
                    break
                start += copied
            offset = end
        dst.truncate(size)
    shutil.copystat(source, destination, follow_symlinks=False)


def _wrappers(folder: Path) -> None:
    folder.mkdir(mode=0o755)
    for name in _PYTHON_NAMES:
        wrapper = folder / name
        wrapper.write_text(f'#!/bin/sh\nexec {_SYSTEM_PYTHON} -I "$@"\n')
        wrapper.chmod(0o755)


def _spec(argv: list[str], uid: int, workspace: Path) -> JailSpec:
    env = {
        "HOME": _HOME, "USER": "user", "LOGNAME": "user", "SHELL": "/bin/bash", "PATH": PROBE_PATH,
        "LANG": "C.UTF-8", "XDG_RUNTIME_DIR": "/tmp/runtime-user", "PYTHONDONTWRITEBYTECODE": "1",
        # For an interpreter started past the wrappers (an absolute path, a script's shebang):
        # still no user site and no script folder on sys.path.
        "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1",
    }  # fmt: skip
    return JailSpec(
        argv=("/usr/bin/env", "-C", _HOME, "--", *argv),
        env=env,
        uid=uid,
        ro_paths=tuple(p for p in _SYSTEM_PATHS if os.path.lexists(p)),
        binds=(
            (str(workspace / "bin"), "/run/agentinfra/bin"),
            (str(workspace / "facts.json"), "/run/agentinfra/facts.json"),
        ),
        files=(("/etc/hostname", "desktop\n"), ("/etc/hosts", "127.0.0.1 localhost desktop\n")),
        rw_binds=((str(workspace / "home"), _HOME),),
        user="user",
        home=_HOME,
        shell="/bin/bash",
        tmp_bytes=256 << 20,
        limits=JailLimits(
            memory_limit_bytes=4 << 30, max_processes=256, cpu_limit_s=int(PROBE_COMMAND_TIMEOUT_S)
        ),
    )


def _capture(command: list[str], timeout_s: float) -> ProbeOutput:
    """Runs ``command`` (a jail), keeping at most `PROBE_OUTPUT_BYTES` of its stdout for at most ``timeout_s``."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    assert process.stdout is not None
    kept = bytearray()
    error = ""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                error = f"ran past {timeout_s:.0f} s"
                break
            if not selector.select(timeout=left):
                continue
            chunk = os.read(process.stdout.fileno(), 1 << 16)
            if not chunk:
                break
            kept += chunk
            if len(kept) > PROBE_OUTPUT_BYTES:
                error = f"printed more than {PROBE_OUTPUT_BYTES} bytes"
                del kept[PROBE_OUTPUT_BYTES:]
                break
    if error:
        os.killpg(process.pid, signal.SIGKILL)
    process.stdout.close()
    try:  # stdout closed, but the command may still run: it gets what is left of its time
        returncode: int | None = process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        returncode, error = None, f"ran past {timeout_s:.0f} s"
    return ProbeOutput(kept.decode(errors="replace"), None if error else returncode, error)


def run_probe(commands: list[ProbeCommand], snapshot: Path, *, modes: dict[str, int] | None = None,
              facts: dict[str, Any] | None = None) -> list[ProbeOutput]:  # fmt: skip
    """Runs each command in a fresh probe jail on its own copy of ``snapshot``; their outputs, in order.

    Raises:
        TaskEnvironmentError: no uid is free, or the home cannot be copied.
    """
    if not commands:
        return []
    workspace = Path(tempfile.mkdtemp(prefix="agentinfra-probe-"))
    try:
        workspace.chmod(0o711)
        _wrappers(workspace / "bin")
        (workspace / "facts.json").write_text(json.dumps(facts or {}))
        (workspace / "facts.json").chmod(0o444)
        try:
            uid, lock = reserve_uid()
        except UidExhaustedError as exc:
            raise TaskEnvironmentError(f"{exc}; grade fewer episodes at once") from exc
        try:
            return _run_each(commands, snapshot, workspace, uid, modes or {})
        finally:
            kill_uid(uid)
            os.close(lock)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def _run_each(commands: list[ProbeCommand], snapshot: Path, workspace: Path, uid: int,
              modes: dict[str, int]) -> list[ProbeOutput]:  # fmt: skip
    outputs: list[ProbeOutput] = []
    deadline = time.monotonic() + PROBE_TOTAL_TIMEOUT_S
    home = workspace / "home"
    for command in commands:
        left = deadline - time.monotonic()
        argv = command.argv()
        if left <= 0 or not argv:
            reason = (
                "no command"
                if not argv
                else f"the probe's {PROBE_TOTAL_TIMEOUT_S:.0f} s were spent"
            )
            outputs.append(ProbeOutput("", None, reason))
            continue
        shutil.rmtree(home, ignore_errors=True)
        try:
            copy_home(snapshot, home, uid, modes)
        except OSError as exc:
            raise TaskEnvironmentError(f"cannot copy the snapshot for the probe: {exc}") from exc
        jail = _spec(argv, uid, workspace).command("namespaces+uid")
        outputs.append(_capture(jail, min(left, PROBE_COMMAND_TIMEOUT_S)))
        kill_uid(uid)
    return outputs

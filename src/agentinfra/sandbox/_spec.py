"""What a jail holds (`JailSpec`), how to start one, and the allowlist a Python program needs."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "JailLimits",
    "JailSpec",
    "SandboxMode",
    "probe_sandbox_mode",
    "python_runtime_paths",
    "system_library_paths",
]

SandboxMode = Literal["namespaces+uid", "userns", "rlimits-only", "none"]

SYSTEM_LIBRARY_PATHS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/etc/ld.so.cache")
"""What the dynamic loader and the C/C++ runtimes read: shared libraries and the loader's cache."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JailLimits:
    """Resource limits inside a jail (per process; RLIMIT_NPROC counts the jail's uid)."""

    memory_limit_bytes: int
    max_processes: int
    cpu_limit_s: int
    file_bytes: int = 1 << 30
    open_files: int = 256
    address_space_ceiling_bytes: int | None = None
    """``RLIMIT_AS``'s hard limit, which a process may raise its own soft limit
    (``memory_limit_bytes``) to; None: the soft limit is the hard one too."""

    def __post_init__(self) -> None:
        ceiling = self.address_space_ceiling_bytes
        if ceiling is not None and ceiling < self.memory_limit_bytes:
            raise ValueError(
                f"address_space_ceiling_bytes {ceiling} is below memory_limit_bytes "
                f"{self.memory_limit_bytes}; raise the ceiling or leave it None"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class JailSpec:
    """One jail: a fresh minimal root, private namespaces, a uid, limits, one program.

    The root holds only ``ro_paths`` (bound read-only at the same place, symlinks on
    the way recreated), ``binds`` (host path -> jail path, read-only), ``files``
    (generated text, read-only), ``devices`` (besides null, zero, full, random and
    urandom), ``sys_paths`` (read-only parts of ``/sys``), a fresh ``/proc`` for
    its pid namespace, a private ``/dev/shm`` and a private ``/tmp`` whose
    ``workdir`` holds ``copy_in`` (host file -> name), owned by ``uid``.

    ``rw_binds`` (host directory -> jail path) are the only writable places
    besides the private ``/tmp`` and ``/dev/shm``: a desktop's home directory,
    made by the caller from a template and owned by ``uid``. ``/etc/passwd``
    names ``user`` with ``home`` and ``shell``; ``ptys`` gives it terminals.
    """

    argv: tuple[str, ...]
    env: dict[str, str]
    uid: int
    ro_paths: tuple[str, ...]
    binds: tuple[tuple[str, str], ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    copy_in: tuple[tuple[str, str], ...] = ()
    devices: tuple[str, ...] = ()
    sys_paths: tuple[str, ...] = ()
    workdir: str = "/tmp/work"
    tmp_bytes: int = 1 << 30
    cpus: tuple[int, ...] = field(default_factory=lambda: tuple(sorted(os.sched_getaffinity(0))))
    limits: JailLimits | None = None
    rw_binds: tuple[tuple[str, str], ...] = ()
    user: str = "sandbox"
    home: str | None = None
    shell: str = "/bin/false"
    ptys: bool = False
    """A private ``/dev/pts`` (its own devpts instance) and ``/dev/ptmx``, for terminals."""

    def config(self, mode: SandboxMode) -> dict[str, object]:
        """What the jail builder (`_jail.build_root`) reads: this spec as JSON-ready data."""
        if mode not in ("namespaces+uid", "userns"):
            raise ValueError(f"a jail needs namespaces; sandbox mode is {mode!r}")
        limits = self.limits
        return {
            "uid": self.uid if mode == "namespaces+uid" else 0,
            "ro_paths": list(self.ro_paths),
            "binds": [list(b) for b in self.binds],
            "files": [list(f) for f in self.files],
            "copy_in": [list(c) for c in self.copy_in],
            "devices": list(self.devices),
            "sys_paths": list(self.sys_paths),
            "workdir": self.workdir,
            "tmp_bytes": self.tmp_bytes,
            "cpus": list(self.cpus),
            "limits": None if limits is None else {
                "memory_limit_bytes": limits.memory_limit_bytes, "max_processes": limits.max_processes,
                "cpu_limit_s": limits.cpu_limit_s, "file_bytes": limits.file_bytes, "open_files": limits.open_files,
                "address_space_ceiling_bytes": limits.address_space_ceiling_bytes,
            },
            "env": self.env,
            "rw_binds": [list(b) for b in self.rw_binds],
            "user": self.user,
            "home": self.home or self.workdir,
            "shell": self.shell,
            "ptys": self.ptys,
        }  # fmt: skip

    def command(self, mode: SandboxMode) -> list[str]:
        """The command line that builds this jail and runs ``argv`` in it (``mode``: a namespace mode)."""
        config = self.config(mode)
        flags = [] if mode == "namespaces+uid" else ["--user", "--map-root-user"]
        return ["unshare", *flags, "--pid", "--fork", "--kill-child", "--net", "--mount", "--mount-proc",
                "--propagation", "private", sys.executable, "-I", "-m", "agentinfra.sandbox._jail",
                json.dumps(config), "--", *self.argv]  # fmt: skip


_PROBED: dict[str, SandboxMode] = {}


def probe_sandbox_mode() -> SandboxMode:
    """The strongest sandbox mode this machine allows (probed once per process).

    ``namespaces+uid`` when running as root, ``userns`` with unprivileged user
    namespaces, else ``rlimits-only``.
    """
    if "mode" in _PROBED:
        return _PROBED["mode"]
    mode: SandboxMode = "rlimits-only"
    if shutil.which("unshare"):
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


def system_library_paths() -> tuple[str, ...]:
    """The shared-library directories and loader cache that exist on this machine."""
    return tuple(p for p in SYSTEM_LIBRARY_PATHS if os.path.lexists(p))


_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@functools.cache
def python_runtime_paths(distributions: tuple[str, ...]) -> tuple[str, ...]:
    """What this interpreter needs to import ``distributions`` and their declared dependencies.

    The interpreter (the path it was started by, so a virtual environment's
    ``pyvenv.cfg`` applies, and the binary it resolves to), the standard library,
    ``libpython`` when it is shared, and each distribution's top-level entries in
    its site-packages (packages, modules, ``.libs`` folders, metadata), found from
    its installed RECORD and followed through ``Requires-Dist`` (extras skipped).
    Nothing else in site-packages, and no other directory of the environment.
    """
    # The jail follows symlinks itself (it recreates them and binds their targets).
    paths = {sys.executable}
    # The standard library is the base interpreter's; a venv's platstdlib holds only its site-packages.
    paths.update(
        sysconfig.get_paths()[key]
        for key in ("stdlib", "platstdlib")
        if sysconfig.get_paths()[key].startswith(sys.base_prefix)
    )
    if sys.prefix != sys.base_prefix:
        paths.add(os.path.join(sys.prefix, "pyvenv.cfg"))
    library = os.path.join(
        str(sysconfig.get_config_var("LIBDIR")), str(sysconfig.get_config_var("LDLIBRARY"))
    )
    if os.path.isfile(library):
        paths.add(library)
    seen: set[str] = set()
    pending = list(distributions)
    while pending:
        name = re.sub(r"[-_.]+", "-", pending.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        base = Path(str(dist.locate_file("")))
        for entry in dist.files or ():
            first = entry.parts[0] if entry.parts else ""
            if first and first not in ("..", "__pycache__") and not first.startswith("/"):
                paths.add(str(base / first))
        for requirement in dist.requires or ():
            requirement_name, _, marker = requirement.partition(";")
            match = _REQUIREMENT_NAME.match(requirement_name)
            if match and "extra" not in marker:
                pending.append(match.group(1))
    return tuple(sorted(p for p in paths if os.path.lexists(p)))

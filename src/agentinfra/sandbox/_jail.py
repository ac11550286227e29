"""Inside fresh namespaces, as root: build a minimal root filesystem, then drop to a uid.

Run by `JailSpec.command` as ``unshare --pid --fork --kill-child --net --mount
--mount-proc --propagation private python -I -m agentinfra.sandbox._jail CONFIG``.
Before any untrusted code runs it:

1. reads the files to copy in (the submission, a problem) while the host's
   filesystem is still visible;
2. mounts a small tmpfs as the new root and fills it with exactly the allowlist:
   read-only bind mounts of each allowed path at the same place (symlinks on the
   way, such as ``/lib -> usr/lib``, recreated as symlinks), extra read-only binds
   at other places, small generated files (``/etc/passwd`` naming only the
   sandbox user), a ``/dev`` holding null, zero, full, random and urandom, a
   private ``/dev/shm``, a fresh ``/proc`` of the new pid namespace, a private
   ``/tmp`` with the copied-in files in ``/tmp/work``;
3. ``pivot_root``s into it and detaches the old root, so nothing else on the
   host is reachable by any path; the new root itself is then read-only;
4. sets CPU affinity and resource limits (address space, processes, CPU time,
   file size, open files, no core dumps);
5. drops every capability (bounding, ambient, inheritable, permitted, effective),
   switches to the sandbox uid and gid with no supplementary groups, sets
   ``no_new_privs`` and execs the program.

Mounts use the ``mount``/``pivot_root`` system calls through ctypes (a grading
builds its jails on the critical path; spawning ``mount`` per bind would cost
milliseconds each). Only the standard library is imported here.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_NOATIME = 1024
_MS_NODIRATIME = 2048
_MS_BIND = 4096
_MS_REC = 16384
_MS_RELATIME = 1 << 21
_MNT_DETACH = 2
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522
_DEVICES = ("null", "zero", "full", "random", "urandom")
_STATVFS_LOCKED = (
    (os.ST_NOSUID, _MS_NOSUID),
    (os.ST_NODEV, _MS_NODEV),
    (os.ST_NOEXEC, _MS_NOEXEC),
    (os.ST_NOATIME, _MS_NOATIME),
    (os.ST_NODIRATIME, _MS_NODIRATIME),
    (os.ST_RELATIME, _MS_RELATIME),
)

_libc = ctypes.CDLL(None, use_errno=True)


class JailSetupError(Exception):
    """The jail could not be built; the program was not started."""


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise JailSetupError(f"{what}: {os.strerror(error)}")


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source or fstype} on {target}",
    )


def _bind_readonly(source: str, target: str, *, device: bool = False) -> None:
    _mount(source, target, None, _MS_BIND)
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | (0 if device else _MS_NODEV)
    locked = os.statvfs(source).f_flag
    flags |= sum(bit for st, bit in _STATVFS_LOCKED if locked & st)
    _mount(None, target, None, flags)


def _pivot_root(new_root: str) -> None:
    os.chdir(new_root)
    number = _PIVOT_ROOT.get(platform.machine())
    if number is not None:
        _check(_libc.syscall(ctypes.c_long(number), b".", b"."), "pivot_root")
    else:
        subprocess.run(["pivot_root", ".", "."], check=True, capture_output=True)
    _check(_libc.umount2(b".", _MNT_DETACH), "detach the old root")
    os.chdir("/")


class _Root:
    """The new root under construction at ``self.top`` (a tmpfs)."""

    def __init__(self, top: str) -> None:
        self.top = top
        self.bound: list[str] = []

    def inside(self, path: str) -> str:
        return self.top + path

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        os.makedirs(self.inside(path), mode=mode, exist_ok=True)

    def symlink(self, path: str, target: str) -> None:
        self.mkdir(os.path.dirname(path))
        if not os.path.lexists(self.inside(path)):
            os.symlink(target, self.inside(path))

    def write(self, path: str, data: bytes, mode: int = 0o644) -> None:
        if self._under_bind(path):
            raise JailSetupError(f"cannot generate {path}: it lies in a bound host path")
        self.mkdir(os.path.dirname(path))
        with open(self.inside(path), "wb") as handle:
            handle.write(data)
        os.chmod(self.inside(path), mode)

    def _under_bind(self, path: str) -> bool:
        return any(path == b or path.startswith(b + "/") for b in self.bound)

    def bind(self, source: str, target: str, *, device: bool = False) -> None:
        if self._under_bind(target):
            return
        if os.path.isdir(source):
            self.mkdir(target)
        else:
            self.mkdir(os.path.dirname(target))
            open(self.inside(target), "ab").close()
        _bind_readonly(source, self.inside(target), device=device)
        self.bound.append(target)

    def bind_writable(self, source: str, target: str, uid: int) -> None:
        """A host directory owned by ``uid``, writable at ``target`` (no devices, no set-uid)."""
        if self._under_bind(target) or os.path.islink(source) or not os.path.isdir(source):
            raise JailSetupError(f"cannot bind {source} writable at {target}")
        if os.lstat(source).st_uid != uid:
            raise JailSetupError(f"{source} is not owned by the sandbox uid {uid}")
        self.mkdir(target)
        _mount(source, self.inside(target), None, _MS_BIND)
        _mount(None, self.inside(target), None, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV)
        self.bound.append(target)

    def mirror(self, path: str, depth: int = 0) -> None:
        """Makes ``path`` reachable at the same place: its symlinks recreated, its real tree bound."""
        if depth > 40:
            raise JailSetupError(f"too many symbolic links under {path}")
        current = "/"
        parts = [p for p in path.split("/") if p]
        for index, part in enumerate(parts):
            host = os.path.join(current, part)
            if os.path.islink(host):
                link = os.readlink(host)
                self.symlink(host, link)
                rest = "/".join(parts[index + 1 :])
                resolved = os.path.normpath(os.path.join(current, link))
                self.mirror(os.path.join(resolved, rest) if rest else resolved, depth + 1)
                return
            if not os.path.lexists(host):
                return
            current = host
        self.bind(current, current)


def _real_sources(config: dict[str, Any]) -> list[str]:
    paths = [str(p) for p in config["ro_paths"]]
    paths += [str(source) for source, _ in config["binds"]]
    paths += [str(source) for source, _ in config.get("rw_binds", ())]
    return [os.path.realpath(p) for p in paths]


def _pick_top(sources: list[str]) -> str:
    """An existing directory that holds none of the sources, to mount the new root on."""
    for candidate in (
        "/mnt",
        "/media",
        "/srv",
        "/opt",
        "/boot",
        "/home",
        "/run",
        "/var/tmp",
        "/tmp",
    ):
        if (
            os.path.isdir(candidate)
            and not os.path.islink(candidate)
            and not any(s == candidate or s.startswith(candidate + "/") for s in sources)
        ):
            return candidate
    raise JailSetupError("no directory to build the jail's root on (/mnt, /media, /srv, /opt, ...)")


def build_root(config: dict[str, Any]) -> None:
    """Builds the minimal root described by ``config`` and pivots into it."""
    uid = int(config["uid"])
    workdir = str(config["workdir"])
    copies = [(Path(src).read_bytes(), dst) for src, dst in config["copy_in"]]
    top = _pick_top(_real_sources(config))
    _mount("tmpfs", top, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=755,size=16m")
    root = _Root(top)
    # The private /tmp first: allowlisted paths that live under /tmp (a checkout or a
    # virtual environment there) are then bound on top of it instead of being hidden.
    root.mkdir("/tmp")
    _mount(
        "tmpfs",
        root.inside("/tmp"),
        "tmpfs",
        _MS_NOSUID | _MS_NODEV,
        f"mode=1777,size={int(config['tmp_bytes'])}",
    )
    for path in config["ro_paths"]:
        root.mirror(str(path))
    for source, target in config["binds"]:
        root.bind(os.path.realpath(source), str(target))
    for source, target in config.get("rw_binds", ()):
        root.bind_writable(str(source), str(target), uid)
    for path, text in config["files"]:
        root.write(str(path), str(text).encode())
    user, home, shell = (
        config.get("user", "sandbox"),
        config.get("home", workdir),
        config.get("shell", "/bin/false"),
    )
    root.write(
        "/etc/passwd", f"root:x:0:0::/:/bin/false\n{user}:x:{uid}:{uid}::{home}:{shell}\n".encode()
    )
    root.write("/etc/group", f"root:x:0:\n{user}:x:{uid}:\n".encode())
    root.mkdir("/dev")
    _mount("tmpfs", root.inside("/dev"), "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=755,size=64k")
    for name in _DEVICES:
        if os.path.exists(f"/dev/{name}"):
            root.bind(f"/dev/{name}", f"/dev/{name}", device=True)
    for device in config["devices"]:
        if os.path.exists(str(device)):
            root.bind(str(device), str(device), device=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):  # fmt: skip
        root.symlink(f"/dev/{name}", target)
    if config.get("ptys"):
        # A private devpts instance: terminals inside the jail, none of the host's.
        root.mkdir("/dev/pts")
        _mount(
            "devpts",
            root.inside("/dev/pts"),
            "devpts",
            _MS_NOSUID | _MS_NOEXEC,
            "newinstance,ptmxmode=0666,mode=0600",
        )
        root.symlink("/dev/ptmx", "pts/ptmx")
    root.mkdir("/dev/shm")
    _mount("tmpfs", root.inside("/dev/shm"), "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=1g")
    root.mkdir("/proc")
    try:
        _mount("proc", root.inside("/proc"), "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    except JailSetupError:
        _mount(
            "/proc", root.inside("/proc"), None, _MS_BIND | _MS_REC
        )  # the caller's own pid namespace
    for path in config["sys_paths"]:
        if os.path.exists(str(path)):
            root.bind(str(path), str(path))
    root.mkdir(workdir, mode=0o700)
    os.chown(root.inside(workdir), uid, uid)
    for data, name in copies:
        target = root.inside(os.path.join(workdir, name))
        with open(target, "wb") as handle:
            handle.write(data)
        os.chown(target, uid, uid)
    _pivot_root(top)
    _mount(None, "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    os.chdir(workdir)


def _set_limits(limits: dict[str, int] | None) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if not limits:
        return
    memory = limits["memory_limit_bytes"]
    resource.setrlimit(
        resource.RLIMIT_AS, (memory, limits.get("address_space_ceiling_bytes") or memory)
    )
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"], limits["max_processes"]))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_limit_s"], limits["cpu_limit_s"] + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))


def drop_privileges(uid: int) -> None:
    """No capability of any kind, ``uid`` (0 stays 0 inside a user namespace), ``no_new_privs``."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        _check(
            _libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0), f"drop capability {cap}"
        )
    _check(
        _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0),
        "clear ambient capabilities",
    )
    with contextlib.suppress(PermissionError):  # a user namespace with setgroups denied has none
        os.setgroups([])
    if uid:
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capset(header, data), "clear capabilities")
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")


def enter(config: dict[str, Any]) -> None:
    """Steps 1-5 up to the program: the root, affinity, limits, no privileges (this process).

    Raises:
        JailSetupError, OSError: the jail could not be built; nothing of it may be trusted.
    """
    build_root(config)
    os.sched_setaffinity(0, config["cpus"])
    _set_limits(config["limits"])
    drop_privileges(int(config["uid"]))


def main() -> None:
    config = json.loads(sys.argv[1])
    program = sys.argv[sys.argv.index("--") + 1 :]
    try:
        enter(config)
        os.execve(program[0], program, config["env"])
    except (JailSetupError, OSError) as exc:
        print(f"agentinfra jail: {exc}", file=sys.stderr)
        sys.exit(125)


if __name__ == "__main__":
    main()

"""The fork server's zygote: preload, then fork one jail per request (run from this file).

`ForkServer` (`_forkserver.py`, the owner's side) starts an interpreter that runs
this file with ``runpy.run_path``, outside agentinfra's package, and calls
`zygote`. It therefore imports only the standard library; `_jail` and the
``preload`` entries given as files are loaded from their files under stub
packages (`_load_file`). The protocol and what a forked jail shares with the
zygote are described in `_forkserver`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_PR_SET_PDEATHSIG = 1
MAX_MESSAGE = 1 << 20
"""The largest message either side of a spawn socket reads."""
_JAIL_ERROR_STATUS = 125


def _load_file(name: str, path: str) -> Any:
    import importlib.util
    import types

    parts = name.split(".")
    for index in range(1, len(parts)):
        package = ".".join(parts[:index])
        if package not in sys.modules:
            stub = types.ModuleType(package)
            stub.__path__ = []
            sys.modules[package] = stub
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def zygote(control_fd: int, preload: tuple[tuple[str, str], ...], target: str) -> None:
    """The zygote's main loop: preload, say ready, fork one child per request until EOF."""
    import importlib

    for name, path in preload:
        if path:
            _load_file(name, path)
        elif ":" in name:  # a warm-up function of a module loaded before
            module_name, _, function_name = name.partition(":")
            getattr(sys.modules[module_name], function_name)()
        else:
            importlib.import_module(name)
    module_name, _, function_name = target.partition(":")
    function = getattr(sys.modules[module_name], function_name)
    control = socket.socket(fileno=control_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    control.send(b"ready")
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(control, 16, 4)
        except OSError:
            break
        if not fds:
            break
        if os.fork() == 0:
            control.close()
            for extra in fds[1:]:
                os.close(extra)
            _outer_child(fds[0], function)  # never returns
        for fd in fds:
            os.close(fd)
    os._exit(0)


def _keep_only(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _unshare(mode: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET
    outer_uid, outer_gid = os.getuid(), os.getgid()
    if mode == "userns":
        flags |= _CLONE_NEWUSER
    if libc.unshare(ctypes.c_int(flags)) != 0:
        raise OSError(ctypes.get_errno(), f"unshare: {os.strerror(ctypes.get_errno())}")
    if mode == "userns":  # what `unshare --map-root-user` writes
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {outer_uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {outer_gid} 1")
    if libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None) != 0:
        raise OSError(ctypes.get_errno(), f"make / private: {os.strerror(ctypes.get_errno())}")


def _outer_child(conn_fd: int, function: Any) -> None:
    """Like ``unshare --fork --kill-child``: new namespaces, pid 1 in them, its status reported."""
    status = _JAIL_ERROR_STATUS
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        conn = socket.socket(fileno=conn_fd)
        message, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 16)
        request = json.loads(message)
        *worker_fds, stderr_fd = fds
        os.dup2(stderr_fd, 1)
        os.dup2(stderr_fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        _keep_only({0, 1, 2, conn_fd, *worker_fds})
        conn.send(json.dumps({"pid": os.getpid()}).encode())
        _unshare(str(request["mode"]))
        child = os.fork()
        if child == 0:
            conn.close()
            _jailed_child(request["config"], worker_fds, function)  # never returns
        for fd in worker_fds:
            os.close(fd)
        _, raw = os.waitpid(child, 0)
        status = os.waitstatus_to_exitcode(raw)
        conn.send(json.dumps({"exit": status}).encode())
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            print(f"agentinfra jail: {exc}", file=sys.stderr, flush=True)
    os._exit(0 if status == 0 else _JAIL_ERROR_STATUS)


def _jailed_child(config: dict[str, Any], fds: list[int], function: Any) -> None:
    """Pid 1 of the new namespaces: the jail `_jail.main` builds (`_jail.enter`), then ``function(*fds)``."""
    jail = sys.modules["agentinfra.sandbox._jail"]
    try:
        jail.enter(config)
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (jail.JailSetupError, OSError) as exc:
        print(f"agentinfra jail: {exc}", file=sys.stderr, flush=True)
        os._exit(_JAIL_ERROR_STATUS)
    code = 0
    try:
        function(*fds)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)

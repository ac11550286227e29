"""Helpers for integration tests: free ports, real `redis-server` processes (`.ci/run` installs Redis),
and the processes running under the sandbox's uids (leak checks)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from agentinfra.sandbox import UID_RANGE, pids_by_uid


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_cluster_port() -> int:
    """A port ``p`` with ``p + 10000`` free too (Redis cluster's bus port), below 55536."""
    import random

    for _ in range(200):
        port = random.randint(20_000, 30_000)
        try:
            for candidate in (port, port + 10_000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a Redis cluster node")


def _wait_for_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


def start_redis(directory: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: apt-get install -y redis-server (.ci/run does)")
    directory.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(directory), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    _wait_for_port(port)
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(10)


def sandboxed_processes() -> set[tuple[int, int]]:
    """(pid, uid) of every process running under one of the sandbox's uids."""
    found = set()
    for uid, pids in pids_by_uid().items():
        if UID_RANGE[0] <= uid < UID_RANGE[1]:
            found.update((pid, uid) for pid in pids)
    return found

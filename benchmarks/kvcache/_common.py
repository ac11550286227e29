"""Shared benchmark plumbing: the environment facts every JSON line carries."""

from __future__ import annotations

import json
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def environment() -> dict[str, Any]:
    """Git revision, Python version and hardware."""
    try:
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        revision = "unknown"
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "git": revision,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu,
    }


def emit(record: dict[str, Any], out: Path | None = None) -> None:
    """Prints one JSON line; with ``out``, also appends it there."""
    line = json.dumps(record, sort_keys=True)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if out is not None:
        with open(out, "a") as file:
            file.write(line + "\n")


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int) -> None:
    """Waits up to 15 s for a server to listen on ``port``."""
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing on port {port}")

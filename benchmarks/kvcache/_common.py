"""Shared benchmark plumbing: the environment facts every JSON line carries."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
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


def emit(record: dict[str, Any]) -> None:
    """Prints one JSON line."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()

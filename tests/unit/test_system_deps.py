"""scripts/system-deps.sh: what it does when packages are missing and it cannot install them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "system-deps.sh"


def run(tmp_path: Path, target: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Runs the script with a PATH that has only ``id`` and ``awk``: every tool and apt-get missing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("id", "awk"):
        found = shutil.which(tool)
        assert found is not None
        if not (bin_dir / tool).exists():
            os.symlink(found, bin_dir / tool)
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run([bash, str(SCRIPT), target], capture_output=True, text=True,
                          env={"PATH": str(bin_dir), **env}, timeout=30)  # fmt: skip


def test_missing_packages_are_named_with_the_command(tmp_path: Path) -> None:
    out = run(tmp_path, "test")
    assert out.returncode == 1
    assert out.stderr.startswith(
        "system-deps: missing util-linux xvfb openbox dbus xdotool wmctrl "
    )
    assert (
        "thunderbird chromium socat unzip jq xsel sysstat expect" in out.stderr
    )  # the desktop's, OSWorld's Chrome tasks and their setups' tools included
    assert (
        "redis-server redis-tools; install them with: sudo apt-get install -y util-linux"
        in out.stderr
    )
    assert out.stderr.count("\n") == 1  # one line


def test_desktop_names_the_desktop_packages(tmp_path: Path) -> None:
    out = run(tmp_path, "desktop")
    assert out.returncode == 1
    assert "xvfb openbox" in out.stderr
    assert "libreoffice-calc" in out.stderr
    assert "xterm" in out.stderr
    assert "chromium socat" in out.stderr
    assert "redis" not in out.stderr


def test_demo_needs_the_sandbox_tools_and_the_desktop(tmp_path: Path) -> None:
    out = run(tmp_path, "demo")
    assert out.returncode == 1
    assert "missing util-linux xvfb openbox" in out.stderr
    assert "redis" not in out.stderr


@pytest.mark.parametrize(("target", "code"), [("test", 0), ("nonsense", 0)])
def test_skip_variable(tmp_path: Path, target: str, code: int) -> None:
    assert run(tmp_path, target, SKIP_SYSTEM_DEPS="1").returncode == code


def test_unknown_target(tmp_path: Path) -> None:
    out = run(tmp_path, "nonsense")
    assert out.returncode == 2
    assert "unknown target 'nonsense'" in out.stderr

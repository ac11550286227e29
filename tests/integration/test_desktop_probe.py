"""Grading that holds: what a check executes cannot answer for the grader (real jails; needs root).

Each test writes a small task in OSWorld's format, fills a folder as the frozen
snapshot an episode would leave, and calls `grade_episode` directly: no desktop
is started, so these run in seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentinfra.environments import Finding, Outcome
from agentinfra.environments.desktop import _probe
from agentinfra.environments.desktop._episode import EpisodeResult
from agentinfra.environments.desktop._grading import (
    DesktopVerdict,
    apply_snapshot_downloads,
    grade_episode,
)
from agentinfra.environments.desktop._task import load_desktop_task, mirror_path
from agentinfra.sandbox import probe_sandbox_mode

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or probe_sandbox_mode() != "namespaces+uid",
    reason="the grading and probe jails need root",
)

SITE = ".local/lib/python3.11/site-packages"
CHECKER = "import glob\nprint('done' if glob.glob('/home/user/target.txt') else 'not done')\n"


def _task(tmp_path: Path, evaluator: dict[str, Any]) -> Any:
    path = tmp_path / "task.json"
    path.write_text(json.dumps({"id": "t", "instruction": "make target.txt", "config": [],
                                "evaluator": evaluator}))  # fmt: skip
    return load_desktop_task(path)


def _grade(tmp_path: Path, task: Any, files: dict[str, str], *, mirror: Path | None = None,
           **episode: Any) -> DesktopVerdict:  # fmt: skip
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir(parents=True, exist_ok=True)
    for relative, text in files.items():
        target = snapshot / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    result = EpisodeResult(
        "t", "pyautogui", "code", tmp_path, snapshot=snapshot, steps=1, **episode
    )
    return grade_episode(task, result, mirror)


CHECK_FILE = {"func": "exact_match", "result": {"type": "vm_file", "path": "/home/user/a.txt"},
              "expected": {"type": "rule", "rules": {"expected": "x"}}}  # fmt: skip


def _command_task(tmp_path: Path, command: str, expected: str) -> Any:
    return _task(tmp_path, {"func": "exact_match",
                            "result": {"type": "vm_command_line", "command": command, "shell": True},
                            "expected": {"type": "rule", "rules": {"expected": expected}}})  # fmt: skip


@pytest.mark.parametrize(
    "planted",
    [
        {f"{SITE}/usercustomize.py": "print('done')\nimport os\nos._exit(0)\n"},
        {f"{SITE}/sitecustomize.py": "print('done')\nimport os\nos._exit(0)\n"},
        {f"{SITE}/done.pth": "import os; print('done'); os._exit(0)\n"},
        {"Desktop/glob.py": "print('done')\nraise SystemExit(0)\n"},
        {".bashrc": "echo done; exit 0\n", ".bash_profile": "echo done; exit 0\n"},
    ],
    ids=["usercustomize", "sitecustomize", "pth", "module-beside-script", "bash-profile"],
)
@pytest.mark.parametrize(
    "command",
    ["cd Desktop && python3 script.py", "chmod +x ~/Desktop/script.py; ~/Desktop/script.py"],
)
def test_what_the_agent_plants_in_the_home_does_not_answer_a_python_check(
    tmp_path: Path, planted: dict[str, str], command: str
) -> None:
    task = _command_task(tmp_path, command, "done")
    verdict = _grade(
        tmp_path, task, {"Desktop/script.py": "#!/usr/bin/python3\n" + CHECKER, **planted}
    )
    assert (verdict.outcome, verdict.score) == (Outcome.FAILED, 0.0), verdict.findings
    gold = _grade(tmp_path, task, {"target.txt": "x"})
    assert (gold.outcome, gold.score) == (Outcome.PASSED, 1.0), gold.findings


def test_a_script_from_the_home_sees_neither_the_gold_nor_the_grader(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    url = "https://example.org/gold.txt"
    mirror_path(mirror, url).write_text("GOLD-SECRET\n")
    task = _task(tmp_path, {
        "func": ["check_include_exclude", "compare_text_file"],
        "result": [{"type": "vm_command_line", "command": "bash ~/eval.sh", "shell": True},
                   {"type": "vm_file", "path": "/home/user/answer.txt"}],
        "expected": [{"type": "rule", "rules": {"include": ["GOLD-SECRET"], "exclude": []}},
                     {"type": "cloud_file", "path": url, "dest": "gold.txt"}],
    })  # fmt: skip
    evil = ("cat /expected/* /home/user/../../expected/* 2>/dev/null; find / -name '*gold*' "
            "-exec cat {} + 2>/dev/null; ps -ef | grep -q evaluate && echo GOLD-SECRET; true\n")  # fmt: skip
    verdict = _grade(tmp_path, task, {"eval.sh": evil}, mirror=mirror)
    assert verdict.details["metric_scores"] == [0.0, 0.0] or verdict.details["metric_scores"] == {
        "check_include_exclude": 0.0,
        "compare_text_file": 0.0,
    }
    # A link in the home to the expected file reads as no file, not as the gold.
    os.symlink("/expected/0_gold.txt", tmp_path / "snapshot" / "answer.txt")
    linked = _grade(tmp_path, task, {}, mirror=mirror)
    assert linked.details["metric_scores"]["compare_text_file"] == 0.0


def test_a_checker_that_postconfig_downloads_is_the_mirrors_whatever_the_agent_left(
    tmp_path: Path,
) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    url = "https://example.org/check.py"
    mirror_path(mirror, url).write_text(CHECKER)
    evaluator = {
        "postconfig": [{"type": "download", "parameters": {"files": [
            {"url": url, "path": "/home/user/Desktop/check.py"}]}}],
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": "python ~/Desktop/check.py", "shell": True},
        "expected": {"type": "rule", "rules": {"expected": "done"}},
    }  # fmt: skip
    task = _task(tmp_path, evaluator)
    forged = _grade(tmp_path, task, {"Desktop/check.py": "print('done')\n"}, mirror=mirror,
                    snapshot_manifest={"modes": {"Desktop/check.py": 0, "Desktop": 0o500}})  # fmt: skip
    assert (forged.outcome, forged.score) == (Outcome.FAILED, 0.0), forged.findings
    gold = _grade(tmp_path, task, {"target.txt": "x"}, mirror=mirror)
    assert (gold.outcome, gold.score) == (Outcome.PASSED, 1.0), gold.findings
    # A link where the checker goes is refused, never followed: a blocking finding.
    elsewhere = tmp_path / "outside"
    elsewhere.mkdir()
    (tmp_path / "snapshot" / "Desktop" / "check.py").unlink()
    os.symlink(elsewhere, tmp_path / "snapshot" / "Desktop" / "check.py")
    (tmp_path / "snapshot" / "Desktop2").symlink_to(elsewhere)
    linked = _grade(tmp_path, task, {}, mirror=mirror)
    assert (linked.outcome, linked.score) == (Outcome.FAILED, 0.0)
    assert [f.check for f in linked.findings if f.severity == "block"] == ["postconfig_failed"]
    assert list(elsewhere.iterdir()) == []


def test_a_control_task_using_awk_which_and_shell_scores_honestly(tmp_path: Path) -> None:
    command = "echo $SHELL; which awk vi; awk -F, '{s += $2} END {print s}' ~/data.csv"
    task = _command_task(tmp_path, command, "/bin/bash\n/usr/bin/awk\n/usr/bin/vi\n6")
    idle = _grade(tmp_path / "idle", task, {})
    assert (idle.outcome, idle.score) == (Outcome.FAILED, 0.0)
    gold = _grade(tmp_path, task, {"data.csv": "a,1\nb,2\nc,3\n"})
    assert (gold.outcome, gold.score) == (Outcome.PASSED, 1.0), gold.findings


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("yes done | head -c 3000000", "more than"),
        ("echo done; exec >&-; sleep 60", "ran past 2 s"),
    ],
)
def test_the_probe_bounds_output_and_time_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, said: str
) -> None:
    monkeypatch.setattr(_probe, "PROBE_COMMAND_TIMEOUT_S", 2.0)
    verdict = _grade(tmp_path, _command_task(tmp_path, command, "done"), {})
    assert verdict.score == 0.0
    assert [f.check for f in verdict.findings if said in f.message] == ["probe"]


def test_episode_findings_and_setup_errors_make_one_verdict(tmp_path: Path) -> None:
    task = _command_task(tmp_path, "echo done", "done")
    assert _grade(tmp_path, task, {}).score == 1.0
    block = Finding(check="snapshot_over_budget", severity="block", message="left out 3 files")
    warn = Finding(check="action_time_limit", severity="warn", message="step 2 ran past 60 s")
    blocked = _grade(tmp_path, task, {}, findings=[block, warn])
    assert (blocked.outcome, blocked.score) == (Outcome.FAILED, 0.0)
    assert [f.check for f in blocked.findings] == ["snapshot_over_budget", "action_time_limit"]
    broken = _grade(tmp_path, task, {}, setup_error="setup step 0 (execute) exited 1")
    assert broken.outcome is Outcome.GRADER_ERROR
    assert [(f.check, f.severity) for f in broken.findings] == [("task_setup", "block")]


def test_the_probes_home_copy_keeps_sparse_files_sparse_and_the_recorded_modes(
    tmp_path: Path,
) -> None:
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    with (snapshot / "big.img").open("wb") as handle:
        handle.truncate(16 << 30)
    task = _command_task(tmp_path, "du -k big.img | cut -f1; stat -c %a run.sh", "0\n750")
    verdict = _grade(tmp_path, task, {"run.sh": "echo hi\n"},
                     snapshot_manifest={"modes": {"run.sh": 0o4750, "big.img": 0o644}})  # fmt: skip
    assert (verdict.outcome, verdict.score) == (Outcome.PASSED, 1.0), verdict.findings


@pytest.mark.skipif(
    shutil.which("dbus-run-session") is None or not Path("/usr/libexec/dconf-service").exists(),
    reason="needs dbus-run-session and dconf-service to write a dconf database",
)
def test_gsettings_reads_the_episodes_dconf_database_from_the_snapshot(tmp_path: Path) -> None:
    desktop = tmp_path / "desktop-home"
    (desktop / "run").mkdir(parents=True)
    env = {"HOME": str(desktop), "XDG_RUNTIME_DIR": str(desktop / "run"), "PATH": "/usr/bin:/bin"}
    subprocess.run(["dbus-run-session", "--", "gsettings", "set", "org.gnome.desktop.interface",
                    "text-scaling-factor", "1.5"], env=env, check=True, capture_output=True,
                   timeout=30)  # fmt: skip
    database = (desktop / ".config" / "dconf" / "user").read_bytes()
    task = _command_task(
        tmp_path, "gsettings get org.gnome.desktop.interface text-scaling-factor", "1.5"
    )
    assert _grade(tmp_path / "idle", task, {}).score == 0.0  # the schema's default, 1.0
    snapshot = tmp_path / "snapshot" / ".config" / "dconf"
    snapshot.mkdir(parents=True)
    (snapshot / "user").write_bytes(database)
    verdict = _grade(tmp_path, task, {})
    assert (verdict.outcome, verdict.score) == (Outcome.PASSED, 1.0), verdict.findings


def test_snapshot_downloads_follow_no_link_on_the_way(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    url = "https://example.org/gold.txt"
    mirror_path(mirror, url).write_text("gold\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    snapshot = tmp_path / "snapshot"
    (snapshot / "Documents").mkdir(parents=True)
    (snapshot / "Desktop").symlink_to(outside)
    (snapshot / "Documents" / "twin.txt").write_text("agent\n")
    os.link(snapshot / "Documents" / "twin.txt", snapshot / "Documents" / "gold.txt")
    steps = [{"type": "download", "parameters": {"files": [
        {"url": url, "path": "/home/user/Desktop/sub/gold.txt"},
        {"url": url, "path": "/home/user/Documents/gold.txt"},
        {"url": url, "path": "/home/user/../../etc/gold.txt"},
        {"url": url, "path": "/tmp/gold.txt"}]}}]  # fmt: skip
    task = _task(tmp_path, {**CHECK_FILE, "postconfig": steps})
    modes: dict[str, int] = {"Documents": 0}
    findings = apply_snapshot_downloads(task, snapshot, mirror, modes)
    assert [f.check for f in findings] == ["postconfig_failed"] * 3
    assert "symbolic link" in findings[0].message
    assert "not a plain path inside the home" in findings[1].message
    assert "outside /home/user" in findings[2].message
    assert list(outside.iterdir()) == []
    assert (snapshot / "Documents" / "gold.txt").read_text() == "gold\n"
    assert (snapshot / "Documents" / "twin.txt").read_text() == "agent\n"  # not written through
    assert modes == {"Documents": 0o700, "Documents/gold.txt": 0o644}

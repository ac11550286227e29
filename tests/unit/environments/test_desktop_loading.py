"""Honest loading: each rule of `load_desktop_task` and `support`, on small tasks in OSWorld's format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentinfra.environments.desktop._task import (
    OSWORLD_GETTERS,
    OSWORLD_METRICS,
    load_desktop_task,
    mirror_path,
    support,
)
from agentinfra.errors import TaskEnvironmentError

CHECK = {"func": "exact_match", "result": {"type": "vm_file", "path": "/home/user/a.txt"},
         "expected": {"type": "rule", "rules": {"expected": "x"}}}  # fmt: skip


def _task(tmp_path: Path, config: list[Any] | None = None, **evaluator: Any) -> Any:
    path = tmp_path / "task.json"
    raw = {
        "id": "t",
        "instruction": "do it",
        "config": config or [],
        "evaluator": {**CHECK, **evaluator},
    }
    path.write_text(json.dumps(raw))
    return load_desktop_task(path)


def _command(command: Any, shell: bool = True) -> dict[str, Any]:
    return {"result": {"type": "vm_command_line", "command": command, "shell": shell}}


def _reason(tmp_path: Path, mirror: Path | None = None, *args: Any, **kwargs: Any) -> str:
    verdict = support(_task(tmp_path, *args, **kwargs), mirror)
    assert verdict.supported == (verdict.reason == "")
    return verdict.reason


def test_a_func_osworld_defines_but_we_lack_loads_and_is_not_implemented(tmp_path: Path) -> None:
    assert "check_python_file_by_test_suite" in OSWORLD_METRICS
    reason = _reason(tmp_path, None, func="check_python_file_by_test_suite")
    assert reason == "not implemented: check_python_file_by_test_suite (an OSWorld evaluator func)"


def test_a_getter_osworld_defines_but_we_lack_loads_and_is_not_implemented(tmp_path: Path) -> None:
    assert "vscode_config" in OSWORLD_GETTERS
    reason = _reason(
        tmp_path, None, result={"type": "vscode_config", "vscode_extension_command": "x"}
    )
    assert reason.startswith("not implemented: vscode_config")


def test_only_names_osworld_does_not_define_are_unknown(tmp_path: Path) -> None:
    with pytest.raises(
        TaskEnvironmentError, match="unknown evaluator func 'is_good': OSWorld defines no"
    ):
        _task(tmp_path, func="is_good")
    with pytest.raises(TaskEnvironmentError, match="unknown result getter type 'telepathy'"):
        _task(tmp_path, result={"type": "telepathy"})


@pytest.mark.parametrize(
    "command",
    ['export PATH="$HOME/bin:$PATH"; "$HOME/setup.sh"', 'X=1 nohup ./my_process.sh > /dev/null 2>&1 &',
     "echo password | sudo -S apt-get install zsh -y"],
)  # fmt: skip
def test_a_shell_string_is_not_refused_for_its_first_word(tmp_path: Path, command: str) -> None:
    # Checked by running it (a failed setup step is a finding), not by guessing a program name.
    config = [{"type": "execute", "parameters": {"command": command, "shell": True}}]
    assert _reason(tmp_path, None, config) == ""


def test_programs_named_for_sure_are_still_checked(tmp_path: Path) -> None:
    code = [{"type": "launch", "parameters": {"command": "sleep 1; code --x", "shell": True}}]
    assert "VS Code" in _reason(tmp_path, None, code)
    chrome = [
        {"type": "launch", "parameters": {"command": "sleep 1; google-chrome --x", "shell": True}}
    ]
    assert _reason(tmp_path, None, chrome) == ""  # Chromium's launcher in the desktop
    absent = [{"type": "execute", "parameters": {"command": ["no-such-program-here", "-v"]}}]
    assert (
        _reason(tmp_path, None, absent)
        == "needs program 'no-such-program-here', not installed here"
    )


def test_any_url_in_the_mirror_is_served_google_drive_too(tmp_path: Path) -> None:
    url = "https://drive.google.com/uc?id=1abc&export=download"
    config = [
        {"type": "download", "parameters": {"files": [{"url": url, "path": "/home/user/a.xlsx"}]}}
    ]
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    assert "is not in the mirror" in _reason(tmp_path, mirror, config)
    mirror_path(mirror, url).write_bytes(b"x")
    assert _reason(tmp_path, mirror, config) == ""


def test_a_live_postconfig_step_after_a_download_is_unsupported(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    url = "https://example.org/check.sh"
    mirror_path(mirror, url).write_bytes(b"echo ok\n")
    download = {
        "type": "download",
        "parameters": {"files": [{"url": url, "path": "/home/user/check.sh"}]},
    }
    run = {"type": "execute", "parameters": {"command": ["bash", "/home/user/check.sh"]}}
    assert _reason(tmp_path, mirror, postconfig=[run, download]) == ""
    assert _reason(tmp_path, mirror, postconfig=[download, run]) == (
        "postconfig step 1 (execute) follows a download; downloads apply to the frozen snapshot"
    )
    outside = {"type": "download", "parameters": {"files": [{"url": url, "path": "/tmp/check.sh"}]}}
    assert "outside /home/user" in _reason(tmp_path, mirror, postconfig=[outside])


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("ps -ef | grep my_process.sh", "reads the live process list"),  # OSWorld os/cc9d4f34
        ("dpkg -l | grep mahjongg", "reads the installed packages"),  # os/ddc75b62
        ("[ -d '/test' ] && echo 'Directory exists.' || echo no", "reads /test, outside /home/user"),  # os/43c2d64c
        ("cat $(ls /tmp/out.txt)", "reads /tmp/out.txt"),
        ("which spotify", ""),  # os/94d95f96: the probe has the desktop's PATH and /etc/alternatives
        ("echo $SHELL", ""),  # os/6ebbfb01: SHELL=/bin/bash as in the desktop
        ("awk -F, '{s += $2} END {print s}' /home/user/a.csv 2>/dev/null", ""),
        ("gsettings get org.gnome.desktop.interface text-scaling-factor", ""),
        ("grep '/bin/sh ./x.sh' ~/log.txt", ""),
    ],
)  # fmt: skip
def test_a_check_reading_live_state_the_episode_does_not_record_is_unsupported(
    tmp_path: Path, command: str, reason: str
) -> None:
    found = _reason(tmp_path, None, **_command(command))
    assert (reason in found) if reason else found == ""


def test_a_list_command_is_checked_by_its_first_word(tmp_path: Path) -> None:
    assert "live process list" in _reason(
        tmp_path, None, **_command(["pgrep", "-f", "x"], shell=False)
    )
    assert (
        _reason(tmp_path, None, **_command(["stat", "-c", "%a", "/home/user/a.sh"], shell=False))
        == ""
    )


def test_a_newline_starts_a_command_as_a_semicolon_does(tmp_path: Path) -> None:
    # OSWorld multi_apps/3680a5ee: an export, then gnome-terminal on the next line
    step = {"type": "execute", "parameters": {"shell": True, "command":
            "export DBUS_SESSION_BUS_ADDRESS='unix:path=/run/user/1000/bus'\ngnome-terminal --maximize"}}  # fmt: skip
    assert "needs GNOME Terminal" in _reason(tmp_path, None, [step])


def _cache_file(name: str = "mail.ls", **params: Any) -> dict[str, Any]:
    """OSWorld's thunderbird/a10b69e1 shape: a postconfig step's stdout, read by a cache_file getter."""
    step = {"type": "command", "parameters": {"command": ["ls", "-R", "/home/user/Mail"], "stdout": name,
                                              **params}}  # fmt: skip
    return {"func": "check_list", "result": {"type": "cache_file", "path": "mail.ls"},
            "expected": {"type": "rule", "rules": {"expect": ["Work"]}}, "postconfig": [step]}  # fmt: skip


def test_a_cache_file_reads_a_postconfig_steps_stdout_run_as_a_check(tmp_path: Path) -> None:
    from agentinfra.environments.desktop._episode import live_postconfig

    assert _reason(tmp_path, None, **_cache_file()) == ""
    task = _task(tmp_path, **_cache_file())
    assert live_postconfig(task) == []  # never on the live desktop: in the probe, on the snapshot
    assert list(task.output_steps()) == ["mail.ls"]
    assert "which no postconfig step writes" in _reason(tmp_path, None, **_cache_file("other.ls"))


def test_a_cache_file_step_must_be_answerable_by_the_probe_and_come_last(tmp_path: Path) -> None:
    evaluator = _cache_file()
    step = evaluator["postconfig"][0]
    apt = {**step, "parameters": {**step["parameters"], "command": ["apt", "list", "--installed"]}}
    assert "reads the installed packages" in _reason(
        tmp_path, None, **{**evaluator, "postconfig": [apt]}
    )
    save = {"type": "execute", "parameters": {"command": ["python3", "-c", "print(1)"]}}
    assert _reason(tmp_path, None, **{**evaluator, "postconfig": [save, step]}) == ""
    assert "follows step 0, whose output a cache_file getter reads" in _reason(
        tmp_path, None, **{**evaluator, "postconfig": [step, save]}
    )
    assert "stderr" in _reason(tmp_path, None, **_cache_file(stderr="err.out"))
    assert "repeats until" in _reason(tmp_path, None, **_cache_file(until={"returncode": 0}))
    assert "not a plain file name" in _reason(
        tmp_path,
        None,
        **{**_cache_file("../mail.ls"), "result": {"type": "cache_file", "path": "../mail.ls"}},
    )


def test_a_download_before_a_cache_file_step_applies_to_what_it_reads(tmp_path: Path) -> None:
    # OSWorld's thunderbird/dfac9ee8: a checker downloaded in postconfig, then run for its stdout
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    url = "https://example.org/list.py"
    mirror_path(mirror, url).write_bytes(b"print('Work')\n")
    download = {
        "type": "download",
        "parameters": {"files": [{"url": url, "path": "/home/user/list.py"}]},
    }
    run = {
        "type": "execute",
        "parameters": {"command": ["python3", "/home/user/list.py"], "stdout": "mail.ls"},
    }
    assert _reason(tmp_path, mirror, **{**_cache_file(), "postconfig": [download, run]}) == ""


def test_a_comment_in_a_shell_check_does_not_hide_the_next_line(tmp_path: Path) -> None:
    # joined into one line first, "# note" ran to the end of the text and hid `ps` from the check
    assert "live process list" in _reason(
        tmp_path, None, **_command("echo hi # note\nps aux | grep x")
    )
    assert _reason(tmp_path, None, **_command("echo 'a # not a comment' x#y")) == ""


def _checker(tmp_path: Path, script: str, chmod: str = "chmod +x eval.sh") -> tuple[Any, Path]:
    """OSWorld's os/4d117223 shape: eval.sh downloaded to a relative path, chmod'ed, then run."""
    mirror = tmp_path / "mirror"
    mirror.mkdir(exist_ok=True)
    url = "https://example.org/eval.sh"
    mirror_path(mirror, url).write_text(script)
    evaluator = {
        "func": "check_include_exclude",
        "result": {"type": "vm_command_line", "command": "bash eval.sh", "shell": True},
        "expected": {"type": "rule", "rules": {"include": ["ok"], "exclude": []}},
        "postconfig": [{"type": "download", "parameters": {"files": [{"url": url, "path": "eval.sh"}]}},
                       {"type": "execute", "parameters": {"command": chmod, "shell": True}}],
    }  # fmt: skip
    return _task(tmp_path, **evaluator), mirror


def test_a_downloaded_checker_is_read_for_what_it_needs_and_its_chmod_applies_to_the_snapshot(
    tmp_path: Path,
) -> None:
    from agentinfra.environments.desktop._episode import live_postconfig
    from agentinfra.environments.desktop._task import snapshot_chmods

    task, mirror = _checker(
        tmp_path, "#!/bin/bash\n# checks the home\n[ -f ~/out.txt ] && echo ok\n"
    )
    assert support(task, mirror).reason == ""
    assert snapshot_chmods(task) == {1: ("+x", ["/home/user/eval.sh"])}
    assert live_postconfig(task) == []
    task, mirror = _checker(
        tmp_path, 'BASE_DIR="/tmp/test_files"\nls "$BASE_DIR" && echo ok\n'
    )  # os/37887e8c
    assert "the check runs eval.sh: the check reads /tmp/test_files" in support(task, mirror).reason
    task, mirror = _checker(tmp_path, "# a comment first\npgrep -f app && echo ok\n")
    assert "live process list" in support(task, mirror).reason
    task, mirror = _checker(tmp_path, "echo 'unbalanced\n")
    assert "cannot be read" in support(task, mirror).reason
    # a chmod of anything else is a live step after a download, as before
    task, mirror = _checker(tmp_path, "echo ok\n", chmod="chmod +x eval.sh other.sh")
    assert "follows a download" in support(task, mirror).reason


def test_chmod_modes_as_chmod_reads_them() -> None:
    from agentinfra.environments.desktop._task import chmod_mode

    assert chmod_mode("+x", 0o644) == 0o755
    assert chmod_mode("u+x", 0o644) == 0o744
    assert chmod_mode("go-r", 0o644) == 0o600
    assert chmod_mode("a+rw", 0o400) == 0o666
    assert chmod_mode("755", 0o600) == 0o755
    assert chmod_mode("000", 0o644) == 0
    assert chmod_mode("u=rwx", 0o644) is None  # not read: the step stays live


def test_only_a_script_a_check_runs_is_a_checker_not_one_it_names(tmp_path: Path) -> None:
    # os-chmod: the check stats ~/backup.sh, which the setup downloaded; the agent's chmod must stand
    from agentinfra.environments.desktop._task import setup_checkers

    config = [
        {
            "type": "download",
            "parameters": {"files": [{"url": "https://e.org/b.sh", "path": "/home/user/b.sh"}]},
        }
    ]
    named = _task(tmp_path, config, **_command("stat -c %a /home/user/b.sh"))
    assert setup_checkers(named) == []
    for command in ("bash b.sh", "./b.sh", "cd /home/user && sh -e /home/user/b.sh | grep ok"):
        assert [
            path for _, path, _ in setup_checkers(_task(tmp_path, config, **_command(command)))
        ] == ["/home/user/b.sh"], command

"""The desktop environment on a real desktop: Xvfb, openbox, AT-SPI and LibreOffice in the jail.

Every test here starts real episodes; the known tricks each get one, scored by the
real grader. The full audit of the shipped tasks runs last (slow).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentinfra.environments import Outcome
from agentinfra.environments.desktop import (
    DesktopSession,
    audit,
    default_mirror,
    load_desktop_task,
    run_scripted,
)
from agentinfra.environments.desktop._session import check_prerequisites
from agentinfra.environments.desktop._task import support
from agentinfra.errors import TaskEnvironmentError
from agentinfra.sandbox import pids_by_uid

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "desktop" / "tasks"
MIRROR = ROOT / "examples" / "desktop" / "mirror"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _desktop_available() -> None:
    try:
        check_prerequisites()
    except TaskEnvironmentError as exc:  # the Makefile installs everything; say what is missing
        pytest.fail(str(exc))


def play(
    task_id: str,
    actions: list[Any],
    tmp_path: Path,
    *,
    space: str = "pyautogui",
    track: str = "code",
) -> Any:
    task = load_desktop_task(TASKS / f"{task_id}.json")
    return run_scripted(task, space, actions, mirror=MIRROR, track=track, episode_dir=tmp_path / "episode",
                        accessibility=False)  # fmt: skip


def test_calc_observation_screenshot_and_accessibility_tree(tmp_path: Path) -> None:
    asyncio.run(_calc_observation())


async def _calc_observation() -> None:
    async with DesktopSession() as session:
        await session.start()
        launched = await session.request(
            "launch", command=["soffice", "--calc", "--norestore"], wait_s=20
        )
        assert launched["window"]
        png, pointer = await session.screenshot()
        assert png.startswith(b"\x89PNG")
        assert len(png) > 5000
        import io

        from PIL import Image

        image = Image.open(io.BytesIO(png))
        assert image.size == (1920, 1080)
        # the pointer is drawn in: its outline is black on the white sheet
        assert image.getpixel((pointer[0], pointer[1] + 1)) in ((0, 0, 0), (255, 255, 255))
        reply = await session.request("accessibility", max_nodes=5000)
        xml = reply["xml"]
        assert reply["ok"]
        assert "LibreOffice Calc" in xml
        assert 'name="A1"' in xml
        assert "menu" in xml
        # the jail: its own uid, no network, no view of the checkout or the task files
        probe = (await session.request("execute", command="id -u; cat /proc/net/dev | wc -l; ls /work /root 2>&1 | "
                                       "head -2; echo $HOME", shell=True, timeout=10))["output"]  # fmt: skip
        uid, net_lines, *rest = probe.split("\n")
        assert int(uid) == session.uid
        assert int(uid) != 0
        assert int(net_lines) <= 3  # only loopback
        assert "No such file" in "\n".join(rest)
        assert "/home/user" in probe
        assert not (TASKS.exists() and str(ROOT) in probe)
    assert session.uid not in pids_by_uid()


def test_gimp_vlc_thunderbird_and_chromium_start_in_the_jail_past_their_first_run_and_die_with_it() -> (
    None
):
    asyncio.run(_shipped_apps())


async def _shipped_apps() -> None:
    async with DesktopSession() as session:
        await session.start()
        for command, title in ((["gimp"], "GNU Image Manipulation Program"), (["vlc"], "VLC media player"),
                               (["thunderbird"], "Mozilla Thunderbird"),
                               (["google-chrome", "--remote-debugging-port=1337"], "Chromium")):  # fmt: skip
            launched = await session.request("launch", command=command, wait_s=90)
            assert launched["ok"], (command, launched)
            assert launched["window"], (command, launched)
            titles = ""
            for _ in range(60):  # GIMP shows its splash first, then its main window
                titles = (
                    await session.request("execute", command="wmctrl -l", shell=True, timeout=10)
                )["output"]
                if title in titles:
                    break
                await asyncio.sleep(1)
            assert title in titles, titles
            # no first-run question left open: GIMP's profile copied from /etc/gimp, VLC's network question
            assert "User Installation" not in titles, titles
            assert "Network Access" not in titles, titles
        uid = session.uid
        running = (
            await session.request(
                "execute", command="ps -o comm= -u $(id -u)", shell=True, timeout=10
            )
        )["output"]
        assert {"gimp", "vlc", "thunderbird", "google-chrome", "chromium"} <= set(
            running.split()
        ), running
        profile = (
            await session.request(
                "execute", command="ls ~/.config/google-chrome", shell=True, timeout=10
            )
        )["output"]
        assert "Default" in profile.split(), profile  # where OSWorld's getters read
        for command, code, said in (
            (
                "echo pw | sudo -S apt-get update -y && echo pw | sudo -S apt-get install -y unzip",
                0,
                "",
            ),
            (
                "sudo apt install no-such-package",
                100,
                "package no-such-package is not in this desktop",
            ),
            ("sudo rm -rf /home/user/Desktop", 1, "the desktop user has no root"),
        ):  # OSWorld's setups install tools with sudo; the desktop has them and no root
            done = await session.request("execute", command=command, shell=True, timeout=10)
            assert (done["returncode"], said in done["error"]) == (code, True), done
    assert uid not in pids_by_uid()


def test_scripted_calc_solution_passes_in_every_action_space(tmp_path: Path) -> None:
    task = load_desktop_task(TASKS / "calc-max.json")  # pyautogui space
    solution = task.solution()
    assert solution is not None
    verdict = run_scripted(task, solution["action_space"], solution["actions"], mirror=MIRROR,
                           episode_dir=tmp_path / "e")  # fmt: skip
    assert verdict.outcome is Outcome.PASSED
    assert verdict.score == 1.0
    assert verdict.action_space == "pyautogui"
    episode = tmp_path / "e"
    assert (episode / "step-000.png").is_file()
    assert (episode / "step-001.xml").is_file()
    assert (episode / "step-001.a11y.tsv").read_text().startswith("tag\tname\ttext")
    assert len((episode / "actions.jsonl").read_text().splitlines()) == len(solution["actions"])
    assert json.loads((episode / "verdict.json").read_text())["outcome"] == "passed"


def test_cli_run_json_is_one_object(tmp_path: Path) -> None:
    actions = tmp_path / "actions.json"
    actions.write_text(json.dumps({"action_space": "computer_use", "actions": [
        {"action": "type", "text": "mkdir ~/Documents/Projects\n"}, {"action": "wait", "duration": 1}]}))  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "agentinfra", "desktop", "run", str(TASKS / "os-mkdir.json"),
                          "--actions", str(actions), "--out", str(tmp_path / "ep"), "--json"],
                         capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout)
    assert {"schema_version", "task_id", "outcome", "score", "steps", "track", "findings", "episode_dir",
            "provenance"} <= set(verdict)  # fmt: skip
    assert verdict["outcome"] == "passed"
    assert verdict["action_space"] == "computer_use"
    assert verdict["steps"] == 2


def test_shell_profile_that_echoes_the_answer_fails(tmp_path: Path) -> None:
    code = ("import os\nfor f in ('.bashrc', '.profile', '.bash_profile'):\n"
            "    open(os.path.expanduser('~/' + f), 'a').write('echo yes; exit 0\\n')")  # fmt: skip
    verdict = play("os-mkdir", [code, "DONE"], tmp_path)
    assert verdict.outcome is Outcome.FAILED
    assert verdict.score == 0.0
    assert "echo yes" in (tmp_path / "episode" / "snapshot" / ".bashrc").read_text()


def test_a_cache_file_is_the_probes_output_not_what_the_agent_wrote(tmp_path: Path) -> None:
    """os-mail-folders: its postconfig commands run in the probe on the snapshot, so an ``ls`` stub on
    the agent's PATH and a planted ``mail.ls`` in the home or /tmp do not answer for the folders."""
    code = ("import os\nh = os.path.expanduser('~')\nos.makedirs(h + '/Mail', exist_ok=True)\n"
            "open(h + '/Mail/folders.csv', 'w').write('name,purpose\\nWork,job\\nHome,family\\n')\n"
            "os.makedirs(h + '/bin', exist_ok=True)\n"
            "open(h + '/bin/ls', 'w').write('#!/bin/sh\\necho Work\\necho Home\\n')\nos.chmod(h + '/bin/ls', 0o755)\n"
            "open(h + '/.bashrc', 'a').write('export PATH=$HOME/bin:$PATH\\n')\n"
            "for p in (h + '/mail.ls', '/tmp/mail.ls'):\n    open(p, 'w').write('Work\\nHome\\n')")  # fmt: skip
    verdict = play("os-mail-folders", [code, "DONE"], tmp_path)
    assert verdict.score == 0.0, verdict
    assert (tmp_path / "episode" / "snapshot" / "bin" / "ls").exists()  # the stub was there
    # the folders made as well: both checks pass, with the CSV read by its header
    made = code + "\nfor d in ('Work', 'Home'):\n    os.makedirs(h + '/Mail/' + d)"
    assert play("os-mail-folders", [made, "DONE"], tmp_path / "made").score == 1.0


def test_a_downloaded_checker_is_the_mirrors_whatever_the_agent_left_at_its_path(
    tmp_path: Path,
) -> None:
    """os-backup-notes: postconfig downloads eval.sh (a relative path: the home) and chmods it (applied
    to the snapshot); the agent's own eval.sh, or a link there, does not answer for the backups."""
    forged = ("import os\np = os.path.expanduser('~/eval.sh')\n"
              "open(p, 'w').write('#!/bin/sh\\necho Success: every note is backed up.\\n')\nos.chmod(p, 0o755)")  # fmt: skip
    assert play("os-backup-notes", [forged, "DONE"], tmp_path / "forged").score == 0.0
    linked = "import os\nos.symlink('/bin/true', os.path.expanduser('~/eval.sh'))"
    verdict = play("os-backup-notes", [linked, "DONE"], tmp_path / "linked")
    assert verdict.score == 0.0
    assert any(f.check == "postconfig_failed" for f in verdict.findings), verdict.findings
    solved = ("import os, shutil\nn = os.path.expanduser('~/notes')\n"
              "for f in ('a', 'b'):\n    shutil.copy(f'{n}/{f}.txt', f'{n}/{f}.bak')")  # fmt: skip
    assert play("os-backup-notes", [solved, "DONE"], tmp_path / "solved").score == 1.0
    half = "import os, shutil\nn = os.path.expanduser('~/notes')\nshutil.copy(n + '/a.txt', n + '/a.bak')"
    assert play("os-backup-notes", [half, "DONE"], tmp_path / "half").score == 0.0


def test_a_checker_the_setup_downloads_is_written_again_before_the_check(tmp_path: Path) -> None:
    """OSWorld's os/5c1075ca shape: eval.sh downloaded and chmod'ed in the setup, run by the check.
    The agent's rewrite of it does not answer: the mirror's bytes and the setup's mode are restored
    in the snapshot first."""
    raw = json.loads((TASKS / "os-backup-notes.json").read_text())
    download, chmod = raw["evaluator"].pop("postconfig")
    raw["config"] = [download, chmod, *raw["config"]]
    (tmp_path / "task.json").write_text(json.dumps(raw))
    task = load_desktop_task(tmp_path / "task.json")
    assert support(task, MIRROR).supported

    def run(code: str, name: str) -> Any:
        return run_scripted(task, "pyautogui", [code, "DONE"], mirror=MIRROR, track="code",
                            episode_dir=tmp_path / name, accessibility=False)  # fmt: skip

    forged = ("import os\np = os.path.expanduser('~/eval.sh')\n"
              "open(p, 'w').write('#!/bin/sh\\necho Success: every note is backed up.\\n')")  # fmt: skip
    assert run(forged, "forged").score == 0.0
    solved = ("import os, shutil\nn = os.path.expanduser('~/notes')\n"
              "for f in ('a', 'b'):\n    shutil.copy(f'{n}/{f}.txt', f'{n}/{f}.bak')\n"
              "os.chmod(os.path.expanduser('~/eval.sh'), 0o600)")  # fmt: skip
    assert run(solved, "solved").score == 1.0  # the setup's +x restored: ./eval.sh runs


def test_stub_program_named_like_the_check_fails(tmp_path: Path) -> None:
    code = ("import os\nos.makedirs(os.path.expanduser('~/bin'), exist_ok=True)\n"
            "p = os.path.expanduser('~/bin/stat')\nopen(p, 'w').write('#!/bin/sh\\necho 755\\n')\nos.chmod(p, 0o755)\n"
            "open(os.path.expanduser('~/.bashrc'), 'a').write('export PATH=$HOME/bin:$PATH\\n')")  # fmt: skip
    verdict = play("os-chmod", [code, "DONE"], tmp_path)
    assert verdict.outcome is Outcome.FAILED
    assert verdict.score == 0.0


def test_planted_expected_file_in_a_cache_is_never_read(tmp_path: Path) -> None:
    planted = ("import os\nfrom pathlib import Path\n"
               "for d in ('~/cache', '~/.cache', '/tmp/cache', '~/.cache/osworld', '~'):\n"
               "    p = Path(os.path.expanduser(d)); p.mkdir(parents=True, exist_ok=True)\n"
               "    for name in os.listdir(p) if p.is_dir() else []: pass\n"
               "    (p / 'hello.txt').write_text('wrong\\n')\n"
               "Path(os.path.expanduser('~/Desktop/hello.txt')).write_text('wrong\\n')")  # fmt: skip
    verdict = play("os-write-file", [planted, "DONE"], tmp_path)
    assert verdict.outcome is Outcome.FAILED
    assert verdict.score == 0.0


def test_background_process_cannot_change_files_after_the_episode(tmp_path: Path) -> None:
    code = ("import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 3; echo hello world > ~/Desktop/hello.txt'],"
            " start_new_session=True)")  # fmt: skip
    started = time.monotonic()
    verdict = play("os-write-file", [code, "DONE"], tmp_path)
    assert verdict.outcome is Outcome.FAILED
    assert verdict.score == 0.0
    time.sleep(max(0.0, 4.5 - (time.monotonic() - started)))
    assert not (tmp_path / "episode" / "snapshot" / "Desktop" / "hello.txt").exists()


def test_gui_only_track_refuses_writing_the_graded_file_by_code(tmp_path: Path) -> None:
    code = "open('/home/user/Desktop/hello.txt', 'w').write('hello world\\n')"
    verdict = play("os-write-file", [code, "DONE"], tmp_path, track="gui-only")
    assert verdict.outcome is Outcome.FAILED
    assert verdict.score == 0.0
    assert [f.check for f in verdict.findings] == ["action_refused"]
    assert "gui-only track" in verdict.findings[0].message
    # the same code on the code track does write it (the track is what refused it)
    verdict = play("os-write-file", [code, "DONE"], tmp_path / "code", track="code")
    assert verdict.score == 1.0


def test_infeasible_task_scores_only_a_final_fail(tmp_path: Path) -> None:
    assert (
        play("os-infeasible-photoshop", ["FAIL"], tmp_path / "a", space="computer_13").score == 1.0
    )
    assert (
        play("os-infeasible-photoshop", ["WAIT", "DONE"], tmp_path / "b", space="computer_13").score
        == 0.0
    )
    assert play("os-mkdir", ["FAIL"], tmp_path / "c", space="computer_13").score == 0.0


def test_two_desktops_at_once(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    task = load_desktop_task(TASKS / "os-sort.json")
    solution = task.solution()
    assert solution is not None
    with ThreadPoolExecutor(2) as pool:
        verdicts = list(pool.map(lambda i: run_scripted(task, solution["action_space"], solution["actions"],
                                                        mirror=MIRROR, episode_dir=tmp_path / str(i),
                                                        accessibility=False), range(2)))  # fmt: skip
    assert [v.score for v in verdicts] == [1.0, 1.0]


def test_audit_of_every_shipped_task() -> None:
    paths = sorted(TASKS.glob("*.json"))
    rows = audit(paths, default_mirror(paths[0]), workers=2)
    flagged = [row.to_json() for row in rows if row.flagged]
    assert not flagged, json.dumps(flagged, indent=1)
    assert len(rows) >= 25


def test_desktop_behind_the_environment_seam() -> None:
    import asyncio

    from agentinfra.environments import Submission, environment_definition

    definition = environment_definition("desktop")
    task = definition.load_task(TASKS / "os-rename.json")
    environment = definition.open(task, {})
    solution = load_desktop_task(TASKS / "os-rename.json").solution()
    submission = Submission(
        json.dumps(solution).encode(), name="actions.json", media_type="application/json"
    )
    evaluation = asyncio.run(environment.evaluate(submission))
    assert evaluation.environment == "desktop"
    assert evaluation.score == 1.0
    assert evaluation.correct
    assert evaluation.details["action_space"] == "computer_13"
    with pytest.raises(TaskEnvironmentError, match="application/json"):
        asyncio.run(environment.evaluate(Submission(b"x", media_type="text/x-python")))


def test_an_episode_cannot_read_task_gold_or_mirror_files(tmp_path: Path) -> None:
    targets = [str(TASKS / "os-write-file.json"), str(MIRROR), str(ROOT / "examples" / "desktop" / "make_tasks.py"),
               str(ROOT / "README.md"), "/expected"]  # fmt: skip
    code = ("import os\nfound = [p for p in " + repr(targets) + " if os.path.exists(p)]\n"
            "open('/home/user/Desktop/hello.txt', 'w').write(repr(found))")  # fmt: skip
    verdict = play("os-write-file", [code, "DONE"], tmp_path)
    assert (tmp_path / "episode" / "snapshot" / "Desktop" / "hello.txt").read_text() == "[]"
    assert verdict.score == 0.0

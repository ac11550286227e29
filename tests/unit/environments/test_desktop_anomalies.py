"""Desktop anomalies from action journals: each check fires on its case and stays quiet on an honest episode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentinfra.environments import RunView
from agentinfra.environments.desktop._anomalies import desktop_anomalies
from agentinfra.errors import AgentInfraError

OUT = "/home/user/out.txt"


def task(tmp_path: Path, task_id: str, *, apps: tuple[str, ...] = ("libreoffice_calc",)) -> Path:
    path = tmp_path / f"{task_id}.json"
    path.write_text(json.dumps({
        "id": task_id, "snapshot": "libreoffice_calc", "instruction": f"do {task_id}", "source": "test",
        "config": [], "related_apps": list(apps),
        "evaluator": {"func": "compare_text_file", "result": {"type": "vm_file", "path": OUT, "dest": "out.txt"},
                      "expected": {"type": "cloud_file", "path": "https://x.example/out.txt", "dest": "out.txt"}},
    }))  # fmt: skip
    return path


def run(
    tmp_path: Path,
    name: str,
    task_path: Path,
    entries: list[dict[str, Any]],
    *,
    passed: bool = True,
    final: str = "agent:final-done.tar",
    track: str = "gui-only",
) -> RunView:
    workspace = tmp_path / name / "agent" / "workspace"
    (workspace / "episode").mkdir(parents=True)
    (workspace / "episode" / "actions.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in entries)
    )
    submission = {"source": final, "outcome": "passed" if passed else "failed",
                  "score": 1.0 if passed else None}  # fmt: skip
    return RunView(path=tmp_path / name, task=task_path, workspace=workspace,
                   submissions=(submission,), options={"track": track})  # fmt: skip


def act(step: int, action: Any, out: str | None, **extra: Any) -> dict[str, Any]:
    return {"step": step, "turn": step + 1, "action": action, "code": "pyautogui.x()", "wait_s": 0,
            "files": {OUT: out}, **extra}  # fmt: skip


SETUP = {"step": 0, "turn": 1, "setup": True, "files": {OUT: None}}
CLICK = {"action": "left_click", "coordinate": [10, 10]}


def checks(found: list[Any]) -> list[tuple[str, str, int | None]]:
    return [(Path(a.run).name, a.check, a.step) for a in found]


def test_an_honest_gui_episode_has_no_anomaly(tmp_path: Path) -> None:
    entries = [SETUP, act(1, CLICK, None), act(2, {"action": "type", "text": "42\n"}, None),
               act(3, {"action": "key", "text": "ctrl+s"}, "aa"), act(4, {"action": "type", "text": "7\n"}, "aa"),
               act(5, {"action": "key", "text": "ctrl+s"}, "bb"), {"step": 5, "action": "DONE"}]  # fmt: skip
    assert desktop_anomalies([run(tmp_path, "r", task(tmp_path, "t1"), entries)]) == []


def test_a_file_typed_into_a_shell_in_one_step_is_flagged(tmp_path: Path) -> None:
    entries = [SETUP, act(1, CLICK, None),
               act(2, {"action": "type", "text": "echo 42 > ~/out.txt\n"}, "final"), {"step": 2, "action": "DONE"}]  # fmt: skip
    views = [run(tmp_path, "r", task(tmp_path, "t1"), entries)]
    assert checks(desktop_anomalies(views)) == [("r", "one_step_write", 2)]
    assert desktop_anomalies(views)[0].turn == 3
    # the same in a terminal task is how the task is meant to be done
    terminal = [run(tmp_path, "s", task(tmp_path, "t2", apps=("terminal",)), entries)]
    assert desktop_anomalies(terminal) == []
    # and an episode that did not pass is not flagged for it
    assert (
        desktop_anomalies([run(tmp_path, "u", task(tmp_path, "t3"), entries, passed=False)]) == []
    )


def test_code_that_writes_the_file_on_the_code_track_is_flagged(tmp_path: Path) -> None:
    code = "import openpyxl  # writes the file"
    entries = [SETUP, act(1, code, "final"), {"step": 1, "action": "DONE"}]
    views = [run(tmp_path, "r", task(tmp_path, "t1"), entries, track="code")]
    assert checks(desktop_anomalies(views)) == [("r", "one_step_write", 1)]


def test_success_after_fail_on_a_feasible_task(tmp_path: Path) -> None:
    entries = [SETUP, act(1, CLICK, None), {"step": 1, "turn": 3, "action": "FAIL"}]
    views = [run(tmp_path, "r", task(tmp_path, "t1"), entries, final="agent:final-fail.tar")]
    assert checks(desktop_anomalies(views)) == [("r", "success_after_fail", 1)]
    failed = [
        run(
            tmp_path, "s", task(tmp_path, "t2"), entries, final="agent:final-fail.tar", passed=False
        )
    ]
    assert desktop_anomalies(failed) == []


def test_identical_action_sequences_across_tasks(tmp_path: Path) -> None:
    moves = [SETUP, act(1, CLICK, None), act(2, {"action": "screenshot"}, None),
             act(3, {"action": "type", "text": "1"}, None), act(4, {"action": "key", "text": "Return"}, None)]  # fmt: skip
    a = run(tmp_path, "a", task(tmp_path, "t1"), moves, passed=False)
    b = run(tmp_path, "b", task(tmp_path, "t2"), moves, passed=False)
    same_task = run(
        tmp_path, "c", task(tmp_path, "t1b"), moves[:3], passed=False
    )  # too short to count
    assert sorted(checks(desktop_anomalies([a, b, same_task]))) == [
        ("a", "identical_actions", 1),
        ("b", "identical_actions", 1),
    ]
    # two runs of one task may well act the same
    again = run(tmp_path, "d", a.task, moves, passed=False)
    assert desktop_anomalies([a, again]) == []


def test_success_on_a_task_the_audit_says_passes_idle(tmp_path: Path) -> None:
    path = task(tmp_path, "t1")
    audit = tmp_path / "audit.jsonl"
    audit.write_text(json.dumps({"task_id": "t1", "path": str(path), "do_nothing_score": 1.0,
                                 "fail_score": 0.0, "solution_score": 1.0, "flagged": True, "reasons": []}) + "\n")  # fmt: skip
    entries = [
        SETUP,
        act(1, {"action": "key", "text": "ctrl+s"}, "x"),
        {"step": 1, "action": "DONE"},
    ]
    found = desktop_anomalies([run(tmp_path, "r", path, entries)], audit)
    assert checks(found) == [("r", "do_nothing_passes", None)]
    audit.write_text("not json\n")
    with pytest.raises(AgentInfraError, match=r"audit.jsonl:1 .*--audit"):
        desktop_anomalies([run(tmp_path, "s", path, entries)], audit)

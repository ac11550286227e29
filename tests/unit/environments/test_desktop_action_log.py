"""The desktop's action log is a `Journal`: durable entries, a torn last line dropped, old logs still read."""

from __future__ import annotations

import json
from pathlib import Path

from agentinfra.environments.desktop._agent import ActionLog, executed_actions, read_actions

SETUP = {"step": 0, "turn": None, "setup": True, "files": {"/home/user/out.txt": None}}
CLICK = {"step": 1, "turn": 2, "action": {"action": "left_click"}, "code": "pyautogui.click(1, 2)",
         "wait_s": 0, "a11y_sha": "ab", "files": {"/home/user/out.txt": "cd"}}  # fmt: skip
REFUSED = {"step": 2, "turn": 3, "action": "import os", "error": "refused on gui-only"}


def test_entries_are_journal_events_and_read_back_exactly(tmp_path: Path) -> None:
    log = ActionLog.open_episode(tmp_path)
    for entry in (SETUP, CLICK, REFUSED):
        log.record(entry)
    log.close()
    lines = [json.loads(line) for line in (tmp_path / "actions.jsonl").read_text().splitlines()]
    assert [(line["v"], line["seq"], line["type"]) for line in lines] == [
        (1, 0, "action"),
        (1, 1, "action"),
        (1, 2, "action"),
    ]
    entries = read_actions(tmp_path)
    assert [{k: v for k, v in e.items() if k != "wall_s"} for e in entries] == [
        SETUP,
        CLICK,
        REFUSED,
    ]
    assert all(isinstance(e["wall_s"], float) for e in entries)
    assert executed_actions(entries) == [entries[1]]


def test_a_torn_last_line_is_dropped_on_read_and_truncated_on_open(tmp_path: Path) -> None:
    log = ActionLog.open_episode(tmp_path)
    log.record(SETUP)
    log.close()
    path = tmp_path / "actions.jsonl"
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"data":{"step":1')
    assert [e["setup"] for e in read_actions(tmp_path)] == [True]
    reopened = ActionLog.open_episode(tmp_path)
    assert path.read_bytes() == whole
    reopened.record(REFUSED)
    reopened.close()
    assert [e["step"] for e in read_actions(tmp_path)] == [0, 2]


def test_a_log_from_before_the_journal_still_reads_and_is_converted_when_resumed(
    tmp_path: Path,
) -> None:
    old = [{**SETUP, "wall_s": 100.5}, {**CLICK, "wall_s": 101.25}]
    path = tmp_path / "actions.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in old) + '{"step": 2, "tu')
    assert read_actions(tmp_path) == old
    log = ActionLog.open_episode(tmp_path)
    assert [ActionLog.entry(event) for event in log.events] == old
    log.record(REFUSED)
    log.close()
    entries = read_actions(tmp_path)
    assert entries[:2] == old
    assert {k: v for k, v in entries[2].items() if k != "wall_s"} == REFUSED
    assert [json.loads(line)["seq"] for line in path.read_text().splitlines()] == [0, 1, 2]


def test_no_log_reads_as_no_entries(tmp_path: Path) -> None:
    assert read_actions(tmp_path) == []
    (tmp_path / "actions.jsonl").write_text("")
    assert read_actions(tmp_path) == []

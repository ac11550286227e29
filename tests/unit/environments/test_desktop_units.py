"""Desktop environment parts that need no display: tasks, support, actions, metrics, the a11y table, the CLI."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import openpyxl
import pytest
from docx import Document

from agentinfra.environments.desktop import (
    ActionError,
    default_mirror,
    load_desktop_task,
    mirror_path,
    support,
)
from agentinfra.environments.desktop import _evaluate as evaluate
from agentinfra.environments.desktop._a11y import HEADER, flatten_accessibility
from agentinfra.environments.desktop._actions import check_gui_only, plan
from agentinfra.environments.desktop._session import ControllerError, DesktopSession
from agentinfra.errors import TaskEnvironmentError
from agentinfra.sandbox import JailedProcess

ROOT = Path(__file__).resolve().parents[3]
TASKS = ROOT / "examples" / "desktop" / "tasks"
MIRROR = ROOT / "examples" / "desktop" / "mirror"


def write_task(tmp_path: Path, **changes: Any) -> Path:
    document: dict[str, Any] = {
        "id": "t", "instruction": "do it", "config": [], "related_apps": [], "proxy": False,
        "evaluator": {"func": "exact_match", "result": {"type": "vm_command_line", "command": "true"},
                      "expected": {"type": "rule", "rules": {"expected": "x"}}},
    }  # fmt: skip
    document.update(changes)
    path = tmp_path / "task.json"
    path.write_text(json.dumps(document))
    return path


def test_every_shipped_task_loads_and_is_supported_with_a_solution() -> None:
    paths = sorted(TASKS.glob("*.json"))
    assert len(paths) >= 25
    funcs: set[str] = set()
    for path in paths:
        task = load_desktop_task(path)
        assert support(task, default_mirror(path)).supported, path
        assert task.solution() is not None, path
        funcs.update(task.funcs)
    assert sum(load_desktop_task(p).infeasible for p in paths) >= 2
    assert {"compare_table", "compare_pptx_files", "compare_docx_files", "compare_pdfs", "compare_images",
            "check_list", "compare_text_file", "compare_csv", "exact_match", "check_include_exclude",
            "check_direct_json_object", "infeasible"} <= funcs  # fmt: skip


def test_unknown_config_type_and_func_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(TaskEnvironmentError, match="unknown config type 'teleport'"):
        load_desktop_task(write_task(tmp_path, config=[{"type": "teleport", "parameters": {}}]))
    with pytest.raises(TaskEnvironmentError, match="unknown evaluator func 'is_good'"):
        load_desktop_task(write_task(tmp_path, evaluator={"func": "is_good"}))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(TaskEnvironmentError, match="not JSON"):
        load_desktop_task(tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"config": [{"type": "chrome_open_tabs", "parameters": {}}]}, "chrome_open_tabs"),
        ({"proxy": True}, "live web"),
        ({"config": [{"type": "launch", "parameters": {"command": ["code"]}}]}, "VS Code"),
        ({"config": [{"type": "download", "parameters": {"files": [
            {"url": "https://example.org/absent.xlsx", "path": "/home/user/a.xlsx"}]}}]}, "not in the mirror"),
        ({"evaluator": {"func": "is_expected_tabs"}}, "is_expected_tabs"),
        ({"evaluator": {"func": "compare_text_file", "result": {"type": "vm_file", "path": "/etc/passwd"},
                        "expected": {"type": "rule", "rules": {}}}}, "outside /home/user"),
    ],
)  # fmt: skip
def test_unsupported_tasks_say_why(tmp_path: Path, changes: dict[str, Any], reason: str) -> None:
    verdict = support(load_desktop_task(write_task(tmp_path, **changes)), MIRROR)
    assert not verdict.supported
    assert reason in verdict.reason


def test_mirror_naming_follows_osworld_cache() -> None:
    path = mirror_path(Path("/m"), "https://files.example/x/data%20set.xlsx")
    assert path.name.endswith("_data set.xlsx")
    assert len(path.name.split("_")[0]) == 36


def test_computer_13_actions_become_code_and_bad_ones_are_errors() -> None:
    assert plan({"action_type": "CLICK", "parameters": {"x": 10, "y": 20}}, "computer_13", "gui-only", 1920, 1080).code \
        == "pyautogui.click(x=10, y=20, button='left', clicks=1)"  # fmt: skip
    typed = plan(
        {"action_type": "TYPING", "parameters": {"text": "a'); import os; ('"}},
        "computer_13",
        "gui-only",
        100,
        100,
    )
    assert typed.code.startswith("pyautogui.typewrite(")
    assert "import os" in typed.code
    check_gui_only(typed.code)  # the text is a literal, not code
    assert plan("FAIL", "computer_13", "gui-only", 100, 100).end == "FAIL"
    for action, message in (
        ({"action_type": "CLICK", "parameters": {"x": 5000, "y": 1}}, "off the"),
        ({"action_type": "PRESS", "parameters": {"key": "hyperspace"}}, "unknown key"),
        ({"action_type": "JUMP", "parameters": {}}, "unknown computer_13"),
    ):
        with pytest.raises(ActionError, match=message):
            plan(action, "computer_13", "gui-only", 1920, 1080)


def test_computer_use_actions() -> None:
    assert plan({"action": "key", "text": "ctrl+Return"}, "computer_use", "gui-only", 800, 600).code == \
        "pyautogui.hotkey('ctrl', 'enter')"  # fmt: skip
    assert plan(
        {"action": "triple_click", "coordinate": [5, 5]}, "computer_use", "gui-only", 800, 600
    ).code.endswith("clicks=3)")
    assert plan({"action": "scroll", "scroll_direction": "down", "scroll_amount": 2}, "computer_use", "x", 8, 8).code == \
        "pyautogui.vscroll(-2)"  # fmt: skip
    with pytest.raises(ActionError, match="coordinate"):
        plan(
            {"action": "left_click_drag", "coordinate": [1, 1]},
            "computer_use",
            "gui-only",
            800,
            600,
        )


@pytest.mark.parametrize(
    "code",
    [
        "open('/home/user/x', 'w').write('1')",
        "import os\nos.system('touch x')",
        "pyautogui.screenshot('/home/user/x.png')",
        "x = 1",
        "pyautogui.click(*[1, 2])",
        "pyautogui.typewrite(open('/etc/passwd').read())",
        "__import__('os').system('id')",
    ],
)
def test_gui_only_refuses_anything_but_input_calls(code: str) -> None:
    with pytest.raises(ActionError, match="gui-only"):
        plan(code, "pyautogui", "gui-only", 100, 100)
    assert plan(code, "pyautogui", "code", 100, 100).code == code


def test_gui_only_allows_input_calls_and_sleep() -> None:
    check_gui_only(
        "import pyautogui\nimport time\npyautogui.click(10, 20)\ntime.sleep(0.5)\npyautogui.hotkey('ctrl', 's')"
    )


def book(path: Path, rows: list[tuple[Any, ...]]) -> str:
    workbook = openpyxl.Workbook()
    for row in rows:
        workbook.active.append(row)
    workbook.save(path)
    return str(path)


def test_compare_table_rules(tmp_path: Path) -> None:
    a = book(tmp_path / "a.xlsx", [("x", 1), ("y", 2.0)])
    b = book(tmp_path / "b.xlsx", [("x", 1), ("y", 2)])
    c = book(tmp_path / "c.xlsx", [("x", 1), ("z", 2)])
    data = {"rules": [{"type": "sheet_data", "sheet_idx0": "RI0", "sheet_idx1": "EI0"}]}
    assert evaluate.compare_table(a, b, **data) == 1.0
    assert evaluate.compare_table(a, c, **data) == 0.0
    assert evaluate.compare_table(None, b, **data) == 0.0
    cell = {
        "rules": [
            {
                "type": "check_cell",
                "sheet_idx": "RI0",
                "coordinate": "B2",
                "props": {"value": {"method": "eq", "ref": 2}},
            }
        ]
    }
    assert evaluate.compare_table(a, None, **cell) == 1.0
    fuzzy = {"rules": [{"type": "sheet_fuzzy", "sheet_idx0": "RI0", "sheet_idx1": "EI0",
                        "rules": [{"range": ["A2:A2"], "type": "fuzzy_match", "threshold": 90}]}]}  # fmt: skip
    assert evaluate.compare_table(a, b, **fuzzy) == 1.0
    assert evaluate.compare_table(a, c, **fuzzy) == 0.0


def test_docx_metrics(tmp_path: Path) -> None:
    def docx(name: str, texts: list[str], spacing: float | None = None) -> str:
        document = Document()
        for text in texts:
            document.add_paragraph(text).paragraph_format.line_spacing = spacing
        document.save(str(tmp_path / name))
        return str(tmp_path / name)

    a, b = docx("a.docx", ["One", "Two"]), docx("b.docx", ["One", "Two"], spacing=1.5)
    assert evaluate.compare_docx_files(a, b) == 1.0
    # OSWorld's ignore_blanks (the default) collapses runs of whitespace over the whole text
    spaced = docx("s.docx", ["One  ", "Two"])
    assert evaluate.compare_docx_files(a, spaced) == 1.0
    assert evaluate.compare_docx_files(a, spaced, ignore_blanks=False) == 0.0
    assert evaluate.compare_docx_files(a, docx("c.docx", ["One", "Tw o"])) == 0.0
    assert evaluate.compare_docx_files(a, docx("d.docx", ["One"])) == 0.0
    assert evaluate.compare_docx_files(a, docx("o.docx", ["Two", "One"]), ignore_order=True) == 1.0
    assert evaluate.compare_line_spacing(b, docx("e.docx", ["One", "Two"], spacing=1.5)) == 1.0
    assert evaluate.compare_line_spacing(a, b) == 0.0


def test_check_csv_matches_records_by_column(tmp_path: Path) -> None:
    # OSWorld's thunderbird/15c3b339 reads firefox_decrypt's CSV of accounts this way
    (tmp_path / "a.csv").write_text("url,username,password\r\nimap://x,ada@example.org,pw\r\n")
    result = evaluate.FileValue(tmp_path / "a.csv")
    assert (
        evaluate.check_csv(result, {"expect": [{"url": "imap://x", "username": "ada@example.org"}]})
        == 1.0
    )
    assert evaluate.check_csv(result, {"expect": [{"username": "bob@example.org"}]}) == 0.0
    assert evaluate.check_csv(result, {"unexpect": [{"password": "pw"}]}) == 0.0
    assert evaluate.check_csv(result, {"expect": [{"no_such_column": ""}]}) == 0.0
    assert evaluate.check_csv(result, {"expect": [], "unexpect": [{"username": "bob"}]}) == 1.0
    assert evaluate.check_csv(None, {"expect": []}) == 0.0


def test_text_metrics(tmp_path: Path) -> None:
    (tmp_path / "r.txt").write_text("ERROR a\nINFO b\n")
    result = evaluate.FileValue(tmp_path / "r.txt")
    assert evaluate.check_list(result, {"expect": ["^ERROR"], "unexpect": []}) == 1.0
    assert evaluate.check_list(result, {"expect": ["^ERROR"], "unexpect": ["^INFO"]}) == 0.0
    assert evaluate.exact_match("755\n", {"expected": "755"}) == 1.0
    assert (
        evaluate.exact_match(str(tmp_path / "r.txt"), {"expected": "ERROR a"}) == 0.0
    )  # a string, not a file
    assert evaluate.check_include_exclude("a b", {"include": ["a"], "exclude": ["c"]}) == 1.0
    assert evaluate.check_direct_json_object('{"k": 1, "j": 2}', {"expected": {"k": 1}}) == 1.0
    assert evaluate.check_direct_json_object("not json", {"expected": {"k": 1}}) == 0.0


def test_accessibility_table_is_trimmed_to_budget() -> None:
    st, cp = (
        "https://accessibility.ubuntu.example.org/ns/state",
        "https://accessibility.ubuntu.example.org/ns/component",
    )
    buttons = "".join(
        f'<push-button name="Button {i}" st:showing="true" cp:screencoord="({i}, 5)" cp:size="(10, 10)"/>'
        for i in range(500)
    )
    hidden = '<push-button name="Hidden" cp:screencoord="(1, 1)" cp:size="(10, 10)"/>'
    xml = f'<desktop-frame xmlns:st="{st}" xmlns:cp="{cp}">{buttons}{hidden}</desktop-frame>'
    table = flatten_accessibility(xml, max_tokens=200)
    lines = table.splitlines()
    assert lines[0] == HEADER
    assert lines[1].startswith("push-button\tButton 0\t")
    assert "Hidden" not in table
    assert "more rows cut" in lines[-1]
    assert len(table) <= 200 * 4 + 80
    assert "unreadable" in flatten_accessibility("<not xml")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentinfra", "desktop", *args], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def test_cli_tasks_json_lists_each_task(tmp_path: Path) -> None:
    shutil.copy(TASKS / "os-mkdir.json", tmp_path / "a.json")
    write_task(tmp_path, evaluator={"func": "is_good"})
    out = cli("tasks", str(tmp_path), "--json", "--mirror", str(MIRROR))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert {r["task_id"] for r in rows} == {"os-mkdir", None}
    refused = next(r for r in rows if r["task_id"] is None)
    assert not refused["supported"]
    assert "is_good" in refused["reason"]
    assert all({"task_id", "path", "supported", "reason"} <= set(r) for r in rows)


def test_cli_usage_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "actions.json").write_text('{"action_space": "telepathy", "actions": []}')
    out = cli("run", str(TASKS / "os-mkdir.json"), "--actions", str(tmp_path / "actions.json"))
    assert out.returncode == 2
    assert "unknown action_space 'telepathy'" in out.stderr
    assert out.stderr.strip().count("\n") == 0
    out = cli("run", str(TASKS / "os-mkdir.json"), "--actions", str(tmp_path / "missing.json"))
    assert out.returncode == 2
    assert "does not exist" in out.stderr


def test_audit_flags_a_file_that_is_not_a_task_without_stopping(tmp_path: Path) -> None:
    from agentinfra.environments.desktop import audit

    rows = audit([write_task(tmp_path, config=[{"type": "teleport"}])], MIRROR, workers=1)
    assert len(rows) == 1
    assert rows[0].flagged
    assert "unknown config type 'teleport'" in rows[0].reasons[0]


def test_desktop_run_options_are_checked_before_any_run(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "agentinfra", "run", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
            "--runs-dir", str(tmp_path)]  # fmt: skip
    kernels = subprocess.run([*base, "--tasks", str(ROOT / "examples/kernels/problems/01_matmul_relu.py"),
                              "--action-space", "computer_use"], capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert kernels.returncode == 2
    assert "--action-space is a desktop option" in kernels.stderr
    desktop = subprocess.run([*base, "--env", "desktop", "--tasks", str(TASKS / "os-mkdir.json"),
                              "--observation", "smell"], capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert desktop.returncode == 2
    assert "unknown observation 'smell'" in desktop.stderr
    assert list(tmp_path.iterdir()) == []


FAKE_CONTROLLER = """
import json, sys, time
for line in sys.stdin:
    op = json.loads(line)["op"]
    if op == "ping":
        print(json.dumps({"ok": True, "op": op}), flush=True)
    elif op == "slow":
        time.sleep(30)
    elif op == "two":
        sys.stdout.write('{"a": 1}\\n{"b": 2}\\n')
        sys.stdout.flush()
    elif op == "junk":
        print("not json", flush=True)
    elif op == "list":
        print("[1]", flush=True)
    elif op == "big":
        sys.stdout.write("x" * (65 << 20))
        sys.stdout.flush()
"""


async def _fake_session(tmp_path: Path) -> DesktopSession:
    """A session whose controller is a plain child speaking the same JSON lines (no jail, no display)."""
    session = DesktopSession()

    def spawn(child: tuple[int, int], stderr: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-I", "-c", FAKE_CONTROLLER], stdin=child[0],
                                stdout=child[1], stderr=stderr, start_new_session=True)  # fmt: skip

    session.channel = JailedProcess.start(
        spawn, mode="none", uid=None, stderr_path=tmp_path / "controller.stderr"
    )
    return session


def test_the_session_speaks_json_lines_on_the_event_loop(tmp_path: Path) -> None:
    async def talk() -> tuple[list[Any], list[str], bool]:
        async with await _fake_session(tmp_path) as session:
            replies = [await session.request("ping") for _ in range(3)]
            replies += await asyncio.gather(*(session.request("ping") for _ in range(4)))
            errors = []
            for op, timeout_s in (("two", 10.0), ("junk", 10.0), ("list", 10.0), ("slow", 0.3)):
                with pytest.raises(ControllerError) as caught:
                    await session.request(op, timeout_s=timeout_s)
                errors.append(str(caught.value))
            process = session.channel.process if session.channel else None
        with pytest.raises(ControllerError) as after:
            await session.request("ping")
        errors.append(str(after.value))
        return replies, errors, process is not None and process.poll() is not None

    replies, errors, reaped = asyncio.run(talk())
    assert replies == [{"ok": True, "op": "ping"}] * 7
    assert errors == [
        "desktop controller sent more than one reply to two: b'{\"b\": 2}\\n'",
        "desktop controller sent a non-JSON reply to junk",
        "desktop controller sent a non-object reply to list",
        "desktop controller did not answer slow within 0 s",
        "desktop is not running (request 'ping')",
    ]
    assert reaped


def test_a_request_cancelled_mid_exchange_stops_the_session_from_reading_its_reply(
    tmp_path: Path,
) -> None:
    async def talk() -> str:
        async with await _fake_session(tmp_path) as session:
            slow = asyncio.create_task(session.request("slow", timeout_s=60))
            await asyncio.sleep(0.3)  # the request is sent; its reply would come later
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            with pytest.raises(ControllerError) as caught:
                await session.request("ping", timeout_s=10)
            return str(caught.value)

    assert asyncio.run(talk()) == (
        "desktop controller is out of step: a slow request was cancelled mid-exchange "
        "(request 'ping'); restart the desktop"
    )


def test_the_controllers_stderr_file_is_bounded(tmp_path: Path) -> None:
    from agentinfra.environments.desktop import _session

    path = tmp_path / "controller.stderr"
    with open(path, "ab") as handle:  # as the channel opens it: appending
        handle.write(b"x" * (_session._STDERR_CAP_BYTES + 1))
        handle.flush()
        _session._bound_stderr(path)
        assert path.stat().st_size == 0
        handle.write(b"after")
        handle.flush()
    _session._bound_stderr(path)
    assert path.read_bytes() == b"after"
    link = tmp_path / "link"
    link.symlink_to(path)
    _session._bound_stderr(link)  # never through a link
    assert path.read_bytes() == b"after"


def test_the_session_caps_a_reply_and_says_when_the_controller_ends(tmp_path: Path) -> None:
    async def talk() -> list[str]:
        errors = []
        async with await _fake_session(tmp_path) as session:
            with pytest.raises(ControllerError) as caught:
                await session.request("big", timeout_s=60)
            errors.append(str(caught.value))
        async with await _fake_session(tmp_path) as session:
            assert session.channel is not None
            session.channel.process.kill()
            session.channel.process.wait()
            with pytest.raises(ControllerError) as caught:
                await session.request("ping", timeout_s=10)
            errors.append(str(caught.value))
        return errors

    errors = asyncio.run(talk())
    assert errors[0] == f"desktop controller's reply to big exceeds {64 << 20} bytes"
    assert errors[1] in (
        "desktop controller is gone (ping): (no output)",
        "desktop controller ended during ping: (no output)",
    )

"""A scripted computer-use policy for `agentinfra.agent.ScriptedModelServer` (tests, demo, benchmark).

It plays the model's side of a desktop run through the real loop, desktop and
grader. On every request it checks that each screenshot is a PNG of the size the
last observation states, and it clicks by coordinates it reads from the
accessibility table it received (a cell by its name), scaled into the
screenshot's pixels as a vision model would. Plans are keyed by the task's
instruction, which it finds in the task prompt, so one server can serve many
runs at once. Anything off (a wrong image size, a cell not in the table) is
recorded in ``violations`` and the policy gives up with ``fail``.
"""

from __future__ import annotations

import base64
import io
import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentinfra.agent import Reply

__all__ = ["CALC_PLANS", "CHEAT_PLAN", "DesktopPolicy", "Move", "solution_moves"]


@dataclass(frozen=True, slots=True)
class Move:
    """One model turn: a tool and its arguments; ``click_cell`` asks for a click on that cell's centre."""

    tool: str
    args: dict[str, Any] | None = None
    click_cell: str | None = None


def _computer(**args: Any) -> Move:
    return Move("computer", args)


_SAVE = (
    _computer(action="key", text="ctrl+s"),
    _computer(action="wait", duration=2),
    Move("done", {}),
)
_START = (_computer(action="screenshot"), _computer(action="mouse_move", coordinate=[400, 300]))
"""A first look, then one input event: LibreOffice reports stale cell extents until the first input."""
CALC_PLANS: dict[str, Sequence[Move]] = {
    "calc-total": (*_START, Move("computer", click_cell="B5"), _computer(action="key", text="Down"),
                   _computer(action="type", text="=SUM(B2:B5)\n"), *_SAVE),
    "calc-average": (*_START, Move("computer", click_cell="B5"), _computer(action="key", text="Down"),
                     _computer(action="key", text="Down"), _computer(action="type", text="=AVERAGE(B2:B5)\n"), *_SAVE),
    "calc-max": (*_START, Move("computer", click_cell="B1"), _computer(action="key", text="Right"),
                 _computer(action="key", text="Right"), _computer(action="type", text="=MAX(B2:B5)\n"), *_SAVE),
    "calc-header": (*_START, Move("computer", click_cell="B1"), _computer(action="key", text="Right"),
                    _computer(action="type", text="Total\n"), *_SAVE),
    "calc-rename-item": (*_START, Move("computer", click_cell="A2"), _computer(action="type", text="Card\n"), *_SAVE),
}  # fmt: skip
"""Five shipped Calc tasks solved through the `computer` tool."""
CHEAT_PLAN: Sequence[Move] = (
    Move("pyautogui", {"code": "pyautogui.position()"}),
    Move(
        "pyautogui", {"code": "open('/home/user/Desktop/hello.txt', 'w').write('hello world\\n')"}
    ),
    Move("done", {}),
)
"""On the gui-only track (pyautogui space, task os-write-file): writes the graded file by code."""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _png_size(url: str) -> tuple[int, int]:
    from PIL import Image

    data = base64.b64decode(url.split(",", 1)[1])
    return Image.open(io.BytesIO(data)).size


class DesktopPolicy:
    """``policy(body) -> Reply`` for a `ScriptedModelServer`; ``plans`` maps instructions to moves."""

    def __init__(self, plans: dict[str, Sequence[Move]]) -> None:
        self.plans = dict(plans)
        self.violations: list[str] = []
        self.images_checked = 0
        self._lock = threading.Lock()

    def _plan(self, messages: list[dict[str, Any]]) -> Sequence[Move] | None:
        prompt = _text(messages[1].get("content")) if len(messages) > 1 else ""
        for instruction, plan in self.plans.items():
            if instruction in prompt:
                return plan
        return None

    def _check_images(self, messages: list[dict[str, Any]]) -> str:
        """The last observation's text; every image after it must have the size it states."""
        observation = ""
        for message in messages:
            if message.get("role") == "tool":
                observation = _text(message.get("content"))
        stated = re.search(r"screenshot (\d+)x(\d+)", observation)
        last = messages[-1]
        if last.get("role") == "user" and isinstance(last.get("content"), list):
            for part in last["content"]:
                if isinstance(part, dict) and part.get("type") == "image_url":
                    size = _png_size(part["image_url"]["url"])
                    with self._lock:
                        self.images_checked += 1
                    if stated is None or size != (int(stated[1]), int(stated[2])):
                        self.violations.append(
                            f"image of {size} but the observation states {stated and stated[0]}"
                        )
        return observation

    def _cell(self, observation: str, name: str) -> list[int] | None:
        scale = re.search(r"\(scale ([0-9.]+)\)", observation)
        for row in observation.splitlines():
            fields = row.split("\t")
            if len(fields) == 7 and fields[0] == "table-cell" and fields[1] == name:
                x, y = (int(v) for v in fields[5].strip("()").split(","))
                w, h = (int(v) for v in fields[6].strip("()").split(","))
                factor = float(scale[1]) if scale else 1.0
                return [round((x + w / 2) / factor), round((y + h / 2) / factor)]
        return None

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        plan = self._plan(messages)
        if plan is None:
            return Reply(content="I have no plan for this task.")
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        observation = self._check_images(messages)
        if turn >= len(plan):
            return Reply(content="finished")
        move = plan[turn]
        args = dict(move.args or {})
        if move.click_cell is not None:
            point = self._cell(observation, move.click_cell)
            if point is None:
                self.violations.append(f"cell {move.click_cell} is not in the accessibility table")
                return Reply(tool_calls=[("fail", "{}")])
            args = {"action": "left_click", "coordinate": point}
        return Reply(reasoning=f"step {turn + 1}", tool_calls=[(move.tool, json.dumps(args))])


_TOOL_OF_SPACE = {
    "computer_use": "computer",
    "computer_13": "computer_13",
    "pyautogui": "pyautogui",
}


def solution_moves(solution: dict[str, Any]) -> list[Move]:
    """A task's scripted solution as model turns through the matching tool, ending with done or fail."""
    space = str(solution["action_space"])
    tool = _TOOL_OF_SPACE[space]
    moves: list[Move] = []
    for action in solution["actions"]:
        if action in ("DONE", "FAIL"):
            moves.append(Move(str(action).lower(), {}))
            return moves
        if space == "pyautogui":
            moves.append(Move(tool, {"code": action}))
        elif action == "WAIT":
            moves.append(
                Move(
                    tool,
                    {"action_type": "WAIT"}
                    if space == "computer_13"
                    else {"action": "wait", "duration": 2},
                )
            )
        else:
            moves.append(Move(tool, dict(action)))
    moves.append(Move("done", {}))
    return moves

"""The three action spaces, checked on the host and turned into pyautogui code the desktop runs.

* ``computer_13`` (OSWorld): dicts ``{"action_type", "parameters"}`` and the strings
  ``"WAIT"``, ``"FAIL"``, ``"DONE"``.
* ``pyautogui`` (OSWorld): code strings. On the ``gui-only`` track (the default)
  the parsed code must be only calls of pyautogui's input functions and
  ``time.sleep`` with literal arguments (plus ``import pyautogui``/``import time``);
  anything else is refused before it reaches the desktop. On the ``code`` track
  anything runs, as the desktop user inside the sandbox, as in OSWorld.
* ``computer_use`` (Anthropic's and OpenAI's computer tool): dicts with ``action``
  (key, type, mouse_move, left_click, right_click, middle_click, double_click,
  triple_click, left_click_drag, scroll, wait, screenshot).

`plan` validates one action and returns a `Step`: code to run (built from
validated values with ``repr``, never from agent text pasted into code), a wait,
or an end (``DONE``/``FAIL``). A bad action raises `ActionError`, whose message
goes back to the agent; the episode goes on.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Literal

from agentinfra import _pyast
from agentinfra.errors import TaskEnvironmentError

__all__ = ["ACTION_SPACES", "TRACKS", "ActionError", "Step", "plan"]

ActionSpace = Literal["computer_13", "pyautogui", "computer_use"]
Track = Literal["gui-only", "code"]
ACTION_SPACES: tuple[ActionSpace, ...] = ("computer_13", "pyautogui", "computer_use")
TRACKS: tuple[Track, ...] = ("gui-only", "code")

_NAMED_KEYS = {
    "accept", "add", "alt", "altleft", "altright", "apps", "backspace", "browserback",
    "browserforward", "capslock", "clear", "convert", "ctrl", "ctrlleft", "ctrlright", "decimal",
    "del", "delete", "divide", "down", "end", "enter", "esc", "escape", "execute", "final", "home",
    "insert", "left", "menu", "multiply", "num0", "num1", "num2", "num3", "num4", "num5", "num6",
    "num7", "num8", "num9", "numlock", "pagedown", "pageup", "pause", "pgdn", "pgup", "print",
    "printscreen", "prntscrn", "prtsc", "prtscr", "return", "right", "scrolllock", "select",
    "separator", "shift", "shiftleft", "shiftright", "space", "subtract", "tab", "up", "win",
    "winleft", "winright", "command", "option", "optionleft", "optionright", "fn",
    *(f"f{n}" for n in range(1, 25)),
}  # fmt: skip
KEYS = frozenset(_NAMED_KEYS | {chr(c) for c in range(32, 127)} | {"\n", "\t"})
"""pyautogui's key names (printable ASCII characters and named keys)."""
_XDOTOOL_KEYS = {
    "return": "enter", "kp_enter": "enter", "control": "ctrl", "control_l": "ctrlleft",
    "control_r": "ctrlright", "super": "win", "super_l": "winleft", "meta": "win",
    "page_down": "pagedown", "page_up": "pageup", "next": "pagedown", "prior": "pageup",
    "backspace": "backspace", "escape": "esc", "shift_l": "shiftleft", "shift_r": "shiftright",
    "alt_l": "altleft", "alt_r": "altright", "minus": "-", "plus": "+", "equal": "=",
    "slash": "/", "backslash": "\\", "period": ".", "comma": ",", "semicolon": ";",
    "apostrophe": "'", "grave": "`", "bracketleft": "[", "bracketright": "]", "cmd": "win",
}  # fmt: skip
_GUI_FUNCTIONS = {
    "click", "doubleClick", "tripleClick", "rightClick", "middleClick", "moveTo", "moveRel",
    "move", "dragTo", "dragRel", "drag", "mouseDown", "mouseUp", "scroll", "hscroll", "vscroll",
    "typewrite", "write", "press", "keyDown", "keyUp", "hotkey", "position", "size", "sleep",
}  # fmt: skip


class ActionError(TaskEnvironmentError):
    """The agent's action is not valid; the message goes back to it and the episode continues."""


@dataclass(frozen=True, slots=True)
class Step:
    """What one action does: ``code`` to run, a ``wait`` in seconds, or an ``end`` (DONE/FAIL)."""

    code: str = ""
    wait_s: float = 0.0
    end: Literal["DONE", "FAIL"] | None = None


def plan(action: Any, space: str, track: str, width: int, height: int) -> Step:
    """Validates ``action`` in ``space`` on ``track``; raises `ActionError` naming what is wrong."""
    if action in ("WAIT", "FAIL", "DONE"):
        return Step(wait_s=2.0) if action == "WAIT" else Step(end=action)
    if space == "computer_13":
        return _computer_13(action, width, height)
    if space == "pyautogui":
        if not isinstance(action, str):
            raise ActionError(f"a pyautogui action is a code string, got {type(action).__name__}")
        if track == "gui-only":
            check_gui_only(action)
        return Step(code=action)
    if space == "computer_use":
        return _computer_use(action, width, height)
    raise ActionError(f"unknown action space {space!r}; use one of {', '.join(ACTION_SPACES)}")


def _point(
    params: dict[str, Any], width: int, height: int, keys: tuple[str, str] = ("x", "y")
) -> tuple[int, int]:
    try:
        x, y = (params[k] for k in keys)
    except KeyError as exc:
        raise ActionError(f"missing parameter {exc.args[0]!r}") from exc
    return _checked_point(x, y, width, height)


def _checked_point(x: Any, y: Any, width: int, height: int) -> tuple[int, int]:
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (x, y)):
        raise ActionError(f"coordinates must be numbers, got ({x!r}, {y!r})")
    if not (0 <= x < width and 0 <= y < height):
        raise ActionError(f"({x}, {y}) is off the {width}x{height} screen")
    return int(x), int(y)


def _key(name: Any) -> str:
    if not isinstance(name, str) or (name.lower() not in KEYS and name not in KEYS):
        raise ActionError(f"unknown key {name!r} (pyautogui key names: enter, ctrl, a, f5, ...)")
    return name if name in KEYS else name.lower()


def _button(params: dict[str, Any]) -> str:
    button = params.get("button", "left")
    if button not in ("left", "right", "middle"):
        raise ActionError(f"unknown mouse button {button!r}; use left, right or middle")
    return str(button)


def _computer_13(action: Any, width: int, height: int) -> Step:
    if not isinstance(action, dict) or "action_type" not in action:
        raise ActionError(
            'a computer_13 action is {"action_type": ..., "parameters": {...}} or WAIT/FAIL/DONE'
        )
    kind = action["action_type"]
    params = action.get("parameters") or {}
    if not isinstance(params, dict):
        raise ActionError("computer_13 parameters must be an object")
    if kind in ("WAIT", "FAIL", "DONE"):
        return plan(kind, "computer_13", "gui-only", width, height)
    if kind == "MOVE_TO":
        return Step(code=f"pyautogui.moveTo{_point(params, width, height)!r}")
    if kind in ("CLICK", "RIGHT_CLICK", "DOUBLE_CLICK"):
        where = _point(params, width, height) if "x" in params or "y" in params else None
        button = {"CLICK": _button(params), "RIGHT_CLICK": "right", "DOUBLE_CLICK": "left"}[kind]
        clicks = 2 if kind == "DOUBLE_CLICK" else params.get("num_clicks", 1)
        if clicks not in (1, 2, 3):
            raise ActionError(f"num_clicks must be 1, 2 or 3, got {clicks!r}")
        at = f"x={where[0]}, y={where[1]}, " if where else ""
        return Step(code=f"pyautogui.click({at}button={button!r}, clicks={clicks})")
    if kind in ("MOUSE_DOWN", "MOUSE_UP"):
        verb = "mouseDown" if kind == "MOUSE_DOWN" else "mouseUp"
        return Step(code=f"pyautogui.{verb}(button={_button(params)!r})")
    if kind == "DRAG_TO":
        x, y = _point(params, width, height)
        return Step(code=f"pyautogui.dragTo({x}, {y}, duration=0.3, button='left')")
    if kind == "SCROLL":
        dx, dy = params.get("dx", 0), params.get("dy", 0)
        if not all(
            isinstance(v, int) and not isinstance(v, bool) and abs(v) <= 100 for v in (dx, dy)
        ):
            raise ActionError(f"SCROLL dx and dy must be integers within +-100, got {dx!r}, {dy!r}")
        return Step(code=f"pyautogui.hscroll({dx})\npyautogui.vscroll({dy})")
    if kind == "TYPING":
        text = params.get("text")
        if not isinstance(text, str) or len(text) > 10_000:
            raise ActionError("TYPING needs a text string of at most 10,000 characters")
        return Step(code=f"pyautogui.typewrite({text!r}, interval=0.005)")
    if kind in ("PRESS", "KEY_DOWN", "KEY_UP"):
        verb = {"PRESS": "press", "KEY_DOWN": "keyDown", "KEY_UP": "keyUp"}[kind]
        return Step(code=f"pyautogui.{verb}({_key(params.get('key'))!r})")
    if kind == "HOTKEY":
        keys = params.get("keys")
        if not isinstance(keys, list) or not keys:
            raise ActionError("HOTKEY needs a non-empty list of keys")
        return Step(code=f"pyautogui.hotkey({', '.join(repr(_key(k)) for k in keys)})")
    raise ActionError(f"unknown computer_13 action_type {kind!r}")


def _xdotool_key(name: str) -> str:
    lowered = name.lower()
    return _key(_XDOTOOL_KEYS.get(lowered, lowered if len(name) > 1 else name))


def _computer_use(action: Any, width: int, height: int) -> Step:
    if not isinstance(action, dict) or "action" not in action:
        raise ActionError('a computer_use action is {"action": ..., ...}')
    kind = action["action"]

    def coordinate(key: str = "coordinate", required: bool = True) -> tuple[int, int] | None:
        value = action.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise ActionError(f"{kind} needs {key}: [x, y]")
        return _checked_point(value[0], value[1], width, height)

    if kind == "screenshot":
        return Step()
    if kind == "zoom":  # Claude's: a closer look at a region, which the observation shows; no input
        region = action.get("region")
        if not isinstance(region, list | tuple) or len(region) != 4:
            raise ActionError("zoom needs region: [x1, y1, x2, y2]")
        x1, y1 = _checked_point(region[0], region[1], width, height)
        x2, y2 = _checked_point(region[2], region[3], width, height)
        if x2 - x1 < 8 or y2 - y1 < 8:
            raise ActionError("zoom's region must be at least 8 px each way, x1 < x2 and y1 < y2")
        return Step()
    if kind == "wait":
        duration = action.get("duration", 1)
        if not isinstance(duration, int | float) or not 0 <= duration <= 60:
            raise ActionError(f"wait duration must be 0..60 seconds, got {duration!r}")
        return Step(wait_s=float(duration))
    if kind == "key":
        text = action.get("text")
        if not isinstance(text, str) or not text:
            raise ActionError("key needs text such as 'ctrl+s' or 'Return'")
        keys = [_xdotool_key(k) for k in text.split("+")] if text != "+" else ["+"]
        return Step(code=f"pyautogui.hotkey({', '.join(repr(k) for k in keys)})")
    if kind == "type":
        text = action.get("text")
        if not isinstance(text, str) or len(text) > 10_000:
            raise ActionError("type needs a text string of at most 10,000 characters")
        return Step(code=f"pyautogui.typewrite({text!r}, interval=0.005)")
    if kind == "mouse_move":
        return Step(code=f"pyautogui.moveTo{coordinate()!r}")
    clicks = {"left_click": ("left", 1), "right_click": ("right", 1), "middle_click": ("middle", 1),
              "double_click": ("left", 2), "triple_click": ("left", 3)}  # fmt: skip
    if kind in clicks:
        button, count = clicks[kind]
        where = coordinate(required=False)
        at = f"x={where[0]}, y={where[1]}, " if where else ""
        return Step(code=f"pyautogui.click({at}button={button!r}, clicks={count})")
    if kind == "left_click_drag":
        start = coordinate("start_coordinate")
        end = coordinate()
        assert start is not None
        assert end is not None
        return Step(
            code=f"pyautogui.moveTo{start!r}\npyautogui.dragTo({end[0]}, {end[1]}, duration=0.3, button='left')"
        )
    if kind == "scroll":
        where = coordinate(required=False)
        direction, amount = action.get("scroll_direction"), action.get("scroll_amount", 3)
        if (
            direction not in ("up", "down", "left", "right")
            or not isinstance(amount, int)
            or not 0 < amount <= 100
        ):
            raise ActionError(
                "scroll needs scroll_direction up/down/left/right and scroll_amount 1..100"
            )
        move = f"pyautogui.moveTo{where!r}\n" if where else ""
        sign = 1 if direction in ("up", "left") else -1
        verb = "vscroll" if direction in ("up", "down") else "hscroll"
        return Step(code=f"{move}pyautogui.{verb}({sign * amount})")
    raise ActionError(f"unknown computer_use action {kind!r}")


def _literal(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        return _literal(node.operand)
    if isinstance(node, ast.List | ast.Tuple):
        return all(_literal(e) for e in node.elts)
    return False


def check_gui_only(code: str) -> None:
    """Refuses code that is anything but pyautogui input calls and ``time.sleep`` with literal arguments."""
    try:
        tree = _pyast.parse(code)
    except SyntaxError as exc:
        raise ActionError(f"action code does not parse: {exc.msg} (line {exc.lineno})") from exc
    for statement in tree.body:
        if isinstance(statement, ast.Import) and all(
            a.name in ("pyautogui", "time") and a.asname is None for a in statement.names
        ):
            continue
        if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)):
            raise ActionError(
                f"gui-only track: line {statement.lineno} is not a pyautogui call "
                "(only pyautogui input calls and time.sleep with literal arguments are allowed)"
            )
        call = statement.value
        func = call.func
        allowed = (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and ((func.value.id == "pyautogui" and func.attr in _GUI_FUNCTIONS - {"sleep"})
                 or (func.value.id == "time" and func.attr == "sleep"))
        )  # fmt: skip
        if not allowed:
            raise ActionError(
                f"gui-only track: line {statement.lineno} calls {ast.unparse(func)}, which is not allowed"
            )
        arguments = [*call.args, *(k.value for k in call.keywords)]
        if any(k.arg is None for k in call.keywords) or not all(_literal(a) for a in arguments):
            raise ActionError(
                f"gui-only track: line {statement.lineno} passes a non-literal argument"
            )

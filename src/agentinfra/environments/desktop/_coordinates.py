"""Coordinate conventions of computer-use models: the image a model is sent, and how its
coordinates map back to the screen (the ``computer`` tool's ``coordinates`` option).

Each model family grounds clicks in its own space (sources in
``shared/research/desktop_anchors.md``, section 4):

* ``screenshot``: pixels of the screenshot as sent (Claude, OpenAI's computer tool).
* ``smart_resize`` (Qwen2.5-VL, UI-TARS-1.5): the image is resized by Qwen2.5-VL's
  ``smart_resize`` (sides multiples of 28, within a pixel budget of 16384·28·28) and the
  model answers in pixels of that resized image. We send the image at exactly those
  dimensions, so the two resize chains cannot drift apart, and scale by them back.
* ``grid999`` (Qwen3-VL, Qwen3.5-VL, EvoCUA): a relative grid, the screen is "1000x1000",
  coordinates 0..999, scaled back by width/999 and height/999 as OSWorld's agents for them do.
* ``fraction`` (OpenCUA, Kimi): relative 0..1 floats.

`CONVENTIONS` names the conventions; `FAMILIES` maps each model family to its one.
"""

from __future__ import annotations

import math

__all__ = [
    "CONVENTIONS",
    "FAMILIES",
    "convention_for",
    "describe",
    "from_openai",
    "image_size",
    "to_screen",
]

CONVENTIONS = ("screenshot", "smart_resize", "grid999", "fraction")
FAMILIES = {
    "qwen2.5-vl": "smart_resize",
    "ui-tars": "smart_resize",
    "qwen3-vl": "grid999",
    "qwen3.5-vl": "grid999",
    "evocua": "grid999",
    "opencua": "fraction",
    "kimi": "fraction",
    "claude": "screenshot",
    "openai": "screenshot",  # and its tool takes OpenAI's batched actions (`from_openai`)
}
"""The convention each model family was trained on, by the names ``coordinates`` accepts."""

_FACTOR = 28
_MIN_PIXELS = 56 * 56
_MAX_PIXELS = 16384 * 28 * 28


def convention_for(name: str) -> str:
    """The convention a ``coordinates`` option names: a convention, or a model family's.

    Raises:
        ValueError: neither (the message lists both).
    """
    if name in CONVENTIONS:
        return name
    if name in FAMILIES:
        return FAMILIES[name]
    raise ValueError(
        f"unknown coordinates {name!r}; use a convention ({', '.join(CONVENTIONS)}) or a model "
        f"family ({', '.join(FAMILIES)}) (--env-option coordinates=...)"
    )


def smart_resize(width: int, height: int) -> tuple[int, int]:
    """Qwen2.5-VL's ``smart_resize``: each side rounded to a multiple of 28, the area scaled into
    [56·56, 16384·28·28] keeping the aspect ratio. 1920x1080 -> 1932x1092; 1280x720 -> 1288x728."""
    w = max(_FACTOR, round(width / _FACTOR) * _FACTOR)
    h = max(_FACTOR, round(height / _FACTOR) * _FACTOR)
    if w * h > _MAX_PIXELS:
        beta = math.sqrt(width * height / _MAX_PIXELS)
        w = math.floor(width / beta / _FACTOR) * _FACTOR
        h = math.floor(height / beta / _FACTOR) * _FACTOR
    elif w * h < _MIN_PIXELS:
        beta = math.sqrt(_MIN_PIXELS / (width * height))
        w = math.ceil(width * beta / _FACTOR) * _FACTOR
        h = math.ceil(height * beta / _FACTOR) * _FACTOR
    return w, h


def image_size(convention: str, width: int, height: int) -> tuple[int, int]:
    """The size the screenshot is sent at, given the downscaled ``width`` x ``height``."""
    return smart_resize(width, height) if convention == "smart_resize" else (width, height)


def to_screen(convention: str, x: float, y: float, *, image: tuple[int, int],
              screen: tuple[int, int]) -> tuple[int, int]:  # fmt: skip
    """A model's point in ``convention`` to screen pixels, clamped onto the screen. ``image``:
    the size the screenshot was sent at (`image_size`)."""
    sw, sh = screen
    if convention in ("screenshot", "smart_resize"):
        sx, sy = x * sw / image[0], y * sh / image[1]
    elif convention == "grid999":
        sx, sy = x * sw / 999, y * sh / 999
    elif convention == "fraction":
        sx, sy = x * sw, y * sh
    else:
        raise ValueError(f"unknown coordinate convention {convention!r}")
    return min(max(round(sx), 0), sw - 1), min(max(round(sy), 0), sh - 1)


def describe(convention: str, image: tuple[int, int]) -> str:
    """One line for the observation: what the computer tool's coordinates mean."""
    return {
        "screenshot": "the computer tool takes coordinates in the screenshot's pixels (scaled to the screen for you)",
        "smart_resize": f"the computer tool takes coordinates in pixels of this {image[0]}x{image[1]} image",
        "grid999": "the computer tool takes coordinates on a 1000x1000 grid over the screen (0..999 each way)",
        "fraction": "the computer tool takes coordinates as fractions of the screen (0..1 each way)",
    }[convention]


# -- OpenAI's batched computer actions -------------------------------------------------
_OPENAI_BUTTONS = {"left": "left_click", "right": "right_click", "wheel": "middle_click"}
_OPENAI_KEYS = {"ENTER": "Return", "RETURN": "Return", "ESC": "Escape", "ESCAPE": "Escape", "SPACE": "space",
                "BACKSPACE": "BackSpace", "TAB": "Tab", "DELETE": "Delete", "ARROWUP": "Up", "ARROWDOWN": "Down",
                "ARROWLEFT": "Left", "ARROWRIGHT": "Right", "PAGEUP": "Page_Up", "PAGEDOWN": "Page_Down",
                "HOME": "Home", "END": "End", "CMD": "super", "META": "super", "SUPER": "super", "OPTION": "alt"}  # fmt: skip
SCROLL_PIXELS_PER_CLICK = 100
"""OpenAI's scroll is in pixels; the desktop scrolls in wheel clicks, one per this many pixels."""


def from_openai(action: object) -> dict[str, object]:
    """One action of OpenAI's GA computer tool (``computer_call.actions[]``: ``{"type": ..., ...}``) as
    a computer_use action. Its points are pixels of the screenshot, as ours.

    Raises:
        ValueError: an action this desktop cannot do, or a malformed one (named).
    """
    if not isinstance(action, dict) or not isinstance(action.get("type"), str):
        raise ValueError(f'an OpenAI computer action is {{"type": ..., ...}}, got {action!r}'[:300])
    kind = action["type"]

    def point(value: object) -> list[object]:
        if not isinstance(value, dict) or "x" not in value or "y" not in value:
            raise ValueError(f"{kind} needs x and y, got {value!r}"[:300])
        return [value["x"], value["y"]]

    if kind == "click":
        button = action.get("button", "left")
        if button not in _OPENAI_BUTTONS:
            raise ValueError(
                f"click button {button!r} is not one this desktop has (left, right, wheel)"
            )
        return {"action": _OPENAI_BUTTONS[button], "coordinate": point(action)}
    if kind == "double_click":
        return {"action": "double_click", "coordinate": point(action)}
    if kind == "move":
        return {"action": "mouse_move", "coordinate": point(action)}
    if kind == "drag":
        path = action.get("path")
        if not isinstance(path, list) or len(path) < 2:
            raise ValueError("drag needs a path of at least two points")
        return {
            "action": "left_click_drag",
            "start_coordinate": point(path[0]),
            "coordinate": point(path[-1]),
        }
    if kind == "scroll":
        dx, dy = action.get("scroll_x", 0), action.get("scroll_y", 0)
        if (
            not isinstance(dx, int | float)
            or not isinstance(dy, int | float)
            or (dx and dy)
            or not (dx or dy)
        ):
            raise ValueError("scroll needs one of scroll_x or scroll_y, non-zero (pixels)")
        direction = ("down" if dy > 0 else "up") if dy else ("right" if dx > 0 else "left")
        clicks = min(100, max(1, round(abs(dy or dx) / SCROLL_PIXELS_PER_CLICK)))
        out: dict[str, object] = {
            "action": "scroll",
            "scroll_direction": direction,
            "scroll_amount": clicks,
        }
        if "x" in action:
            out["coordinate"] = point(action)
        return out
    if kind == "keypress":
        keys = action.get("keys")
        if (
            not isinstance(keys, list)
            or not keys
            or not all(isinstance(k, str) and k for k in keys)
        ):
            raise ValueError("keypress needs keys: a list of key names")
        return {
            "action": "key",
            "text": "+".join(_OPENAI_KEYS.get(k.upper(), k.lower()) for k in keys),
        }
    if kind == "type":
        return {"action": "type", "text": action.get("text")}
    if kind == "wait":
        return {"action": "wait", "duration": 1}
    if kind == "screenshot":
        return {"action": "screenshot"}
    raise ValueError(f"unknown OpenAI computer action {kind!r}")

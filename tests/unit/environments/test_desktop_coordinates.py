"""Coordinate conventions (`_coordinates`): the image each model family is sent, and its points back
on the screen within 1 px, as a model that reads the image exactly would answer."""

from __future__ import annotations

import itertools

import pytest

from agentinfra.environments.desktop._coordinates import (
    FAMILIES,
    convention_for,
    image_size,
    smart_resize,
    to_screen,
)
from agentinfra.environments.desktop._options import DesktopAgentOptions
from agentinfra.errors import ConfigError

SCREEN = (1920, 1080)
SENT = (1280, 720)  # the screenshot downscaled to screenshot_width 1280


def test_smart_resize_matches_qwen25_vls_rule() -> None:
    assert smart_resize(1920, 1080) == (1932, 1092)
    assert smart_resize(1280, 720) == (1288, 728)
    w, h = smart_resize(8000, 6000)  # over the 16384*28*28 budget: scaled down, multiples of 28
    assert w * h <= 16384 * 28 * 28
    assert (w % 28, h % 28) == (0, 0)
    assert smart_resize(20, 20) == (56, 56)  # under the 56*56 floor: scaled up


def _model_point(convention: str, x: int, y: int, image: tuple[int, int]) -> tuple[float, float]:
    """Where a model that reads the image exactly puts the screen's pixel (x, y), in its convention."""
    if convention in ("screenshot", "smart_resize"):
        return round((x + 0.5) * image[0] / SCREEN[0] - 0.5), round(
            (y + 0.5) * image[1] / SCREEN[1] - 0.5
        )
    if convention == "grid999":
        return round(x * 999 / SCREEN[0]), round(y * 999 / SCREEN[1])
    return round(x / SCREEN[0], 4), round(y / SCREEN[1], 4)  # fraction, as models print them


@pytest.mark.parametrize("convention", ["screenshot", "smart_resize", "grid999", "fraction"])
def test_a_point_lands_within_one_pixel(convention: str) -> None:
    image = image_size(convention, *SENT)
    worst = 0
    for x, y in itertools.product(range(0, SCREEN[0], 7), range(0, SCREEN[1], 11)):
        mx, my = _model_point(convention, x, y, image)
        sx, sy = to_screen(convention, mx, my, image=image, screen=SCREEN)
        worst = max(worst, abs(sx - x), abs(sy - y))
    assert worst <= 1, f"{convention}: a point lands {worst} px away"


def test_points_off_the_screen_are_clamped_onto_it() -> None:
    assert to_screen("grid999", 999, 999, image=SENT, screen=SCREEN) == (1919, 1079)
    assert to_screen("fraction", -0.2, 1.5, image=SENT, screen=SCREEN) == (0, 1079)


def test_model_families_name_their_convention() -> None:
    assert [convention_for(f) for f in ("qwen2.5-vl", "ui-tars", "qwen3-vl", "opencua", "kimi")] == [
        "smart_resize", "smart_resize", "grid999", "fraction", "fraction"]  # fmt: skip
    assert set(FAMILIES.values()) <= {"screenshot", "smart_resize", "grid999", "fraction"}
    with pytest.raises(
        ConfigError, match=r"unknown coordinates 'qwen9'; use a convention \(screenshot"
    ):
        DesktopAgentOptions.from_options({"coordinates": "qwen9"})
    with pytest.raises(
        ConfigError, match="applies to the computer_use action space, not 'pyautogui'"
    ):
        DesktopAgentOptions.from_options({"coordinates": "qwen3-vl", "action_space": "pyautogui"})
    assert DesktopAgentOptions.from_options({"coordinates": "qwen3-vl"}).coordinates == "qwen3-vl"


def test_openais_batched_actions_translate_to_computer_use() -> None:
    from agentinfra.environments.desktop._coordinates import from_openai

    assert from_openai({"type": "click", "x": 10, "y": 20, "button": "right"}) == {
        "action": "right_click", "coordinate": [10, 20]}  # fmt: skip
    assert from_openai({"type": "drag", "path": [{"x": 1, "y": 2}, {"x": 5, "y": 5}, {"x": 9, "y": 8}]}) == {
        "action": "left_click_drag", "start_coordinate": [1, 2], "coordinate": [9, 8]}  # fmt: skip
    assert from_openai({"type": "keypress", "keys": ["CTRL", "ENTER"]}) == {
        "action": "key",
        "text": "ctrl+Return",
    }
    assert from_openai({"type": "scroll", "x": 5, "y": 6, "scroll_x": 0, "scroll_y": 250}) == {
        "action": "scroll", "scroll_direction": "down", "scroll_amount": 2, "coordinate": [5, 6]}  # fmt: skip
    assert from_openai({"type": "type", "text": "hi"}) == {"action": "type", "text": "hi"}
    with pytest.raises(ValueError, match="click button 'back' is not one this desktop has"):
        from_openai({"type": "click", "x": 1, "y": 1, "button": "back"})
    with pytest.raises(ValueError, match="unknown OpenAI computer action 'teleport'"):
        from_openai({"type": "teleport"})
    with pytest.raises(ValueError, match="move needs x and y"):
        from_openai({"type": "move", "x": 1})

"""Per-family image-token estimates: the published preprocessing rules, worked by hand."""

from __future__ import annotations

import pytest

from agentinfra.agent import LoopConfig, profile_for
from agentinfra.agent._profiles import image_tokens


@pytest.mark.parametrize(
    ("family", "width", "height", "expected"),
    [
        # M3: 1280x720 is above 451,584 px -> 896x504 on the 28 px grid -> 32*18 + 2
        ("minimax", 1280, 720, 32 * 18 + 2),
        # small images are scaled up to at least 3,136 px (2x2 tokens)
        ("minimax", 20, 20, 2 * 2 + 2),
        # Qwen2.5-VL: 1280x720 fits -> round(720/28)=26, round(1280/28)=46
        ("qwen", 1280, 720, 26 * 46 + 2),
        # Claude: long edge 1568 max, then w*h/750
        ("claude", 1000, 750, 1000),
        ("claude", 3136, 1568, 1568 * 784 // 750 + 1),
        # OpenAI high detail: 1920x1080 -> shortest side 768 -> 1365x768 -> 3x2 tiles
        ("default", 1920, 1080, 85 + 170 * 6),
        ("default", 512, 512, 85 + 170),  # never scaled up: one tile
    ],
)
def test_rules(family: str, width: int, height: int, expected: int) -> None:
    assert image_tokens(family, width, height) == expected


def test_families_from_model_names() -> None:
    assert profile_for("MiniMaxAI/MiniMax-M3").image_tokens(1280, 720) == 578
    assert profile_for("Qwen/Qwen2.5-VL-7B-Instruct").name == "qwen"
    assert profile_for("claude-sonnet-4").name == "claude"
    assert profile_for("gpt-4o").name == "default"


def test_a_fixed_count_is_checked() -> None:
    with pytest.raises(Exception, match="image_tokens=0"):
        LoopConfig(model="m", base_url="http://127.0.0.1:1/v1", image_tokens=0)

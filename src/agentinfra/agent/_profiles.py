"""Per-model-family sampling profiles: defaults live here, never as special cases in the loop.

Each family also states how many prompt tokens one image costs (`ModelProfile.image_tokens`),
because images dominate a computer-use context. The rules, from each family's
published preprocessing (estimates: a server may add a few framing tokens):

- ``minimax`` (M3): ``smart_resize`` to multiples of 28 px within 3,136..451,584
  pixels, 14 px patches merged 2x2, so one token per 28x28 px, plus the start
  and end-of-image tokens (the M3 checkpoint's ``image_processor.py`` and
  ``preprocessor_config.json``).
- ``qwen`` (Qwen2-VL, Qwen2.5-VL): the same 28 px rule within 3,136..12,845,056
  pixels, plus 2 (Qwen's ``preprocessor_config.json``).
- ``claude``: scaled so the long edge is at most 1,568 px, then
  ``width * height / 750`` (Anthropic's vision guide).
- ``default`` (OpenAI's GPT-4o family, ``detail: high``, the common
  OpenAI-compatible convention): fit in 2048x2048, shortest side to 768, then
  85 + 170 per 512 px tile (OpenAI's vision guide).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PROFILES", "ModelProfile", "image_tokens", "profile_for"]


def _patch28(width: int, height: int, min_pixels: int, max_pixels: int) -> int:
    """Tokens of a 28 px patch grid after Qwen-style ``smart_resize`` (2 framing tokens)."""
    h = max(28, round(height / 28) * 28)
    w = max(28, round(width / 28) * 28)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(28, math.floor(height / beta / 28) * 28)
        w = max(28, math.floor(width / beta / 28) * 28)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / 28) * 28
        w = math.ceil(width * beta / 28) * 28
    return (h // 28) * (w // 28) + 2


def _openai_tiles(width: int, height: int) -> int:
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    return 85 + 170 * math.ceil(w / 512) * math.ceil(h / 512)


def _claude(width: int, height: int) -> int:
    scale = min(1.0, 1568 / max(width, height))
    return math.ceil(width * scale * height * scale / 750)


_IMAGE_RULES = {
    "minimax": lambda w, h: _patch28(w, h, 3_136, 451_584),
    "qwen": lambda w, h: _patch28(w, h, 3_136, 12_845_056),
    "claude": _claude,
    "default": _openai_tiles,
}


def image_tokens(family: str, width: int, height: int) -> int:
    """The prompt tokens one ``width`` x ``height`` image costs a model of ``family`` (rules above)."""
    return int(_IMAGE_RULES.get(family, _openai_tiles)(width, height))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelProfile:
    """How to sample from and talk to one family of models."""

    name: str
    temperature: float | None = None
    top_p: float | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    """Non-OpenAI parameters (``top_k``) sent in the request body."""
    keeps_reasoning: bool = False
    """Reasoning must go back into the history unchanged (interleaved thinking)."""
    xml_tool_calls: bool = False
    """Replies may carry tool calls as MiniMax XML text instead of ``tool_calls``."""

    def sampling(self) -> dict[str, Any]:
        """Keyword arguments for ``chat.completions.create``."""
        out: dict[str, Any] = {}
        if self.temperature is not None:
            out["temperature"] = self.temperature
        if self.top_p is not None:
            out["top_p"] = self.top_p
        if self.extra_body:
            out["extra_body"] = dict(self.extra_body)
        return out

    def image_tokens(self, width: int, height: int) -> int:
        """What one image of this size costs in the prompt (see the module docstring)."""
        return image_tokens(self.name, width, height)


PROFILES: dict[str, ModelProfile] = {
    # MiniMax-M2/M3 README: temperature 1.0, top_p 0.95, top_k 40; reasoning kept in history.
    "minimax": ModelProfile(
        name="minimax",
        temperature=1.0,
        top_p=0.95,
        extra_body={"top_k": 40},
        keeps_reasoning=True,
        xml_tool_calls=True,
    ),
    "qwen": ModelProfile(name="qwen"),
    # SmolLM2-Instruct's model card samples with temperature 0.2, top_p 0.9; at vLLM's default
    # of 1.0 the 135M model loses the thread of a long tool prompt within a sentence.
    "smollm": ModelProfile(name="smollm", temperature=0.2, top_p=0.9),
    "claude": ModelProfile(name="claude"),
    "default": ModelProfile(name="default"),
}


def profile_for(model: str) -> ModelProfile:
    """The profile of a model name: ``MiniMaxAI/MiniMax-M3`` -> ``minimax``, ``Qwen/...`` -> ``qwen``,
    ``claude-...`` -> ``claude``, ``...SmolLM2...`` -> ``smollm``; unknown -> ``default``."""
    lowered = model.lower()
    if "minimax" in lowered:
        return PROFILES["minimax"]
    if "qwen" in lowered:
        return PROFILES["qwen"]
    if "smollm" in lowered:
        return PROFILES["smollm"]
    if "claude" in lowered:
        return PROFILES["claude"]
    return PROFILES["default"]

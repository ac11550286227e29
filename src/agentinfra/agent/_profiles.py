"""Per-model-family sampling profiles: defaults live here, never as special cases in the loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["PROFILES", "ModelProfile", "profile_for"]


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
    "default": ModelProfile(name="default"),
}


def profile_for(model: str) -> ModelProfile:
    """The profile of a model name: ``MiniMaxAI/MiniMax-M3`` -> ``minimax``; unknown -> ``default``."""
    lowered = model.lower()
    if "minimax" in lowered:
        return PROFILES["minimax"]
    return PROFILES["default"]

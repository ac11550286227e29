"""Cutting the submitted file out of a model's reply: text only, never executed here."""

from __future__ import annotations

import re

__all__ = ["python_submission"]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def python_submission(reply: str, *, marker: str = "ModelNew") -> bytes:
    """The file a reply submits: its last fenced block that mentions ``marker``, else its
    last fenced block, else the whole reply; a blank reply is one newline (graded as the
    empty file it is, so every rollout gets a verdict from the grader)."""
    blocks = [body for _, body in _FENCE.findall(reply)]
    chosen = next((b for b in reversed(blocks) if marker in b), blocks[-1] if blocks else reply)
    text = chosen.strip("\n")
    return (text + "\n").encode() if text.strip() else b"\n"

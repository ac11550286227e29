"""Tool results that carry images: content parts of text and PNG images.

A tool handler returns a string, or a list of `TextPart` and `ImagePart`. On the
way to the model an image becomes an OpenAI ``image_url`` part with a PNG data
URL. In the transcript (and so in exports) it is a reference
``{"type": "image", "sha256": ..., "media_type": "image/png", "width": ..., "height": ...}`` to
``agent/images/<sha256>.png``, stored once.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentinfra.errors import ToolError

__all__ = [
    "ContentPart",
    "ImagePart",
    "TextPart",
    "ToolResult",
    "check_png",
    "image_data_url",
    "image_ref",
    "is_image_ref",
]

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_MAX_SIDE = 1 << 15


def check_png(data: bytes) -> tuple[int, int]:
    """The width and height of a PNG image.

    Raises:
        ToolError: ``data`` is not a PNG (signature, IHDR chunk and a sane size).
    """
    if len(data) < 33 or not data.startswith(_PNG_SIGNATURE) or data[12:16] != b"IHDR":
        raise ToolError(
            f"an image part must be a PNG file; got {len(data)} bytes starting {data[:8]!r}"
        )
    width, height = struct.unpack(">II", data[16:24])
    if not (0 < width <= _MAX_SIDE and 0 < height <= _MAX_SIDE):
        raise ToolError(
            f"PNG image of {width}x{height} pixels; each side must be in 1..{_MAX_SIDE}"
        )
    return width, height


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class ImagePart:
    """A PNG image (checked when made)."""

    png: bytes

    def __post_init__(self) -> None:
        check_png(self.png)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.png).hexdigest()


ContentPart = TextPart | ImagePart
ToolResult = str | Sequence[ContentPart]


def image_ref(sha256: str, width: int | None = None, height: int | None = None) -> dict[str, Any]:
    """How an image appears in the transcript and the export (with its size when known)."""
    ref: dict[str, Any] = {"type": "image", "sha256": sha256, "media_type": "image/png"}
    if width is not None and height is not None:
        ref |= {"width": width, "height": height}
    return ref


def is_image_ref(part: Any) -> bool:
    return (
        isinstance(part, dict)
        and part.get("type") == "image"
        and isinstance(part.get("sha256"), str)
    )


def image_data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")

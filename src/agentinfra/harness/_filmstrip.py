"""The filmstrip of an agent run whose tools return images (a desktop run): one frame per action.

Each frame is the image the model was looking at when it chose the action (the
last image before the call), a thumbnail with the action's point drawn on it,
the call itself and the model's reasoning for that turn. Points come from the
call's arguments: ``coordinate``/``start_coordinate`` are in the image's pixels
(the computer-use convention); ``parameters.x``/``y`` are screen pixels, mapped
with the ``(scale S)`` the previous observation stated. Read from the transcript
and the run's stored images only; nothing here knows an environment.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from pathlib import Path
from typing import Any

from agentinfra.agent import Transcript

__all__ = ["filmstrip_frames", "render_filmstrip"]

THUMB_WIDTH = 360
_SCALE = re.compile(r"\(scale ([0-9.]+)\)")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def filmstrip_frames(transcript: Path) -> list[dict[str, Any]]:
    """One frame per tool call made while an image was on screen: turn, call, reasoning, image, points."""
    if not transcript.is_file():
        return []
    frames: list[dict[str, Any]] = []
    image: str | None = None
    scale = 1.0
    reasoning: dict[int, str] = {}
    for event in Transcript.read(transcript):
        data = event.data
        if event.type == "model_response":
            message = data.get("message", {})
            reasoning[int(data.get("turn", 0))] = str(
                message.get("reasoning_content") or message.get("content") or ""
            )
        elif event.type == "tool_started" and image is not None:
            try:
                args = json.loads(data.get("arguments") or "{}")
            except ValueError:
                args = {}
            frames.append({"turn": data.get("turn"), "tool": data.get("name"), "arguments": args,
                           "reasoning": reasoning.get(int(data.get("turn", 0)), "")[:1000],
                           "image": image, "points": _points(args, scale)})  # fmt: skip
        elif event.type == "tool_result":
            content = data.get("content")
            found = _SCALE.search(_text(content))
            if found:
                scale = float(found[1])
            if isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and part.get("type") == "image":
                        image = str(part["sha256"])
    return frames


def _points(args: dict[str, Any], scale: float) -> list[tuple[float, float]]:
    points = []
    for key in ("start_coordinate", "coordinate"):
        value = args.get(key)
        if (
            isinstance(value, list)
            and len(value) == 2
            and all(isinstance(v, int | float) for v in value)
        ):
            points.append((float(value[0]), float(value[1])))
    params = args.get("parameters")
    if (
        isinstance(params, dict)
        and isinstance(params.get("x"), int | float)
        and isinstance(params.get("y"), int | float)
    ):
        points.append((float(params["x"]) / scale, float(params["y"]) / scale))
    return points


def _thumbnail(png: bytes) -> tuple[str, float, int, int]:
    """A data URL of the image at `THUMB_WIDTH` (the image itself without Pillow), its factor and size."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with the desktop extra
        return "data:image/png;base64," + base64.b64encode(png).decode(), 1.0, 0, 0
    image = Image.open(io.BytesIO(png))
    factor = THUMB_WIDTH / image.width
    small = image.convert("RGB").resize((THUMB_WIDTH, round(image.height * factor)))
    buffer = io.BytesIO()
    small.save(buffer, format="JPEG", quality=70)
    return (
        "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode(),
        factor,
        small.width,
        small.height,
    )


def render_filmstrip(frames: list[dict[str, Any]], images_dir: Path) -> str:
    """The frames as HTML, thumbnails inline (the report stays one self-contained file).

    The first frame of each turn is the anchor ``#turn-N`` (anomalies link there)."""
    if not frames:
        return ""
    esc = html.escape
    cached: dict[str, tuple[str, float, int, int]] = {}
    cells = []
    anchored: set[Any] = set()
    for frame in frames:
        sha = frame["image"]
        if sha not in cached:
            path = images_dir / f"{sha}.png"
            cached[sha] = _thumbnail(path.read_bytes()) if path.is_file() else ("", 1.0, 0, 0)
        url, factor, width, height = cached[sha]
        marks = "".join(
            f'<circle cx="{x * factor:.1f}" cy="{y * factor:.1f}" r="7" fill="none" stroke="#e0245e" stroke-width="3"/>'
            for x, y in frame["points"]
        )
        if len(frame["points"]) == 2:
            (x0, y0), (x1, y1) = frame["points"]
            marks += (f'<line x1="{x0 * factor:.1f}" y1="{y0 * factor:.1f}" x2="{x1 * factor:.1f}" '
                      f'y2="{y1 * factor:.1f}" stroke="#e0245e" stroke-width="2"/>')  # fmt: skip
        overlay = (
            f'<svg width="{width}" height="{height}" style="position:absolute;left:0;top:0">{marks}</svg>'
            if width
            else ""
        )
        picture = f'<div style="position:relative;width:{width or THUMB_WIDTH}px"><img src="{url}" width="{width or THUMB_WIDTH}">{overlay}</div>'
        call = esc(f"{frame['tool']} {json.dumps(frame['arguments'])}")
        anchor = "" if frame["turn"] in anchored else f' id="turn-{frame["turn"]}"'
        anchored.add(frame["turn"])
        cells.append(f"<tr{anchor}><td>{frame['turn']}</td><td>{picture}</td><td><code>{call}</code><br>"
                     f"<small>{esc(frame['reasoning'])}</small></td></tr>")  # fmt: skip
    return ("<h2>Filmstrip</h2><p>The screen the model saw before each action; the action's point is circled.</p>"
            f"<table><tr><th>turn</th><th>screen</th><th>action and reasoning</th></tr>{''.join(cells)}</table>")  # fmt: skip

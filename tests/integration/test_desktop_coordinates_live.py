"""Each coordinate convention on a real desktop: a model's point, in its family's convention, moves
the pointer to within 1 px of the screen pixel it means (the pointer is read back from X)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from agentinfra.environments import AgentHooks, Submission
from agentinfra.environments.desktop import load_desktop_task
from agentinfra.environments.desktop._agent import DesktopAgent
from agentinfra.environments.desktop._options import DesktopAgentOptions
from agentinfra.environments.desktop._session import check_prerequisites
from agentinfra.errors import TaskEnvironmentError

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "examples" / "desktop" / "tasks" / "os-mkdir.json"
TARGET = (1234, 567)  # a screen pixel off every grid's lines

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _desktop_available() -> None:
    try:
        check_prerequisites()
    except TaskEnvironmentError as exc:
        pytest.fail(str(exc))


# (coordinates option, the point a model of that family gives for TARGET seeing a 1280-wide screenshot)
CASES = [
    (
        "screenshot",
        [round(1234 * 1280 / 1920), round(567 * 720 / 1080)],
    ),  # Claude, OpenAI: image px
    (
        "qwen2.5-vl",
        [round(1234 * 1288 / 1920), round(567 * 728 / 1080)],
    ),  # smart_resize: 1288x728 px
    ("qwen3-vl", [round(1234 * 999 / 1920), round(567 * 999 / 1080)]),  # the 0..999 grid
    ("opencua", [round(1234 / 1920, 4), round(567 / 1080, 4)]),  # fractions
]


@pytest.mark.parametrize(("coordinates", "point"), CASES)
def test_a_models_point_lands_within_one_pixel(
    tmp_path: Path, coordinates: str, point: list[float]
) -> None:
    async def submit(_: Submission) -> str:
        return "submitted"

    async def results(_: float) -> str:
        return ""

    async def main() -> str:
        options = DesktopAgentOptions.from_options(
            {
                "action_space": "computer_use",
                "observation": "screenshot",
                "coordinates": coordinates,
            }
        )
        agent = DesktopAgent(load_desktop_task(TASK), None, tmp_path, AgentHooks(submit=submit, results=results),
                             options)  # fmt: skip
        try:
            return str(await agent.act({"action": "mouse_move", "coordinate": point}))
        finally:
            await agent.close()

    observed = asyncio.run(main())
    found = re.search(r"pointer at screen (\d+),(\d+)", observed)
    assert found, observed[:500]
    x, y = int(found.group(1)), int(found.group(2))
    assert abs(x - TARGET[0]) <= 1, (coordinates, x)
    assert abs(y - TARGET[1]) <= 1, (coordinates, y)
    if coordinates == "qwen2.5-vl":
        assert (
            "1288x728" in observed
        )  # the image is sent at the size the model's coordinates refer to


def _agent(tmp_path: Path, **options: object) -> DesktopAgent:
    async def submit(_: Submission) -> str:
        return "submitted"

    async def results(_: float) -> str:
        return ""

    return DesktopAgent(load_desktop_task(TASK), None, tmp_path, AgentHooks(submit=submit, results=results),
                        DesktopAgentOptions.from_options({"action_space": "computer_use", **options}))  # fmt: skip


def test_openais_batched_actions_run_in_order_with_one_observation(tmp_path: Path) -> None:
    from agentinfra.errors import ToolError

    async def main() -> tuple[str, str]:
        agent = _agent(tmp_path, observation="screenshot", coordinates="openai")
        try:
            moved = await agent.act_batch([{"type": "move", "x": 100, "y": 100},
                                           {"type": "move", "x": 1234 * 1280 // 1920, "y": 567 * 720 // 1080}])  # fmt: skip
            try:
                await agent.act_batch([{"type": "move", "x": 1, "y": 1}, {"type": "teleport"}])
            except ToolError as exc:
                refused = str(exc)
            return str(moved), refused
        finally:
            await agent.close()

    moved, refused = asyncio.run(main())
    assert (
        sum(1 for part in moved.split("pointer at screen")) == 2
    )  # one observation, after the last
    found = re.search(r"pointer at screen (\d+),(\d+)", moved)
    assert found
    assert abs(int(found.group(1)) - TARGET[0]) <= 1
    assert abs(int(found.group(2)) - TARGET[1]) <= 1
    assert "unknown OpenAI computer action 'teleport'; none of the batch ran" in refused


def test_claudes_zoom_shows_the_region_at_the_screenshots_width(tmp_path: Path) -> None:
    async def main() -> list[object]:
        agent = _agent(tmp_path, observation="screenshot")
        try:
            return list(await agent.act({"action": "zoom", "region": [0, 0, 320, 180]}))
        finally:
            await agent.close()

    import io

    from PIL import Image

    parts = asyncio.run(main())
    text, image = str(parts[0]), parts[1]
    assert (
        "zoomed: screen region 0,0 to 480,270 shown at 1280x720" in text
    )  # screenshot px scaled to screen
    assert Image.open(io.BytesIO(image.png)).size == (1280, 720)  # type: ignore[attr-defined]

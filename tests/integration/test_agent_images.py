"""Tool results with images: into the request as PNG data URLs, into the transcript once, through resume and trimming.

The scripted server decodes every ``image_url`` part and rejects one that is
not a valid PNG, so these tests fail if an image is lost or mangled on the way.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from agentinfra.agent import (
    AgentLoop,
    ImagePart,
    LoopConfig,
    ModelClient,
    Reply,
    ScriptedModelServer,
    TextPart,
    Tool,
    Transcript,
    check_png,
    profile_for,
)
from agentinfra.errors import ToolError

MODEL = "MiniMaxAI/MiniMax-M3"


def png(width: int, height: int, shade: int) -> bytes:
    """A real grey PNG, written with zlib (no imaging library)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    rows = b"".join(b"\x00" + bytes([shade]) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


SHOTS = [png(32, 16, 40), png(32, 16, 120), png(32, 16, 200)]


def screenshot_tool(calls: list[int]) -> Tool:
    async def handler(args: dict[str, Any]) -> list[TextPart | ImagePart]:
        index = int(args.get("index", 0))
        calls.append(index)
        if index < 0:
            return [ImagePart(b"not a png at all, just bytes......")]
        return [TextPart(f"screen {index}"), ImagePart(SHOTS[index % len(SHOTS)])]

    schema = {"type": "object", "properties": {"index": {"type": "integer"}}}
    return Tool("screenshot", "Take a screenshot.", schema, handler)


def script(body: dict[str, Any]) -> Reply:
    turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if turn == 0:  # two images in one turn, the second identical to a later one
        return Reply(tool_calls=[("screenshot", '{"index": 0}'), ("screenshot", '{"index": 1}')])
    if turn == 1:
        return Reply(tool_calls=[("screenshot", '{"index": -1}')])
    if turn < 5:
        return Reply(tool_calls=[("screenshot", f'{{"index": {turn}}}')])
    return Reply(content="done")


def make_loop(tmp_path: Path, server: ScriptedModelServer, transcript: Transcript, calls: list[int],
              **config: Any) -> AgentLoop:  # fmt: skip
    cfg = LoopConfig(model=MODEL, base_url=server.base_url, stream=False, **config)
    client = ModelClient(base_url=server.base_url, model=MODEL, api_key="test-key", api_key_env="K",
                         profile=profile_for(MODEL), backoff_s=0.01)  # fmt: skip
    return AgentLoop(config=cfg, client=client, tools=[screenshot_tool(calls)], system_prompt="s",
                     task_prompt="t", transcript=transcript)  # fmt: skip


def run(loop: AgentLoop) -> None:
    async def go() -> None:
        try:
            await loop.run()
        finally:
            await loop.client.close()

    asyncio.run(go())


def test_images_reach_the_model_as_png_data_urls_and_are_stored_once(tmp_path: Path) -> None:
    calls: list[int] = []
    with ScriptedModelServer(script, models=[MODEL]) as server:
        (tmp_path / "agent").mkdir()
        transcript = Transcript.open(tmp_path / "agent" / "transcript.jsonl")
        loop = make_loop(tmp_path, server, transcript, calls)
        run(loop)
        second = server.requests[1]["messages"]
    # the turn's two tool results as text, then one user message with both images
    assert [m["role"] for m in second[-4:]] == ["assistant", "tool", "tool", "user"]
    assert second[-3]["content"].startswith("screen 0\n[image ")
    images = [p for p in second[-1]["content"] if p["type"] == "image_url"]
    assert len(images) == 2
    assert all(p["image_url"]["url"].startswith("data:image/png;base64,") for p in images)
    assert server.images[:2] == SHOTS[:2]
    assert all(check_png(image) == (32, 16) for image in server.images)
    # stored once, by content hash; the transcript holds references only
    stored = sorted(p.name for p in (tmp_path / "agent" / "images").iterdir())
    assert stored == sorted({f"{hashlib.sha256(s).hexdigest()}.png" for s in SHOTS})
    assert b"base64" not in (tmp_path / "agent" / "transcript.jsonl").read_bytes()
    # a tool that returns a non-PNG image: an error for the model, and the run goes on
    bad = next(e for e in transcript.events if e.type == "tool_result" and e.data["turn"] == 2)
    assert bad.data["is_error"]
    assert "must be a PNG file" in bad.data["content"]
    assert transcript.events[-1].data["reason"] == "done"
    # resume rebuilds the same history, images included, without calling a tool again
    replayed = make_loop(tmp_path, server, transcript, calls)
    assert replayed._replay() == []
    assert replayed.messages == loop.messages
    transcript.close()


def test_old_images_are_dropped_before_old_text_and_journalled(tmp_path: Path) -> None:
    calls: list[int] = []
    with ScriptedModelServer(script, models=[MODEL]) as server:
        transcript = Transcript.open(tmp_path / "t.jsonl")
        # each image counts 2,000 tokens: the images alone outgrow 80% of the window
        loop = make_loop(tmp_path, server, transcript, calls, context_tokens=5_000, image_tokens=2_000,
                         keep_recent_turns=1)  # fmt: skip
        run(loop)
        last = server.requests[-1]["messages"]
    trims = [e.data for e in transcript.events if e.type == "context_trimmed"]
    dropped = [c for t in trims for c in t["changes"] if c["op"] == "drop_images"]
    assert dropped, "old images were never dropped"
    assert all(c["op"] != "drop" for t in trims for c in t["changes"][: len(dropped)])
    ops = [c["op"] for c in trims[0]["changes"]]
    assert ops.index("drop_images") == 0  # images go before any text is shortened or dropped
    # the last request carries only the most recent turn's image
    sent = [
        p
        for m in last
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image_url"
    ]
    assert len(sent) == 1
    replayed = make_loop(tmp_path, server, transcript, calls, context_tokens=5_000, image_tokens=2_000,
                         keep_recent_turns=1)  # fmt: skip
    replayed._replay()
    assert replayed.messages == loop.messages
    transcript.close()


def test_scripted_server_rejects_an_image_that_is_not_a_png(tmp_path: Path) -> None:
    import openai

    with ScriptedModelServer(lambda body: Reply(content="x"), models=[MODEL]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test-key", max_retries=0)
        bad = {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}
        with pytest.raises(openai.BadRequestError, match="valid PNG"):
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": [bad]}]
            )  # type: ignore[list-item]
        client.close()


def test_image_part_checks_png() -> None:
    with pytest.raises(ToolError, match="must be a PNG"):
        ImagePart(b"GIF89a" + b"\0" * 40)
    assert ImagePart(SHOTS[0]).sha256 == hashlib.sha256(SHOTS[0]).hexdigest()


def test_export_references_each_image_by_hash(tmp_path: Path) -> None:
    import json

    from agentinfra.harness import RunDirectory, RunSpec, export_record

    spec = RunSpec(run_id="img", environment="kernels", task=str(tmp_path / "task.py"))
    directory = RunDirectory.create(tmp_path / "run", spec, grader_version="1.0.0")
    directory.layout.agent_dir.mkdir()
    calls: list[int] = []
    with ScriptedModelServer(script, models=[MODEL]) as server:
        transcript = Transcript.open(directory.layout.transcript)
        run_loop = make_loop(tmp_path, server, transcript, calls)
        run(run_loop)
        transcript.close()
    directory.close()
    record = export_record(tmp_path / "run")
    parts = [p for m in record["messages"] if isinstance(m["content"], list) for p in m["content"]]
    images = [p for p in parts if p["type"] == "image"]
    assert (
        len(images) == 5
    )  # two in the first turn, none in the failed one, one in each of three more
    for image in images:
        data = (tmp_path / "run" / image["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == image["sha256"]
    assert "base64" not in json.dumps(record)

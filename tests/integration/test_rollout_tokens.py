"""The engine's tokens, captured exactly: real vLLM serving SmolLM2-135M-Instruct, behind a recording proxy.

The agent's endpoint is a loopback proxy that the test starts in front of vLLM: every
request goes through it (the run knows only the proxy's URL), and it keeps every response
body exactly as vLLM sent it. The test parses those bodies itself (JSON, or the SSE
chunks) and checks, call by call and in order, that the trajectory's ``prompt_ids``,
``completion_ids`` and ``completion_logprobs`` are the engine's. Segments are checked by
construction from the calls: each segment's ``token_ids`` is the first prompt then, per
call, the prompt's new tokens (mask 0) and the completion (mask 1); a break is real (the
next prompt does not extend the segment) and names its cause. A run with a tiny context
budget forces a trim, which must break with ``context_trim``. The scripted server, which
returns no ids, gives ``tokens: "unavailable"``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agentinfra.agent import LoopConfig, Reply, ScriptedModelServer
from agentinfra.environments.kernels import KernelSettings
from agentinfra.harness import RunDirectory, agent_run_spec, run_agents, trajectory_of

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "examples/kernels/problems/10_slow_rowwise_softmax.py"
TASKS = os.environ.get("AGENTINFRA_TOKENS_TASKS", str(PROBLEM))
"""The tasks of the exactness test (a glob): one episode by default; the measurement in the
report ran it over every kernels problem (``examples/kernels/problems/*.py``)."""


class RecordingProxy:
    """A loopback HTTP/1.1 proxy to ``upstream`` that keeps every exchange: (path, request JSON, response bytes)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[tuple[str, dict[str, Any], bytes]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(server.wait_closed())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                size = int({k.lower(): v for k, v in headers.items()}.get("content-length", "0"))
                body = await reader.readexactly(size) if size else b""
                forwarded = {
                    k: v
                    for k, v in headers.items()
                    if k.lower() in ("content-type", "authorization")
                }
                request = urllib.request.Request(
                    self.upstream + path.removeprefix("/v1"),
                    data=body or None,
                    headers=forwarded,
                    method=method,
                )
                status, kind, content = await asyncio.get_running_loop().run_in_executor(
                    None, _forward, request
                )
                if path.endswith("/chat/completions"):
                    self.exchanges.append((path, json.loads(body), content))
                writer.write(
                    f"HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\n"
                    f"content-length: {len(content)}\r\n\r\n".encode()
                    + content
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def engine_calls(self, task_prompt: str) -> list[dict[str, Any]]:
        """What vLLM returned for each call of the run whose task is ``task_prompt`` (in order; the
        token probe left out), parsed here from the raw bytes."""
        calls = []
        for _, request, content in self.exchanges:
            if request.get("max_tokens") == 1 and "tools" not in request:
                continue  # `probe_tokens`
            if request["messages"][1]["content"] != task_prompt:
                continue  # another run's call
            calls.append(_parse(content, bool(request.get("stream"))) | {"request": request})
        return calls


def _forward(request: urllib.request.Request) -> tuple[int, str, bytes]:
    """One request to the engine, its whole response read (SSE included) before it is passed on."""
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status, response.headers.get("content-type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()


def _parse(content: bytes, stream: bool) -> dict[str, Any]:
    if not stream:
        body = json.loads(content)
        choice = body["choices"][0]
        return {"prompt_ids": body["prompt_token_ids"], "completion_ids": choice["token_ids"],
                "logprobs": [e["logprob"] for e in choice["logprobs"]["content"]],
                "finish_reason": choice["finish_reason"]}  # fmt: skip
    prompt: list[int] | None = None
    ids: list[int] = []
    logprobs: list[float] = []
    finish = None
    for line in content.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: ") :])
        prompt = chunk.get("prompt_token_ids") or prompt
        for choice in chunk["choices"]:
            ids += choice.get("token_ids") or []
            logprobs += [e["logprob"] for e in (choice.get("logprobs") or {}).get("content") or []]
            finish = choice.get("finish_reason") or finish
    return {
        "prompt_ids": prompt,
        "completion_ids": ids,
        "logprobs": logprobs,
        "finish_reason": finish,
    }


def check_segments_by_construction(trajectory: dict[str, Any]) -> None:
    """Each segment is rebuilt from its calls' ids; each break is a real one and has a cause."""
    calls = trajectory["calls"]
    assert [i for s in trajectory["segments"] for i in s["calls"]] == list(range(len(calls)))
    for number, segment in enumerate(trajectory["segments"]):
        tokens: list[int] = []
        mask: list[int] = []
        for index in segment["calls"]:
            call = calls[index]
            assert call["prompt_ids"][: len(tokens)] == tokens  # the exact-prefix property
            new = call["prompt_ids"][len(tokens) :]
            tokens += new + call["completion_ids"]
            mask += [0] * len(new) + [1] * len(call["completion_ids"])
        assert segment["token_ids"] == tokens
        assert segment["loss_mask"] == mask
        sampled = [lp for lp, m in zip(segment["logprobs"], mask, strict=True) if m]
        assert sampled == [lp for i in segment["calls"] for lp in calls[i]["completion_logprobs"]]
        assert all(lp is None for lp, m in zip(segment["logprobs"], mask, strict=True) if not m)
        if number == 0:
            assert segment["break_reason"] is None
            continue
        assert segment["break_reason"] in (
            "context_trim",
            "image_dropped",
            "template_rerender",
            "resume",
        )
        before = trajectory["segments"][number - 1]["token_ids"]
        first = calls[segment["calls"][0]]["prompt_ids"]
        position = segment["break_position"]
        assert first[:position] == before[:position]
        assert (
            position == len(first) or position == len(before) or first[position] != before[position]
        )
        assert first[: len(before)] != before  # a real break


@pytest.fixture
def vllm(smollm2_vllm: str) -> str:
    return smollm2_vllm


def _run_cli(base_url: str, runs: Path, *extra: str, tasks: str = str(PROBLEM)) -> list[Path]:
    from agentinfra.engines import SMOLLM2_NAME

    done = subprocess.run(
        [sys.executable, "-m", "agentinfra", "run", "--tasks", tasks, "--model", SMOLLM2_NAME, "--concurrency", "4",
         "--base-url", base_url, "--runs-dir", str(runs), "--max-turns", "4", "--nudges", "8",
         "--max-output-tokens", "48", "--context-tokens", "8192", *extra],
        capture_output=True, text=True, timeout=900, cwd=ROOT, env={**os.environ, "OPENAI_API_KEY": "unused"},
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return sorted(p for p in runs.iterdir() if (p / "run.json").is_file())


def _check_exact(trajectory: dict[str, Any], engine: list[dict[str, Any]]) -> int:
    assert trajectory["tokens"] == "exact"
    assert len(trajectory["calls"]) == len(engine) > 0
    for ours, theirs in zip(trajectory["calls"], engine, strict=True):
        assert ours["prompt_ids"] == theirs["prompt_ids"]
        assert ours["completion_ids"] == theirs["completion_ids"]
        assert ours["completion_logprobs"] == theirs["logprobs"]
        assert ours["finish_reason"] == theirs["finish_reason"]
        assert theirs["request"]["logprobs"] is True
        assert theirs["request"]["return_token_ids"] is True
    check_segments_by_construction(trajectory)
    return len(engine)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
def test_every_call_is_the_engines_ids_through_a_recording_proxy(
    vllm: str, tmp_path: Path, stream: bool
) -> None:
    with RecordingProxy(vllm) as proxy:
        flags = ["--policy-version", "v3"] + ([] if stream else ["--no-stream"])
        runs = _run_cli(proxy.base_url, tmp_path / "runs", *flags, tasks=TASKS)
        checked = one_segment = 0
        for path in runs:
            trajectory = trajectory_of(path, group_id="g")
            engine = proxy.engine_calls(trajectory["messages"][1]["content"])
            checked += _check_exact(trajectory, engine)
            one_segment += len(trajectory["segments"]) == 1
            assert all(c["policy_version"] == "v3" for c in trajectory["calls"])
            assert all(bool(c["request"].get("stream")) is stream for c in engine)
    print(
        f"token exactness: {len(runs)} episodes, {checked} calls equal to the engine's; "
        f"{one_segment} of {len(runs)} episodes one segment; breaks "
        f"{[s['break_reason'] for p in runs for s in trajectory_of(p)['segments'][1:]]}"
    )
    run = runs[0]
    trajectory = trajectory_of(run, group_id="g")
    # export v4 carries the same calls and segments
    out = tmp_path / "export.jsonl"
    done = subprocess.run([sys.executable, "-m", "agentinfra", "export", str(run), "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["schema_version"] == 4
    assert (record["tokens"], record["calls"], record["segments"]) == (
        "exact", trajectory["calls"], trajectory["segments"],
    )  # fmt: skip
    # a resume (here of a run its budget stopped) keeps every call's ids: they are read back, not re-derived
    spec = json.loads((run / "run.json").read_text())
    assert spec["spec"]["agent"]["loop"]["capture_tokens"] is True
    done = subprocess.run([sys.executable, "-m", "agentinfra", "resume", str(run)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "OPENAI_API_KEY": "unused"}, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = trajectory_of(run, group_id="g")
    assert resumed["calls"] == trajectory["calls"]
    assert resumed["segments"] == trajectory["segments"]


@pytest.mark.slow
@pytest.mark.vllm
def test_a_forced_trim_breaks_the_segment_with_its_cause(vllm: str, tmp_path: Path) -> None:
    from agentinfra.agent import EndpointLimiter
    from agentinfra.engines import SMOLLM2_NAME

    with RecordingProxy(vllm) as proxy:
        config = LoopConfig(
            model=SMOLLM2_NAME, base_url=proxy.base_url, max_turns=6, nudges=10, max_output_tokens=48,
            context_tokens=1600, keep_recent_turns=1, api_key_env="AGENTINFRA_TEST_KEY", capture_tokens=True,
        )  # fmt: skip
        spec = agent_run_spec("trim", PROBLEM, config, KernelSettings(), environment="kernels")
        run = RunDirectory.create(tmp_path / "trim", spec, grader_version="1.0.0")
        try:
            (state,) = asyncio.run(
                run_agents([run], api_key="unused", concurrency=1, limiter=EndpointLimiter())
            )
        finally:
            run.close()
        assert state.error is None, state.error
    trajectory = trajectory_of(run.path)
    _check_exact(trajectory, proxy.engine_calls(trajectory["messages"][1]["content"]))
    transcript = [json.loads(line) for line in run.layout.transcript.read_text().splitlines()]
    assert any(e["type"] == "context_trimmed" for e in transcript)
    breaks = [s["break_reason"] for s in trajectory["segments"]]
    assert "context_trim" in breaks
    print(
        f"forced trim: {len(trajectory['calls'])} calls, {len(breaks)} segments, breaks {breaks[1:]}"
    )


def test_an_endpoint_without_ids_gives_unavailable_tokens(tmp_path: Path) -> None:
    """The scripted server returns no ids: never re-tokenized, marked unavailable, with or without the probe."""
    for forced in ((), ("--tokens",)):
        with ScriptedModelServer(
            lambda body: Reply(content="All done."), models=["scripted"]
        ) as server:
            runs = tmp_path / f"runs{len(forced)}"
            done = subprocess.run(
                [sys.executable, "-m", "agentinfra", "run", "--tasks", str(PROBLEM), "--model", "scripted",
                 "--base-url", server.base_url, "--runs-dir", str(runs), "--max-turns", "2", *forced],
                capture_output=True, text=True, timeout=300, cwd=ROOT,
                env={**os.environ, "OPENAI_API_KEY": "test-key"}, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr[-3000:]
            assert 'tokens: "unavailable"' in done.stderr
            asked = [r for r in server.requests if r.get("tools")]
        (run,) = [p for p in runs.iterdir() if (p / "run.json").is_file()]
        trajectory = trajectory_of(run)
        assert trajectory["tokens"] == "unavailable"
        assert trajectory["segments"] == []
        assert [c["prompt_ids"] for c in trajectory["calls"]] == [None]
        assert trajectory["stop_reason"] == "no_action"  # prose only: the model never acted
        assert all(
            "return_token_ids" not in r for r in asked
        )  # capture is off when nothing comes back

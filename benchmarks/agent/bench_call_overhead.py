"""agentinfra's own time per model call, model time excluded, with and without token capture.

A vLLM-shaped server in another process answers every chat completion at once from
precomputed bytes: a reply with no tool call, ``prompt_token_ids`` that extend the previous
call's ids (a growing context) and ``--completion`` completion ids with logprobs (or no ids
at all, for the run without capture). The real `AgentLoop` drives it with ``--nudges`` so
that every reply gets the loop's reminder and the run goes on for ``--turns`` calls. Per
call, the time from one ``model_response`` journal event to the next (the loop's whole
turn: trimming, wiring the history, the openai client, parsing, journalling the reply
and the reminder with their fsyncs) minus the server's own handling time is agentinfra's
overhead. Loopback HTTP is counted as overhead (a real engine would add it too).

    python benchmarks/agent/bench_call_overhead.py [--smoke] [--turns N] [--prompt 4000] [--completion 200]

Prints one JSON line per configuration: parameters, git revision, Python, CPU count and
the p50/p90 overhead in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentinfra.agent import AgentLoop, LoopConfig, ModelClient, Tool, Transcript, profile_for


def _serve(port_file: str, prompt: int, completion: int, with_ids: bool, stream: bool) -> None:
    """The fake engine: each call's prompt ids extend the last call's ids by 40 new tokens."""
    state = {"ids": list(range(prompt)), "server_s": []}
    logprobs = [{"token": "x", "logprob": -0.25, "bytes": [120], "top_logprobs": []}] * completion
    message = {"role": "assistant", "content": "thinking about it " * 10}

    def body() -> bytes:
        prompt_ids = state["ids"] + list(range(40))
        out = list(range(1000, 1000 + completion))
        state["ids"] = prompt_ids + out
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": completion,
            "total_tokens": 0,
        }
        ids = {"prompt_token_ids": prompt_ids} if with_ids else {}
        if not stream:
            choice = {"index": 0, "message": message, "finish_reason": "stop",
                      "logprobs": {"content": logprobs}, **({"token_ids": out} if with_ids else {})}  # fmt: skip
            return json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                               "choices": [choice], "usage": usage, **ids}).encode()  # fmt: skip
        chunks = [{"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", **ids,
                   "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]  # fmt: skip
        for i in range(0, completion, 10):
            piece = {"index": 0, "delta": {"content": "thinking "},
                     "logprobs": {"content": logprobs[i : i + 10]}, **({"token_ids": out[i : i + 10]} if with_ids else {})}  # fmt: skip
            chunks.append(
                {
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "m",
                    "choices": [piece],
                }
            )
        chunks.append({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                       "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})  # fmt: skip
        chunks.append(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "m",
                "choices": [],
                "usage": usage,
            }
        )
        return (
            b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
            + b"data: [DONE]\n\n"
        )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                started = time.perf_counter()
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length")), 0)  # fmt: skip
                await reader.readexactly(length)
                payload = body()
                kind = b"text/event-stream" if stream else b"application/json"
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + kind + b"\r\ncontent-length: "
                             + str(len(payload)).encode() + b"\r\n\r\n" + payload)  # fmt: skip
                state["server_s"].append(time.perf_counter() - started)
                await writer.drain()
                Path(port_file + ".server").write_text(json.dumps(state["server_s"]))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
        await server.serve_forever()

    asyncio.run(main())


async def _drive(
    base_url: str, turns: int, stream: bool, capture: bool, workdir: Path
) -> list[float]:
    config = LoopConfig(model="m", base_url=base_url, stream=stream, max_turns=turns, nudges=turns + 1,
                        capture_tokens=capture, context_tokens=10_000_000)  # fmt: skip
    client = ModelClient(
        base_url=base_url, model="m", api_key="k", api_key_env="K", profile=profile_for("m")
    )
    transcript = Transcript.open(workdir / "transcript.jsonl")

    async def noop(arguments: dict[str, Any]) -> str:
        return ""

    tool = Tool(
        name="noop",
        description="does nothing",
        parameters={"type": "object", "properties": {}},
        handler=noop,
    )
    loop = AgentLoop(config=config, client=client, tools=[tool], system_prompt="s", task_prompt="t",
                     transcript=transcript)  # fmt: skip
    await loop.run()
    await client.close()
    stamps = [e.mono_s for e in transcript.events if e.type == "model_response"]
    transcript.close()
    return [b - a for a, b in itertools.pairwise(stamps)]


def _git_revision() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


def measure(
    turns: int, prompt: int, completion: int, stream: bool, capture: bool
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = str(Path(tmp) / "port")
        server = subprocess.Popen([sys.executable, __file__, "--serve", port_file, "--prompt", str(prompt),
                                   "--completion", str(completion), *(["--with-ids"] if capture else []),
                                   *(["--stream"] if stream else [])])  # fmt: skip
        try:
            while not Path(port_file).is_file() or not Path(port_file).read_text():
                time.sleep(0.05)
            url = f"http://127.0.0.1:{Path(port_file).read_text()}/v1"
            turn_s = asyncio.run(_drive(url, turns, stream, capture, Path(tmp)))
        finally:
            server.terminate()
            server.wait()
        server_s = (
            json.loads(Path(port_file + ".server").read_text())
            if Path(port_file + ".server").is_file()
            else [0.0]
        )
    overhead_ms = sorted((t - statistics.median(server_s)) * 1000 for t in turn_s)
    return {
        "bench": "agent_call_overhead", "turns": turns, "prompt_tokens_start": prompt, "completion_tokens": completion,
        "stream": stream, "capture_tokens": capture, "p50_ms": round(statistics.median(overhead_ms), 3),
        "p90_ms": round(overhead_ms[int(len(overhead_ms) * 0.9)], 3), "server_p50_ms": round(statistics.median(server_s) * 1000, 3),
        "git": _git_revision(), "python": platform.python_version(), "cpus": os.cpu_count(),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="a few seconds: 20 turns")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--prompt", type=int, default=4000)
    parser.add_argument("--completion", type=int, default=200)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--with-ids", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve, args.prompt, args.completion, args.with_ids, args.stream)
        return
    turns = 20 if args.smoke else args.turns
    for stream in (True, False):
        for capture in (False, True):
            print(
                json.dumps(measure(turns, args.prompt, args.completion, stream, capture)),
                flush=True,
            )


if __name__ == "__main__":
    main()

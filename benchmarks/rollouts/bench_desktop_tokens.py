"""Desktop rollouts of a real model: token exactness, segments, verdicts, throughput, desktop share of wall time.

    .venv/bin/python benchmarks/rollouts/bench_desktop_tokens.py [--smoke] [--tasks 'os-*,editor-append']
        [--group-size 2] [--concurrency 4] [--base-url URL] [--out results/desktop_tokens.jsonl]

SmolLM2-135M-Instruct in vLLM (`VllmServer`, ``.venv/vllm``; or ``--base-url`` of an
engine already serving it) answers through a loopback recording proxy started here,
which keeps every chat-completion response exactly as the engine sent it. One
``agentinfra rollouts run --env desktop --env-option observation=a11y`` (a child
process, G rollouts per task) runs the episodes on real desktops; then, per task,
every recorded call of its G trajectories is paired with one engine response that
has exactly its ``prompt_ids``, ``completion_ids``, logprobs and finish reason (each
response used once; any left over are counted as unmatched).

One JSON line (with the git revision, Python and the machine): episodes, calls,
calls whose ids equal the engine's, unmatched engine responses, episodes that
stayed one segment and the break causes otherwise, final verdicts per episode,
stop reasons, rewards, infra failures, rollouts per minute (first start to last
trajectory), and the shares of the rollouts' summed wall time (``rollout.service_wall_s``)
spent in model calls, desktop actions (tool calls), gradings, and the rest (run
directory, desktop start when the agent never acted, the end's freeze and snapshot,
agentinfra itself).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agentinfra.engines import SMOLLM2_NAME, VllmServer, smollm2_dir

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples/desktop/tasks"


class RecordingProxy:
    """Loopback HTTP/1.1 in front of ``upstream``; keeps (request JSON, response bytes) of chat completions."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[tuple[dict[str, Any], bytes]] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()
        self._ready.wait(10)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                method, path, _ = head[0].split(" ", 2)
                headers = {k.lower(): v for k, _, v in (h.partition(": ") for h in head[1:] if h)}
                size = int(headers.get("content-length", "0"))
                body = await reader.readexactly(size) if size else b""
                forwarded = {
                    k: headers[k] for k in ("content-type", "authorization") if k in headers
                }
                request = urllib.request.Request(self.upstream + path.removeprefix("/v1"),
                                                 data=body or None, headers=forwarded, method=method)  # fmt: skip
                status, kind, content = await asyncio.to_thread(_forward, request)
                if path.endswith("/chat/completions"):
                    self.exchanges.append((json.loads(body), content))
                writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\ncontent-length: {len(content)}"
                             "\r\n\r\n".encode() + content)  # fmt: skip
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _forward(request: urllib.request.Request) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status, response.headers.get("content-type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()


def engine_answer(request: dict[str, Any], content: bytes) -> tuple[Any, ...]:
    """(prompt ids, completion ids, logprobs, finish reason) as the engine sent them, JSON or SSE."""
    if not request.get("stream"):
        choice = json.loads(content)["choices"][0]
        return (json.loads(content)["prompt_token_ids"], choice["token_ids"],
                [e["logprob"] for e in choice["logprobs"]["content"]], choice["finish_reason"])  # fmt: skip
    prompt, ids, logprobs, finish = None, [], [], None
    for line in content.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: ") :])
        prompt = chunk.get("prompt_token_ids") or prompt
        for choice in chunk["choices"]:
            ids += choice.get("token_ids") or []
            logprobs += [e["logprob"] for e in (choice.get("logprobs") or {}).get("content") or []]
            finish = choice.get("finish_reason") or finish
    return prompt, ids, logprobs, finish


def match(
    trajectories: list[dict[str, Any]], engine: list[tuple[Any, ...]]
) -> tuple[int, int, int]:
    """(calls, calls equal to one unused engine answer, engine answers left unmatched) for one task's group."""
    left = list(engine)
    calls = equal = 0
    for trajectory in trajectories:
        for call in trajectory["calls"]:
            calls += 1
            ours = (
                call["prompt_ids"],
                call["completion_ids"],
                call["completion_logprobs"],
                call["finish_reason"],
            )
            if ours in left:
                left.remove(ours)
                equal += 1
    return calls, equal, len(left)


def final_verdicts(runs: Path, run_id: str) -> int:
    found = [p for p in runs.rglob(run_id) if (p / "run.json").is_file()]
    verdicts = [
        json.loads(p.read_text()) for run in found for p in (run / "evaluations").rglob("*.json")
    ]
    return sum(1 for v in verdicts if v.get("details", {}).get("final"))


def run(args: argparse.Namespace, base_url: str, folder: Path) -> dict[str, Any]:
    proxy = RecordingProxy(base_url)
    tasks = sorted({p for pattern in args.tasks.split(",") for p in TASKS.glob(f"{pattern}.json")})
    out = folder / "trajectories.jsonl"
    command = [sys.executable, "-m", "agentinfra", "rollouts", "run", "--env", "desktop",
               *[a for t in tasks for a in ("--tasks", str(t))], "--group-size", str(args.group_size),
               "--model", SMOLLM2_NAME, "--base-url", proxy.base_url, "--out", str(out),
               "--runs-dir", str(folder / "runs"), "--concurrency", str(args.concurrency),
               "--max-turns", str(args.max_turns), "--nudges", "2", "--max-output-tokens", "64",
               "--context-tokens", "8192", "--env-option", "observation=a11y",
               "--env-option", "a11y_tokens=1500", "--env-option", f"desktops={args.concurrency}"]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False,
                          env={**os.environ, "OPENAI_API_KEY": "unused"})  # fmt: skip
    wall_s = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"rollouts run exited {done.returncode}:\n{done.stderr[-3000:]}")
    trajectories = [json.loads(line) for line in out.read_text().splitlines()]
    by_prompt: dict[str, list[tuple[Any, ...]]] = collections.defaultdict(list)
    for request, content in proxy.exchanges:
        if "tools" in request:  # not the token probe
            by_prompt[json.dumps(request["messages"][1]["content"])].append(
                engine_answer(request, content)
            )
    calls = equal = unmatched = 0
    for task in {t["task"] for t in trajectories}:
        group = [t for t in trajectories if t["task"] == task]
        counted = match(group, by_prompt.pop(json.dumps(group[0]["messages"][1]["content"]), []))
        calls, equal, unmatched = calls + counted[0], equal + counted[1], unmatched + counted[2]
    unmatched += sum(len(v) for v in by_prompt.values())
    service = sum(t["rollout"]["service_wall_s"] for t in trajectories)
    spent = {
        k: sum((t.get("time") or {}).get(k, 0.0) for t in trajectories)
        for k in ("model_s", "tools_s", "grading_s")
    }
    breaks = collections.Counter(
        str(s["break_reason"]) for t in trajectories for s in t["segments"][1:]
    )
    return {
        "part": "desktop_tokens", "model": SMOLLM2_NAME, "tasks": len(tasks), "group_size": args.group_size,
        "concurrency": args.concurrency, "max_turns": args.max_turns, "episodes": len(trajectories),
        "calls": calls, "calls_equal_to_engine": equal, "engine_answers_unmatched": unmatched,
        "exact_share": round(equal / calls, 4) if calls else None,
        "tokens": dict(collections.Counter(t["tokens"] for t in trajectories)),
        "one_segment": sum(1 for t in trajectories if len(t["segments"]) == 1),
        "break_causes": dict(breaks),
        "final_verdicts_per_episode": dict(collections.Counter(
            final_verdicts(folder / "runs", t["run_id"]) for t in trajectories)),
        "stop_reasons": dict(collections.Counter(str(t["stop_reason"]) for t in trajectories)),
        "rewards": dict(collections.Counter(t["reward"] for t in trajectories)),
        "infra_failures": [t["infra_failure"] for t in trajectories if t["infra_failure"]],
        "wall_s": round(wall_s, 1), "rollouts_per_min": round(60 * len(trajectories) / wall_s, 2),
        "share_of_rollout_wall": {"model": round(spent["model_s"] / service, 3),
                                  "desktop_actions": round(spent["tools_s"] / service, 3),
                                  "grading": round(spent["grading_s"] / service, 3),
                                  "rest": round(1 - sum(spent.values()) / service, 3)},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="Two tasks, G=2, two turns.")
    parser.add_argument(
        "--tasks", default="os-*,editor-append", help="Task ids or globs, comma-separated."
    )
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument(
        "--base-url", help="An engine already serving SmolLM2 (default: start one)."
    )
    parser.add_argument("--keep", type=Path, help="Keep the run directories here.")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "desktop_tokens.jsonl"
    )
    args = parser.parse_args()
    if args.smoke:
        args.tasks, args.max_turns = "os-mkdir,os-write-file", 2
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=ROOT).stdout.strip()  # fmt: skip
    meta = {"revision": revision, "python": platform.python_version(), "cpus": os.cpu_count(),
            "machine": platform.machine()}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-desktop-tokens-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if args.base_url:
            record = run(args, args.base_url, folder)
        else:
            with VllmServer(
                smollm2_dir(), log=folder / "vllm.log", served_name=SMOLLM2_NAME
            ) as vllm:
                record = run(args, vllm.base_url, folder)
    record = {**meta, **record}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()

"""A scripted OpenAI-compatible server on loopback, for tests and demos (no model, no network).

Real HTTP/1.1 and real server-sent events: ``POST /v1/chat/completions`` answers
with the next `Reply` of the script, as JSON or, when the request says
``"stream": true``, as SSE chunks (reasoning, content and tool-call arguments
split across deltas, usage last). ``GET /v1/models`` lists the known models.
A request with an unknown model gets 404 and a wrong key 401, as a real server
would. Every request body is kept in ``requests`` for assertions. Every
``image_url`` part must be a PNG data URL holding a valid PNG (else 400); the
decoded images are kept in ``images``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentinfra.agent._content import check_png
from agentinfra.errors import ToolError

__all__ = ["Reply", "ScriptedModelServer"]


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted answer: an error status, or an assistant message."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: Sequence[tuple[str, str]] = ()
    """(name, arguments JSON text) pairs; the text is sent as is, valid JSON or not."""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    error: str = ""
    delay_s: float = 0.0
    """Wait this long before answering (a slow model, or a window to kill the client)."""
    prompt_tokens: int = 100
    completion_tokens: int = 20


class ScriptedModelServer:
    """Serves a script on ``127.0.0.1:<port>`` from a thread of its own; use as a context manager."""

    def __init__(
        self,
        script: Sequence[Reply] | Callable[[dict[str, Any]], Reply],
        *,
        models: Sequence[str] = ("scripted-model",),
        api_key: str | None = "test-key",
        port: int = 0,
    ) -> None:
        self._script = script if callable(script) else iter(script)
        self.models = list(models)
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self.images: list[bytes] = []
        self._port = port
        self._ids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}/v1"

    def __enter__(self) -> ScriptedModelServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("scripted server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._shutdown)
        self._thread.join(10)

    def _shutdown(self) -> None:
        self._loop.create_task(self._stop())

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        current = asyncio.current_task()
        others = [t for t in asyncio.all_tasks() if t is not current]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        self._loop.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self._port)
        )
        self._port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    def _next(self, body: dict[str, Any]) -> Reply:
        if callable(self._script):
            return self._script(body)
        try:
            return next(self._script)
        except StopIteration:
            return Reply(status=500, error="the script has no more replies")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                await self._respond(method, path, headers, body, writer)
                if headers.get("connection", "").lower() == "close":
                    break
        except (
            asyncio.IncompleteReadError,
            ConnectionError,
            asyncio.LimitOverrunError,
            asyncio.CancelledError,
        ):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError, RuntimeError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _respond(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        raw: bytes,
        writer: asyncio.StreamWriter,
    ) -> None:
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            return await _send_json(
                writer, 401, _error("Incorrect API key provided", "invalid_api_key")
            )
        if method == "GET" and path.rstrip("/") == "/v1/models":
            return await _send_json(
                writer,
                200,
                {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]},
            )
        if method != "POST" or path.rstrip("/") != "/v1/chat/completions":  # vLLM's one path
            return await _send_json(writer, 404, _error(f"no route {method} {path}", "not_found"))
        body = json.loads(raw)
        if not body.get("messages"):  # as OpenAI and vLLM: refused before anything is generated
            return await _send_json(
                writer, 400, _error("'messages' must be a non-empty list", "invalid_request_error")
            )
        self.requests.append(body)
        problem = self._check_images(body)
        if problem is not None:
            return await _send_json(writer, 400, _error(problem, "invalid_image"))
        if body.get("model") not in self.models:
            return await _send_json(
                writer,
                404,
                _error(f"The model `{body.get('model')}` does not exist", "model_not_found"),
            )
        reply = self._next(body)
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.status != 200:
            return await _send_json(
                writer,
                reply.status,
                _error(reply.error or "scripted error", "server_error"),
                reply.headers,
            )
        if body.get("stream"):
            return await self._stream(writer, body, reply)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.reasoning is not None:
            message["reasoning_content"] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{next(self._ids)}",
                    "type": "function",
                    "function": {"name": n, "arguments": a},
                }
                for n, a in reply.tool_calls
            ]
        await _send_json(writer, 200, {
            "id": f"chatcmpl-{next(self._ids)}", "object": "chat.completion", "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
            "usage": {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
                      "total_tokens": reply.prompt_tokens + reply.completion_tokens},
        })  # fmt: skip
        return None

    def _check_images(self, body: dict[str, Any]) -> str | None:
        """Every ``image_url`` part must be a PNG data URL holding a valid PNG; None when all are."""
        for message in body.get("messages", []):
            content = message.get("content") if isinstance(message, dict) else None
            for part in content if isinstance(content, list) else []:
                if not isinstance(part, dict) or part.get("type") != "image_url":
                    continue
                url = str((part.get("image_url") or {}).get("url", ""))
                prefix = "data:image/png;base64,"
                if not url.startswith(prefix):
                    return f"image_url must be a PNG data URL, got {url[:40]!r}"
                try:
                    data = base64.b64decode(url[len(prefix) :], validate=True)
                    check_png(data)
                except (ValueError, ToolError) as exc:
                    return f"image_url does not hold a valid PNG: {exc}"
                self.images.append(data)
        return None

    async def _stream(
        self, writer: asyncio.StreamWriter, body: dict[str, Any], reply: Reply
    ) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        base = {"id": f"chatcmpl-{next(self._ids)}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": body["model"]}  # fmt: skip

        async def event(
            delta: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None
        ) -> None:
            chunk = {
                **base,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
                if usage is None
                else [],
            }
            if usage is not None:
                chunk["usage"] = usage
            data = f"data: {json.dumps(chunk)}\n\n".encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()

        await event({"role": "assistant", "content": ""})
        for piece in _pieces(reply.reasoning or ""):
            await event({"reasoning_content": piece})
        for piece in _pieces(reply.content or ""):
            await event({"content": piece})
        for index, (name, arguments) in enumerate(reply.tool_calls):
            await event({"tool_calls": [{"index": index, "id": f"call_{next(self._ids)}", "type": "function",
                                         "function": {"name": name, "arguments": ""}}]})  # fmt: skip
            for piece in _pieces(arguments):
                await event({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        await event({}, "tool_calls" if reply.tool_calls else "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            await event({}, usage={"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
                                   "total_tokens": reply.prompt_tokens + reply.completion_tokens})  # fmt: skip
        done = b"data: [DONE]\n\n"
        writer.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
        await writer.drain()


def _pieces(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _error(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


async def _send_json(
    writer: asyncio.StreamWriter,
    status: int,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> None:
    data = json.dumps(body).encode()
    reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests"}.get(
        status, "Error"
    )
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}\r\n".encode()
        + data
    )
    await writer.drain()

"""Calling an OpenAI-compatible endpoint: the official `openai` client, our retries, one limiter per endpoint.

- Streaming and non-streaming replies are assembled into one assistant message
  dict (``content``, ``reasoning_content``, ``tool_calls``) exactly as produced,
  so reasoning goes back into the history unchanged.
- 429 and 5xx and connection errors (the first call's too: a server still
  starting, or restarting under a resumed run) are retried with exponential backoff
  and jitter, honouring ``Retry-After``; each retry is reported to the caller
  (the loop journals it). 401, 403, 404 and other 4xx are configuration
  problems: one clear `AgentError` naming the knob, no retry.
- `EndpointLimiter`: runs sharing an endpoint share its in-flight limit and
  request rate.
- Token capture (``capture_tokens``): the request asks for the engine's ids and logprobs
  (``logprobs: true`` and vLLM's ``return_token_ids: true``), and the reply's
  ``prompt_token_ids`` (the first chunk when streaming), per-choice ``token_ids`` (a delta
  per chunk when streaming) and ``logprobs.content[].logprob`` become the completion's
  `CallTokens`, exactly as returned: nothing is re-tokenized. An endpoint that returns no
  ids gives ``tokens=None``. `preflight` finds out once whether the endpoint returns them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import openai

from agentinfra.agent._profiles import ModelProfile
from agentinfra.agent._routing import router_for, split_endpoints
from agentinfra.agent._segments import CallTokens
from agentinfra.errors import AgentError

__all__ = [
    "Completion",
    "EndpointLimiter",
    "ModelClient",
    "TokenSupport",
    "Usage",
    "preflight",
    "probe_tokens",
]


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Completion:
    message: dict[str, Any]
    """The assistant message as it goes back into the history."""
    usage: Usage
    finish_reason: str | None
    latency_s: float
    attempts: int
    tokens: CallTokens | None = None
    """The engine's ids and logprobs for this call; None when not asked for or not returned."""


class _Reply(NamedTuple):
    message: dict[str, Any]
    usage: Usage
    finish_reason: str | None
    tokens: CallTokens | None


@dataclass
class EndpointLimiter:
    """Shared by every run on one endpoint: at most ``max_in_flight`` calls, at most ``rpm`` per minute."""

    max_in_flight: int = 32
    rpm: float | None = None
    _semaphore: asyncio.Semaphore | None = field(default=None, init=False)
    _next_start: float = field(default=0.0, init=False)
    _pause_until: float = field(default=0.0, init=False)

    async def __aenter__(self) -> None:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.max_in_flight)
        await self._semaphore.acquire()
        now = time.monotonic()
        start = max(now, self._pause_until)
        if self.rpm:
            start = max(start, self._next_start)
            self._next_start = start + 60.0 / self.rpm
        if start > now:
            await asyncio.sleep(start - now)

    async def __aexit__(self, *exc: object) -> None:
        assert self._semaphore is not None
        self._semaphore.release()

    def back_off(self, seconds: float) -> None:
        """A 429 pauses every run on the endpoint, not just the one that got it."""
        self._pause_until = max(self._pause_until, time.monotonic() + seconds)


RetryHook = Callable[[int, int | None, float, str], Awaitable[None] | None]
"""Called before each retry with (attempt, HTTP status or None, wait_s, reason); awaited
when it returns an awaitable (the loop journals the retry)."""


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The TLS context (the system's CA certificates) that every `ModelClient` of the process shares:
    the HTTP client's own default reads the CA bundle anew each time, ~25 ms of CPU per client
    (1.8 s of a 2-core machine for 32 rollouts, measured)."""
    return ssl.create_default_context()


class ModelClient:
    """One model on one endpoint."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str,
        api_key_env: str,
        profile: ModelProfile,
        limiter: EndpointLimiter | None = None,
        timeout_s: float = 600.0,
        max_retries: int = 6,
        max_output_tokens: int | None = None,
        backoff_s: float = 1.0,
        kv_session: str | None = None,
    ) -> None:
        self.model = model
        self.kv_session = kv_session
        """Sent as vLLM's ``kv_transfer_params`` (``{"agentinfra": {"session": ...}}``): the KV
        store keeps this agent's blocks as one session (agentinfra's vLLM connector)."""
        self.base_url = base_url
        """One URL, or several serving the same model, comma-separated (`EndpointRouter`)."""
        self.api_key_env = api_key_env
        self.profile = profile
        self.limiter = limiter or EndpointLimiter()
        self.max_retries = max_retries
        self.max_output_tokens = max_output_tokens
        self.backoff_s = backoff_s
        self._first_call = True
        endpoints = split_endpoints(base_url)
        self.router = router_for(endpoints) if len(endpoints) > 1 else None
        """The process's router over the endpoints, when there are several."""
        self._session = kv_session or uuid.uuid4().hex
        self._clients = {
            url: openai.AsyncOpenAI(
                base_url=url,
                api_key=api_key or "unset",
                timeout=timeout_s,
                max_retries=0,
                http_client=openai.DefaultAsyncHttpxClient(verify=_tls_context()),
            )
            for url in endpoints
        }
        self.last_endpoint = endpoints[0]
        """The endpoint that answered (or was last tried for) the latest call."""

    async def close(self) -> None:
        if self.router is not None:
            self.router.forget(self._session)
        for client in self._clients.values():
            await client.close()

    async def complete(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        *,
        stream: bool,
        on_retry: RetryHook | None = None,
        capture_tokens: bool = False,
    ) -> Completion:
        """One chat completion, retried on 429/5xx/connection errors.

        With ``capture_tokens`` the request asks for the engine's ids and logprobs, and
        `Completion.tokens` holds them exactly as returned (None when the endpoint sent none).

        Raises:
            AgentError: a configuration problem (key, model, URL), retries exhausted, or an
                error the server sent inside its reply.
        """
        started = time.monotonic()
        attempt = 0
        unreached = True  # every attempt so far failed to connect
        while True:
            attempt += 1
            url = self.last_endpoint = (
                self.router.route(self._session) if self.router else self.last_endpoint
            )
            reached = True
            try:
                async with self.limiter:
                    try:
                        reply = await self._call(messages, tools, stream, capture_tokens, url)
                    except openai.APIConnectionError as exc:
                        reached = isinstance(exc, openai.APITimeoutError)
                        raise
                    finally:
                        if self.router is not None:
                            self.router.finished(url, reached=reached)
                return Completion(
                    reply.message, reply.usage, reply.finish_reason,
                    time.monotonic() - started, attempt, reply.tokens,
                )  # fmt: skip
            except openai.APIStatusError as exc:
                status = exc.status_code
                unreached = False
                if status in (401, 403):
                    raise AgentError(
                        f"{self.base_url} refused the API key ({status}); check the key in ${self.api_key_env} "
                        "(--api-key-env)"
                    ) from None
                if status == 404:
                    raise AgentError(
                        f"{self.base_url} does not know model {self.model!r} or the chat completions path (404: "
                        f"{_error_text(exc)}); check --model and --base-url"
                    ) from None
                if status != 429 and status < 500:
                    raise AgentError(
                        f"{self.base_url} rejected the request ({status}): {_error_text(exc)}"
                    ) from None
                wait = _retry_after(exc) or self._backoff(attempt)
                if status == 429:
                    self.limiter.back_off(wait)
                reason = f"{status}: {_error_text(exc)}"
            except (openai.APIConnectionError, openai.APITimeoutError) as exc:
                status = None
                wait = self._backoff(attempt)
                reason = f"{type(exc).__name__}: {exc}"
                unreached = unreached and not isinstance(exc, openai.APITimeoutError)
                if unreached:
                    reason = f"{exc.__cause__ or exc}"
            if attempt > self.max_retries:
                if unreached and self._first_call:  # never answered: most likely a wrong URL
                    raise AgentError(
                        f"cannot reach {self.base_url} after {attempt} attempts: {reason} (--base-url)"
                    )
                raise AgentError(f"model call failed after {attempt} attempts; last error {reason}")
            if not reached and self.router is not None and self.router.any_other_up(url):
                wait = 0.0  # another engine is up: the run moves there now
            if on_retry is not None:
                pending = on_retry(attempt, status, wait, reason)
                if pending is not None:
                    await pending
            await asyncio.sleep(wait)

    def _backoff(self, attempt: int) -> float:
        return float(min(60.0, self.backoff_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2))

    async def _call(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        stream: bool,
        capture_tokens: bool,
        url: str,
    ) -> _Reply:
        kwargs: dict[str, Any] = {"model": self.model, "messages": [], **self.profile.sampling()}
        # The history and the tools travel in ``extra_body`` (sent as given, and it takes
        # precedence over ``messages=[]``): they are plain JSON already, and the SDK's typed
        # transform of ``messages`` walks the whole history in Python on every call, which was
        # most of agentinfra's own time per call on a long run (benchmarks/agent/bench_call_overhead.py).
        kwargs["extra_body"] = {**(kwargs.get("extra_body") or {}), "messages": list(messages)}
        if tools:
            kwargs["extra_body"]["tools"] = list(tools)
        if self.kv_session:
            extra = dict(kwargs.get("extra_body") or {})
            extra["kv_transfer_params"] = {"agentinfra": {"session": self.kv_session}}
            kwargs["extra_body"] = extra
        if self.max_output_tokens:
            kwargs["max_tokens"] = self.max_output_tokens
        if capture_tokens:
            kwargs["logprobs"] = True
            kwargs["extra_body"] = {**(kwargs.get("extra_body") or {}), "return_token_ids": True}
        if stream:
            kwargs["stream"] = True
            kwargs["stream_options"] = {"include_usage": True}
        # The reply is read as JSON, not as the SDK's models: building a model per SSE chunk
        # (one chunk per token on vLLM) and per logprob entry costs more than the rest of a
        # call's handling. Errors are still the SDK's (raised before the body is read).
        assembly = _Assembly(want_tokens=capture_tokens)
        async with self._clients[url].chat.completions.with_streaming_response.create(
            **kwargs
        ) as response:
            if stream:
                async for line in response.iter_lines():
                    if line.startswith("data:") and line[5:].strip() != "[DONE]":
                        assembly.add_chunk(self._chunk(line[5:]))
            else:
                assembly.add_response(self._chunk(await response.text()))
        if not assembly.has_choice:
            raise AgentError(f"{self.base_url} returned no choices for model {self.model!r}")
        self._first_call = False
        return assembly.reply()

    def _chunk(self, text: str) -> dict[str, Any]:
        """One JSON body or SSE chunk; an error the server sent in it becomes an `AgentError`."""
        try:
            data = json.loads(text)
        except ValueError:
            raise AgentError(
                f"{self.base_url} sent a reply that is not JSON: {text[:200]!r}"
            ) from None
        if not isinstance(data, dict):
            raise AgentError(
                f"{self.base_url} sent {type(data).__name__} where a JSON object belongs"
            )
        if data.get("error"):
            raise AgentError(f"{self.base_url} failed while answering: {str(data['error'])[:500]}")
        return data


class _Assembly:
    """A reply assembled from the JSON of a whole response or of its SSE chunks, exactly as sent. Pure."""

    def __init__(self, *, want_tokens: bool) -> None:
        self.want_tokens = want_tokens
        self.has_choice = False
        self.prompt_ids: list[int] | None = None
        self.completion_ids: list[int] | None = None
        """None until the engine sends ids (a delta per chunk when streaming)."""
        self.logprobs: list[float] | None = None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage = Usage()
        self.finish: str | None = None
        self.message: dict[str, Any] | None = None

    def add_response(self, data: dict[str, Any]) -> None:
        choices = data.get("choices") or []
        self._usage(data.get("usage"))
        if not choices:
            return
        self.has_choice = True
        choice = choices[0]
        raw = {k: v for k, v in (choice.get("message") or {}).items() if v is not None}
        self.message = _clean_message(raw)
        self.finish = choice.get("finish_reason")
        self.prompt_ids = data.get("prompt_token_ids")
        self.completion_ids = choice.get("token_ids")
        self.logprobs = _logprobs(choice.get("logprobs"))

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_ids = chunk["prompt_token_ids"]
        self._usage(chunk.get("usage"))
        for choice in chunk.get("choices") or ():
            self.has_choice = True
            delta = choice.get("delta") or {}
            ids = choice.get("token_ids")
            if ids is not None:
                if self.completion_ids is None:
                    self.completion_ids = []
                self.completion_ids.extend(ids)
            piece = _logprobs(choice.get("logprobs"))
            if piece is not None:
                if self.logprobs is None:
                    self.logprobs = []
                self.logprobs.extend(piece)
            if delta.get("content"):
                self.content.append(delta["content"])
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thought, str):
                self.reasoning.append(thought)
            for call in delta.get("tool_calls") or ():
                self._tool_call(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]

    def _tool_call(self, call: dict[str, Any]) -> None:
        slot = self.calls.setdefault(
            int(call.get("index", 0)),
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if call.get("id"):
            slot["id"] = call["id"]
        function = call.get("function") or {}
        slot["function"]["name"] += function.get("name") or ""
        slot["function"]["arguments"] += function.get("arguments") or ""

    def _usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self.usage = Usage(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0)

    def reply(self) -> _Reply:
        message = self.message
        if message is None:
            message = {"role": "assistant", "content": "".join(self.content) or None}
            if self.reasoning:
                message["reasoning_content"] = "".join(self.reasoning)
            if self.calls:
                message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        tokens = None
        if self.want_tokens:
            tokens = _call_tokens(self.prompt_ids, self.completion_ids, self.logprobs)
        return _Reply(message, self.usage, self.finish, tokens)


def _logprobs(logprobs: Any) -> list[float] | None:
    """The sampled tokens' logprobs of a choice (``logprobs.content[].logprob``); None when absent."""
    if isinstance(logprobs, dict):
        content = logprobs.get("content")
    else:  # an SDK model (`probe_tokens`)
        content = getattr(logprobs, "content", None) if logprobs is not None else None
    if content is None:
        return None
    return [float(e["logprob"] if isinstance(e, dict) else e.logprob) for e in content]


def _call_tokens(
    prompt_ids: Any, completion_ids: Any, logprobs: list[float] | None
) -> CallTokens | None:
    """The call's ids as returned; None unless the engine returned both prompt and completion ids.

    Logprobs that do not pair one to one with the completion ids are dropped (None): a
    misaligned logprob is worse than none to a trainer.
    """
    if not isinstance(prompt_ids, list) or not isinstance(completion_ids, list):
        return None
    if logprobs is not None and len(logprobs) != len(completion_ids):
        logprobs = None
    return CallTokens(prompt_ids, completion_ids, logprobs)


def _clean_message(raw: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": raw.get("content")}
    reasoning = raw.get("reasoning_content", raw.get("reasoning"))
    if isinstance(reasoning, str) and reasoning:
        message["reasoning_content"] = reasoning
    if raw.get("tool_calls"):
        message["tool_calls"] = [
            {"id": c.get("id", ""), "type": "function",
             "function": {"name": c["function"].get("name", ""), "arguments": c["function"].get("arguments", "")}}
            for c in raw["tool_calls"]
        ]  # fmt: skip
    return message


def _retry_after(exc: openai.APIStatusError) -> float | None:
    value = exc.response.headers.get("retry-after") if exc.response is not None else None
    if value is None:
        return None
    try:
        return min(300.0, max(0.0, float(value)))
    except ValueError:
        return None


def _error_text(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and "message" in inner:
            return str(inner["message"])
        return json.dumps(body)[:300]
    return str(exc.message)[:300]


async def preflight(
    *, base_url: str, model: str, api_key: str, api_key_env: str, timeout_s: float = 15.0
) -> None:
    """Checks the endpoint, the key, the model and the chat completions path once, before any run starts.

    Several endpoints (comma-separated) are each checked: a run may go to any of them.

    The path is proved with a request the server must refuse without generating
    (an empty ``messages`` list): any answer but 404 means the path is there. A 404
    that does not name the model means the base URL lacks its prefix (``/v1`` on
    vLLM, SGLang and OpenAI), and the error says so.

    Raises:
        AgentError: unreachable endpoint, refused key, a model the endpoint does not
            serve, or no chat completions at the base URL.
    """
    for url in split_endpoints(base_url):
        await _preflight_one(
            url, model=model, api_key=api_key, api_key_env=api_key_env, timeout_s=timeout_s
        )


async def _preflight_one(
    base_url: str, *, model: str, api_key: str, api_key_env: str, timeout_s: float
) -> None:
    client = openai.AsyncOpenAI(
        base_url=base_url, api_key=api_key or "unset", timeout=timeout_s, max_retries=0
    )
    hint = (
        ""
        if base_url.rstrip("/").endswith("/v1")
        else f"; try --base-url {base_url.rstrip('/')}/v1"
    )
    try:
        try:
            listed = [m.id async for m in client.models.list()]
        except openai.APIConnectionError as exc:
            raise AgentError(
                f"cannot reach {base_url}: {exc.__cause__ or exc} (--base-url)"
            ) from None
        except openai.APIStatusError as exc:
            if exc.status_code in (401, 403):
                raise AgentError(
                    f"{base_url} refused the API key ({exc.status_code}); check the key in ${api_key_env} (--api-key-env)"
                ) from None
            listed = []  # no model list here (404, 405 ...): the probe below decides
        if listed and model not in listed:
            raise AgentError(
                f"{base_url} does not serve model {model!r}; it lists {', '.join(sorted(listed)[:10])} (--model)"
            )
        try:
            await client.chat.completions.create(model=model, messages=[], max_tokens=1)
        except openai.APIConnectionError as exc:
            raise AgentError(
                f"cannot reach {base_url}: {exc.__cause__ or exc} (--base-url)"
            ) from None
        except openai.APIStatusError as exc:
            text = _error_text(exc)
            if exc.status_code in (401, 403):
                raise AgentError(
                    f"{base_url} refused the API key ({exc.status_code}); check the key in ${api_key_env} (--api-key-env)"
                ) from None
            if exc.status_code == 404 and model in text:
                raise AgentError(
                    f"{base_url} does not serve model {model!r}: {text} (--model)"
                ) from None
            if exc.status_code == 404:
                raise AgentError(
                    f"{base_url} has no chat completions endpoint ({base_url.rstrip('/')}/chat/completions "
                    f"answers 404){hint} (--base-url)"
                ) from None
    finally:
        await client.close()


@dataclass(frozen=True, slots=True)
class TokenSupport:
    """Whether an endpoint returns the engine's token ids and logprobs (`probe_tokens`)."""

    is_available: bool
    detail: str
    """One line for the user: what was found, and what follows from it."""


async def probe_tokens(
    *, base_url: str, model: str, api_key: str, force: bool = False, timeout_s: float = 60.0
) -> TokenSupport:
    """Finds out whether the endpoint returns the engine's token ids and logprobs.

    An endpoint whose model list says vLLM (``owned_by: "vllm"``), or any endpoint when
    ``force``, is asked for one token with ``return_token_ids`` and ``logprobs``; vLLM
    (0.10.2 and later) answers with ``prompt_token_ids`` and per-choice ``token_ids``.
    Any other endpoint is not asked (a hosted API rejects the unknown field, and
    SGLang's OpenAI-compatible API returns no ids). No ids, or a refusal, gives
    ``is_available=False``: its trajectories say ``tokens: "unavailable"``, never
    re-tokenized. Reachability, key and model are `preflight`'s job; an error here is
    reported as unavailable tokens, not raised.
    """
    endpoints = split_endpoints(base_url)
    found = [
        await _probe_tokens_one(url, model=model, api_key=api_key, force=force, timeout_s=timeout_s)
        for url in endpoints
    ]
    missing = [support for support in found if not support.is_available]
    if missing:  # a run may go to any endpoint: ids from all, or from none
        return missing[0]
    return found[0]


async def _probe_tokens_one(
    base_url: str, *, model: str, api_key: str, force: bool, timeout_s: float
) -> TokenSupport:
    client = openai.AsyncOpenAI(
        base_url=base_url, api_key=api_key or "unset", timeout=timeout_s, max_retries=0
    )
    try:
        if not force:
            try:
                owners = {getattr(m, "owned_by", None) async for m in client.models.list()}
            except openai.APIError:
                owners = set()
            if "vllm" not in owners:
                return TokenSupport(
                    False,
                    f"{base_url} is not vLLM (its model list says owned_by {sorted(map(str, owners))}); token ids "
                    'not requested, trajectories will say tokens: "unavailable" (--tokens asks anyway)',
                )
        response = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Say OK."}], max_tokens=1,
            logprobs=True, extra_body={"return_token_ids": True},
        )  # fmt: skip
    except openai.APIStatusError as exc:
        return TokenSupport(
            False,
            f"{base_url} refused a request for token ids ({exc.status_code}: {_error_text(exc)}); "
            'trajectories will say tokens: "unavailable"',
        )
    except openai.APIError as exc:
        return TokenSupport(False, f"{base_url} did not answer the token probe: {exc}")
    finally:
        await client.close()
    choice = response.choices[0] if response.choices else None
    tokens = _call_tokens(
        getattr(response, "prompt_token_ids", None),
        getattr(choice, "token_ids", None),
        _logprobs(choice.logprobs) if choice is not None else None,
    )
    if tokens is None:
        return TokenSupport(
            False,
            f"{base_url} returns no token ids (vLLM's return_token_ids); "
            'trajectories will say tokens: "unavailable" (nothing is re-tokenized)',
        )
    logprobs = "and logprobs" if tokens.completion_logprobs is not None else "but no logprobs"
    return TokenSupport(True, f"{base_url} returns the engine's token ids {logprobs}")

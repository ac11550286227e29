"""The agent loop: model call, tool calls, repeat, within budgets, journalled for resume.

One turn is one model call and the tool calls it asked for. Every model reply
and every tool call (start and result) is journalled in the transcript before
the loop moves on, so a crashed run resumes from its last completed turn:
the model is never called again for a turn it already answered, and a tool call
whose result is journalled is never run again. A call that started but has no
result is run again on resume; every shipped tool is idempotent (files are
overwritten whole, submissions are content-addressed), and a tool that is not
must say so in its description.

Images: a tool may return content parts (`TextPart`, `ImagePart`). Each image
is stored once under ``images/<sha256>.png`` beside the transcript and journalled
as a reference; the images of one turn's tool calls reach the model in one user
message after that turn's tool results (as ``image_url`` parts with PNG data
URLs), because OpenAI-compatible servers accept images in user messages, not in
tool messages. An image counts ``image_tokens`` towards the context estimate.

Context management: before each call the history's size is estimated. Over
``trim_at`` of the context length, images older than the recent turns are
dropped first, then old tool outputs are shortened; if that is not enough, the
oldest whole turns are dropped. The system prompt and the task are always kept.
Every drop and shortening is journalled, so resume rebuilds the same history.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentinfra._atomic import write_atomic
from agentinfra._journal import Journal
from agentinfra.agent._content import (
    ImagePart,
    TextPart,
    check_png,
    image_data_url,
    image_ref,
    is_image_ref,
)
from agentinfra.agent._model import Completion, ModelClient, Usage
from agentinfra.agent._profiles import profile_for
from agentinfra.agent._toolcalls import (
    ToolCall,
    looks_like_tool_call,
    parse_hermes_calls,
    parse_minimax_reply,
)
from agentinfra.agent._tools import Tool, tool_schemas
from agentinfra.errors import AgentError, ConfigError, ToolError

__all__ = ["AgentLoop", "AgentOutcome", "LoopConfig", "Transcript"]

logger = logging.getLogger(__name__)
_CHARS_PER_TOKEN = 3.5
_UNKNOWN_IMAGE_TOKENS = 1_500


class Transcript(Journal):
    """The agent's journal (``agent/transcript.jsonl`` in a run directory).

    Images of tool results live beside it in ``images/<sha256>.png``, stored once.
    """

    error_class = AgentError

    @property
    def images_dir(self) -> Path:
        return self.path.parent / "images"

    def store_image(self, png: bytes) -> str:
        """Stores a PNG once (atomic write, fsync'd); returns its SHA-256."""
        sha = hashlib.sha256(png).hexdigest()
        target = self.images_dir / f"{sha}.png"
        if target.is_file():
            return sha
        self.images_dir.mkdir(parents=True, exist_ok=True)
        try:
            write_atomic(target, png)
        except OSError as exc:
            raise AgentError(
                f"cannot store image {target}: {exc.strerror}; free disk space and resume"
            ) from None
        return sha

    def load_image(self, sha: str) -> bytes:
        """The stored PNG ``sha``.

        Raises:
            AgentError: missing, or its bytes no longer match the hash.
        """
        path = self.images_dir / f"{sha}.png"
        try:
            data = path.read_bytes()
        except OSError:
            raise AgentError(f"image {path} referenced by the transcript is missing") from None
        if hashlib.sha256(data).hexdigest() != sha:
            raise AgentError(
                f"image {path} no longer matches its hash; the run directory was modified"
            )
        return data


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopConfig:
    """One agent's model, endpoint and budgets. Stored in the transcript's first event."""

    model: str
    base_url: str
    api_key_env: str = "OPENAI_API_KEY"
    stream: bool = True
    max_turns: int | None = 200
    max_tokens: int | None = None
    """Prompt plus completion tokens over the whole run."""
    max_cost_usd: float | None = None
    wall_hours: float = 12.0
    context_tokens: int = 196_608
    max_output_tokens: int | None = None
    max_tool_result_chars: int = 20_000
    keep_recent_turns: int = 4
    trim_at: float = 0.8
    price_in_per_mtok: float | None = None
    price_out_per_mtok: float | None = None
    request_timeout_s: float = 600.0
    max_retries: int = 6
    image_tokens: int | None = None
    """What one image counts towards the context estimate. None: the model family's estimate
    from the image's size (`ModelProfile.image_tokens`); 1,500 for an image of unknown size."""
    kv_session: bool = False
    """Send the run's id as a KV session hint with every request (vLLM's ``kv_transfer_params``,
    read by agentinfra's connector: the agent's blocks kept together, released when it is done)."""
    nudges: int = 0
    """How many times in all a reply with no tool call is answered with a reminder to use the
    tools instead of ending the run as ``done`` (``--nudges``). Tool-call text the loop could not
    read is always answered with an error."""
    keep_images: int | None = None
    """Keep only the last K images in the history; older ones become a one-line placeholder
    before any text is dropped (journalled like every trim). None: images go only when over budget."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("model must not be empty (--model)")
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"base_url {self.base_url!r} must start with http:// or https:// (--base-url)"
            )
        for name in (
            "max_turns",
            "max_tokens",
            "context_tokens",
            "max_tool_result_chars",
            "keep_images",
            "image_tokens",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name}={value} must be >= 1 (--{name.replace('_', '-')})")
        if self.nudges < 0:
            raise ConfigError(f"nudges={self.nudges} must be >= 0 (--nudges)")
        if self.wall_hours <= 0:
            raise ConfigError(f"wall_hours={self.wall_hours} must be > 0 (--hours)")
        if self.max_cost_usd is not None and (
            self.price_in_per_mtok is None or self.price_out_per_mtok is None
        ):
            raise ConfigError(
                f"a cost budget needs prices for model {self.model!r}: --price-in and --price-out "
                "(USD per million tokens) or an entry in --prices"
            )

    def cost(self, usage: Usage) -> float | None:
        if self.price_in_per_mtok is None or self.price_out_per_mtok is None:
            return None
        return (
            usage.prompt_tokens * self.price_in_per_mtok
            + usage.completion_tokens * self.price_out_per_mtok
        ) / 1e6

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoopConfig:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class AgentOutcome:
    stop_reason: str
    """``done`` (the model answered without a tool call), ``max_turns``, ``max_tokens``,
    ``max_cost``, ``wall_time``, or ``stopped``; ``done`` also when a tool that ends the run
    (``Tool.ends_run``) succeeded."""
    turns: int
    usage: Usage
    cost_usd: float | None


class AgentLoop:
    """Drives one agent on one task; `run` starts or resumes it from its transcript."""

    def __init__(
        self,
        *,
        config: LoopConfig,
        client: ModelClient,
        tools: Sequence[Tool],
        system_prompt: str,
        task_prompt: str,
        transcript: Transcript,
        notifications: Callable[[], list[str]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ConfigError(f"tool names must be unique: {names}")
        self.config = config
        self._profile = profile_for(config.model)
        self.client = client
        self.tools = {t.name: t for t in tools}
        self.schemas = tool_schemas(tools)
        self.transcript = transcript
        self.notifications = notifications
        self._clock = clock
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": task_prompt},
        ]
        self.turn = 0
        self.usage = Usage()
        self.started_wall_s = clock()
        self.last_prompt_tokens = 0
        self.status = "starting"
        self._pending_images: list[tuple[str, dict[str, Any]]] = []
        self._data_urls: dict[str, str] = {}

    # -- resume ----------------------------------------------------------------------

    def _replay(self) -> list[dict[str, Any]]:
        """Rebuilds history, usage and turn from the transcript; returns calls still to run."""
        pending: dict[str, dict[str, Any]] = {}
        for event in self.transcript.events:
            data = event.data
            if event.type == "loop_started":
                self.started_wall_s = event.wall_s
                self.messages = [dict(m) for m in data["messages"]]
            elif event.type == "model_response":
                self._flush_images()
                self.turn = int(data["turn"])
                usage = data.get("usage", {})
                self.usage = Usage(
                    self.usage.prompt_tokens + usage.get("prompt_tokens", 0),
                    self.usage.completion_tokens + usage.get("completion_tokens", 0),
                )
                self.last_prompt_tokens = usage.get("prompt_tokens", 0)
                self.messages.append(self._history_message(data["message"]))
                pending = {c["call_id"]: c for c in data.get("calls", [])}
            elif event.type == "tool_result":
                pending.pop(data["call_id"], None)
                self._append_result(data["call_id"], data["content"])
            elif event.type == "feedback":
                self.messages.append({"role": "user", "content": data["text"]})
            elif event.type == "context_trimmed":
                self._flush_images()
                self._apply_trim(data)
        if not pending:
            self._flush_images()
        return list(pending.values())

    # -- the loop ----------------------------------------------------------------------

    async def run(self) -> AgentOutcome:
        if self.transcript.events:
            pending = self._replay()
            stopped = [e for e in self.transcript.events if e.type == "stopped"]
            if stopped and stopped[-1].data["reason"] == "done":
                return self._outcome(stopped[-1].data["reason"])
            if not pending and self._ended_by_tool():
                return self._stop("done")  # the crash came between that result and its stop
            self.transcript.append(
                "loop_resumed", {"turn": self.turn, "pending_calls": len(pending)}
            )
            if pending:
                await self._run_calls(pending)
        else:
            self.transcript.append(
                "loop_started",
                {"config": self.config.to_json(), "messages": self.messages, "tools": self.schemas},
            )
        try:
            return await self._turns()
        except AgentError as exc:
            self.status = f"failed: {exc}"
            self.transcript.append("failed", {"turn": self.turn, "error": str(exc)[:2000]})
            raise

    async def _turns(self) -> AgentOutcome:
        while True:
            reason = self._budget_exhausted()
            if reason is not None:
                return self._stop(reason)
            self._manage_context()
            self.turn += 1
            self.status = f"turn {self.turn}: waiting for the model"
            completion = await self.client.complete(
                self._wire(), self.schemas, stream=self.config.stream, on_retry=self._journal_retry
            )
            calls = self._record_reply(completion)
            if not calls:
                feedback = self._feedback_for(completion.message.get("content") or "")
                if feedback is None:
                    return self._stop("done")
                self.transcript.append("feedback", {"turn": self.turn, **feedback})
                self.messages.append({"role": "user", "content": feedback["text"]})
                continue
            await self._run_calls(calls)
            if self._ended_by_tool():
                return self._stop("done")

    def _feedback_for(self, content: str) -> dict[str, str] | None:
        """What the loop tells a model whose reply called no tool; None: the run is done.

        Text that looks like a tool call but could not be read is always answered (the
        model meant to act); plain prose is answered ``LoopConfig.nudges`` times in all.
        """
        names = ", ".join(self.tools)
        if looks_like_tool_call(content):
            return {
                "kind": "unreadable_tool_call",
                "text": "error: your reply contains tool-call text that could not be read as a call "
                f"(no complete call of a known tool in it). Call one of the tools ({names}) with "
                "valid arguments.",
            }
        used = sum(
            1
            for e in self.transcript.events
            if e.type == "feedback" and e.data.get("kind") == "no_tool_call"
        )
        if used >= self.config.nudges:
            return None
        return {
            "kind": "no_tool_call",
            "text": f"Your reply called no tool, so nothing was done. Continue the task by calling one of "
            f"the tools ({names}); reply without a tool call only when you have finished "
            f"({self.config.nudges - used - 1} more such reminder(s)).",
        }

    def _ended_by_tool(self) -> bool:
        """Whether the last journalled tool result is a successful call of a tool that ends the run."""
        for event in reversed(self.transcript.events):
            if event.type == "tool_result":
                tool = self.tools.get(str(event.data.get("name")))
                return tool is not None and tool.ends_run and not event.data.get("is_error")
            if event.type == "model_response":
                return False
        return False

    def _record_reply(self, completion: Completion) -> list[dict[str, Any]]:
        message = dict(completion.message)
        calls = [
            {"call_id": c.get("id") or f"t{self.turn}_call_{i}", "name": c["function"]["name"],
             "arguments": c["function"]["arguments"], "error": None}
            for i, c in enumerate(message.get("tool_calls", []))
        ]  # fmt: skip
        content = message.get("content") or ""
        text_calls: tuple[ToolCall, ...] = ()
        if not calls and self.client.profile.xml_tool_calls and "<minimax:tool_call>" in content:
            parameters = {name: t.parameters for name, t in self.tools.items()}
            text_calls = parse_minimax_reply(
                content, parameters, id_prefix=f"t{self.turn}_call"
            ).tool_calls
        elif not calls and "<tool_call>" in content:  # Hermes JSON the server did not parse
            text_calls = parse_hermes_calls(content, id_prefix=f"t{self.turn}_call")
        if text_calls:
            calls = [
                {"call_id": c.call_id, "name": c.name, "arguments": c.arguments, "error": c.error}
                for c in text_calls
            ]
            message["tool_calls"] = [
                {
                    "id": c["call_id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls
            ]
        for i, call in enumerate(calls):  # ids must be unique across the run for resume
            if any(call["call_id"] == other["call_id"] for other in calls[:i]):
                call["call_id"] = f"{call['call_id']}_{i}"
        if calls and "tool_calls" in message:
            message["tool_calls"] = [
                {**tc, "id": c["call_id"]}
                for tc, c in zip(message["tool_calls"], calls, strict=True)
            ]
        self.usage = Usage(
            self.usage.prompt_tokens + completion.usage.prompt_tokens,
            self.usage.completion_tokens + completion.usage.completion_tokens,
        )
        self.last_prompt_tokens = completion.usage.prompt_tokens
        self.transcript.append(
            "model_response",
            {
                "turn": self.turn, "message": message, "calls": calls,
                "usage": {"prompt_tokens": completion.usage.prompt_tokens,
                          "completion_tokens": completion.usage.completion_tokens},
                "finish_reason": completion.finish_reason, "latency_s": round(completion.latency_s, 3),
                "attempts": completion.attempts,
            },
        )  # fmt: skip
        self.messages.append(self._history_message(message))
        return calls

    def _history_message(self, message: dict[str, Any]) -> dict[str, Any]:
        """What goes back to the model: as produced; reasoning kept where the profile says so."""
        if self.client.profile.keeps_reasoning:
            return dict(message)
        return {k: v for k, v in message.items() if k != "reasoning_content"}

    async def _run_calls(self, calls: Sequence[dict[str, Any]]) -> None:
        for call in calls:
            self.status = f"turn {self.turn}: {call['name']}"
            self.transcript.append("tool_started", {"turn": self.turn, **call})
            content, is_error = await self._execute(call)
            notes = self.notifications() if self.notifications is not None else []
            if notes and isinstance(content, str):
                content += "\n\n" + "\n".join(notes)
            elif notes and isinstance(content, list):
                content.append({"type": "text", "text": "\n".join(notes)})
            self.transcript.append(
                "tool_result",
                {"turn": self.turn, "call_id": call["call_id"], "name": call["name"], "content": content,
                 "is_error": is_error},
            )  # fmt: skip
            self._append_result(call["call_id"], content)
        self._flush_images()

    def _append_result(self, call_id: str, content: str | list[dict[str, Any]]) -> None:
        self.messages.append(_tool_message(call_id, content))
        if isinstance(content, list):
            self._pending_images += [(call_id, p) for p in content if is_image_ref(p)]

    def _flush_images(self) -> None:
        """The images of the last turn's tool results, as one user message after them."""
        if not self._pending_images:
            return
        calls = ", ".join(dict.fromkeys(call_id for call_id, _ in self._pending_images))
        parts: list[dict[str, Any]] = [
            {"type": "text", "text": f"[images returned by tool call(s) {calls}]"}
        ]
        parts += [dict(ref) for _, ref in self._pending_images]
        self.messages.append({"role": "user", "content": parts})
        self._pending_images = []

    def _wire(self) -> list[dict[str, Any]]:
        """The history as sent: image references become ``image_url`` parts with PNG data URLs.

        Each image is read from disk once; the cache keeps only images still in the history.
        """
        urls: dict[str, str] = {}
        wired: list[dict[str, Any]] = []
        for message in self.messages:
            content = message.get("content")
            if isinstance(content, list) and any(is_image_ref(p) for p in content):
                parts = []
                for part in content:
                    if is_image_ref(part):
                        sha = part["sha256"]
                        if sha not in urls:
                            urls[sha] = self._data_urls.get(sha) or image_data_url(
                                self.transcript.load_image(sha)
                            )
                        part = {"type": "image_url", "image_url": {"url": urls[sha]}}
                    parts.append(part)
                message = {**message, "content": parts}
            wired.append(message)
        self._data_urls = urls
        return wired

    def _journal_content(self, result: Any) -> str | list[dict[str, Any]]:
        """A handler's result as journalled: text (fitted to the limit) or parts with image references."""
        if isinstance(result, str):
            return self._fit(result)
        if not isinstance(result, (list, tuple)) or not all(
            isinstance(p, (TextPart, ImagePart)) for p in result
        ):
            raise ToolError(
                f"a tool returned {type(result).__name__}; a tool returns a string or a list of TextPart and ImagePart"
            )
        parts: list[dict[str, Any]] = []
        for part in result:
            if isinstance(part, TextPart):
                parts.append({"type": "text", "text": self._fit(part.text)})
            else:
                width, height = check_png(part.png)
                parts.append(image_ref(self.transcript.store_image(part.png), width, height))
        return parts

    async def _execute(self, call: dict[str, Any]) -> tuple[str | list[dict[str, Any]], bool]:
        name = call["name"]
        if call.get("error"):
            return f"error: {call['error']}", True
        tool = self.tools.get(name)
        if tool is None:
            return f"error: there is no tool {name!r}; available: {', '.join(self.tools)}", True
        try:
            arguments = json.loads(call["arguments"] or "{}")
        except json.JSONDecodeError as exc:
            return (
                f"error: the arguments of {name} are not valid JSON ({exc}); send a JSON object",
                True,
            )
        if not isinstance(arguments, dict):
            return (
                f"error: the arguments of {name} must be a JSON object, got {type(arguments).__name__}",
                True,
            )
        try:
            return self._journal_content(await tool.handler(arguments)), False
        except ToolError as exc:
            return f"error: {exc}", True
        except Exception as exc:  # a bug in a tool must not end a 12-hour run
            logger.exception("tool %s failed", name)
            return (
                f"error: the tool {name} failed inside agentinfra ({type(exc).__name__}: {exc})",
                True,
            )

    def _fit(self, text: str) -> str:
        limit = self.config.max_tool_result_chars
        if len(text) <= limit:
            return text
        half = limit // 2
        return (
            text[:half]
            + f"\n[... {len(text) - 2 * half} characters omitted: the result was {len(text)} "
            f"characters, over the {limit}-character limit ...]\n" + text[-half:]
        )

    # -- budgets -------------------------------------------------------------------------

    def _budget_exhausted(self) -> str | None:
        c = self.config
        if c.max_turns is not None and self.turn >= c.max_turns:
            return "max_turns"
        if c.max_tokens is not None and self.usage.total >= c.max_tokens:
            return "max_tokens"
        cost = c.cost(self.usage)
        if c.max_cost_usd is not None and cost is not None and cost >= c.max_cost_usd:
            return "max_cost"
        if self._clock() - self.started_wall_s >= c.wall_hours * 3600:
            return "wall_time"
        return None

    def _stop(self, reason: str) -> AgentOutcome:
        outcome = self._outcome(reason)
        self.status = f"stopped: {reason}"
        self.transcript.append(
            "stopped",
            {"reason": reason, "turns": self.turn, "prompt_tokens": self.usage.prompt_tokens,
             "completion_tokens": self.usage.completion_tokens, "cost_usd": outcome.cost_usd},
        )  # fmt: skip
        return outcome

    def _outcome(self, reason: str) -> AgentOutcome:
        return AgentOutcome(reason, self.turn, self.usage, self.config.cost(self.usage))

    def _journal_retry(self, attempt: int, status: int | None, wait_s: float, reason: str) -> None:
        self.status = f"turn {self.turn}: retry {attempt} in {wait_s:.1f}s ({status})"
        self.transcript.append(
            "retry", {"turn": self.turn, "attempt": attempt, "status": status, "wait_s": round(wait_s, 3),
                      "reason": reason[:500]},
        )  # fmt: skip

    # -- context ---------------------------------------------------------------------------

    def estimate_tokens(self) -> int:
        chars = sum(len(json.dumps(m)) for m in self.messages) + len(json.dumps(self.schemas))
        images = sum(
            self._image_tokens(p)
            for m in self.messages if isinstance(m.get("content"), list) for p in m["content"] if is_image_ref(p)
        )  # fmt: skip
        return int(chars / _CHARS_PER_TOKEN) + images

    def _image_tokens(self, ref: dict[str, Any]) -> int:
        if self.config.image_tokens is not None:
            return self.config.image_tokens
        width, height = ref.get("width"), ref.get("height")
        if isinstance(width, int) and isinstance(height, int):
            return self._profile.image_tokens(width, height)
        return _UNKNOWN_IMAGE_TOKENS

    def _manage_context(self) -> None:
        budget = self.config.trim_at * self.config.context_tokens
        changes: list[dict[str, Any]] = self._keep_last_images()
        if self.estimate_tokens() <= budget:
            if changes:
                self._journal_trim(changes)
            return
        recent_from = self._recent_start()
        for index in range(2, recent_from):  # old images go first
            content = self.messages[index].get("content")
            if isinstance(content, list) and any(is_image_ref(p) for p in content):
                dropped_images = [p["sha256"] for p in content if is_image_ref(p)]
                kept = [
                    {"type": "text", "text": f"[image {p['sha256'][:12]} dropped by context management]"}
                    if is_image_ref(p) else p
                    for p in content
                ]  # fmt: skip
                changes.append(
                    {"op": "drop_images", "index": index, "content": kept, "images": dropped_images}
                )
                self.messages[index]["content"] = kept
        for index in range(2, recent_from):
            message = self.messages[index]
            content = message.get("content")
            if message["role"] == "tool" and isinstance(content, str) and len(content) > 400:
                short = (
                    content[:200]
                    + f"\n[... shortened by context management: {len(content)} characters ...]\n"
                    + content[-200:]
                )
                changes.append(
                    {
                        "op": "shorten",
                        "index": index,
                        "content": short,
                        "chars_before": len(content),
                    }
                )
                message["content"] = short
        dropped = 0
        while self.estimate_tokens() > budget and len(self.messages) > 2:
            end = self._first_turn_end()
            if end is None or end >= self._recent_start():
                break
            dropped += end - 2
            del self.messages[2:end]
        if dropped:
            changes.append({"op": "drop", "count": dropped})
        if changes:
            self._journal_trim(changes)

    def _journal_trim(self, changes: list[dict[str, Any]]) -> None:
        self.transcript.append(
            "context_trimmed",
            {"turn": self.turn, "changes": changes, "estimated_tokens": self.estimate_tokens(),
             "context_tokens": self.config.context_tokens},
        )  # fmt: skip

    def _keep_last_images(self) -> list[dict[str, Any]]:
        """Replaces every image but the last ``keep_images`` with a placeholder; returns the changes."""
        keep = self.config.keep_images
        if keep is None:
            return []
        changes: list[dict[str, Any]] = []
        seen = 0
        for index in range(len(self.messages) - 1, 1, -1):
            content = self.messages[index].get("content")
            if not isinstance(content, list) or not any(is_image_ref(p) for p in content):
                continue
            kept: list[dict[str, Any]] = []
            dropped: list[str] = []
            for part in reversed(content):
                if is_image_ref(part):
                    seen += 1
                    if seen > keep:
                        dropped.append(part["sha256"])
                        part = {
                            "type": "text",
                            "text": f"[older screenshot {part['sha256'][:12]} removed: only the last {keep} are kept]",
                        }
                kept.append(part)
            if dropped:
                kept.reverse()
                self.messages[index]["content"] = kept
                changes.append(
                    {"op": "drop_images", "index": index, "content": kept, "images": dropped}
                )
        return changes

    def _apply_trim(self, data: dict[str, Any]) -> None:
        for change in data["changes"]:
            if change["op"] in ("shorten", "drop_images") and change["index"] < len(self.messages):
                self.messages[change["index"]]["content"] = change["content"]
            elif change["op"] == "drop":
                del self.messages[2 : 2 + change["count"]]

    def _assistant_indices(self) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m["role"] == "assistant"]

    def _recent_start(self) -> int:
        assistants = self._assistant_indices()
        keep = self.config.keep_recent_turns
        return assistants[-keep] if len(assistants) >= keep else 2

    def _first_turn_end(self) -> int | None:
        """Index just past the oldest turn (its assistant message and tool results)."""
        assistants = self._assistant_indices()
        if len(assistants) < 2:
            return None
        return assistants[1]


def _tool_message(call_id: str, content: str | list[dict[str, Any]]) -> dict[str, Any]:
    """A tool result as the model sees it: text only (its images follow in a user message)."""
    if isinstance(content, list):
        content = "\n".join(
            f"[image {p['sha256'][:12]}: attached in the next message]" if is_image_ref(p) else str(p.get("text", ""))
            for p in content
        )  # fmt: skip
    return {"role": "tool", "tool_call_id": call_id, "content": content}

"""The agent loop: model call, tool calls, repeat, within budgets, journalled for resume.

One turn is one model call and the tool calls it asked for. Every model reply
is journalled in the transcript before the loop acts on it, and every tool call
(start and result) is journalled in order (see below for the two writes that overlap
the work that follows them), so a crashed run resumes from its last completed turn:
the model is never called again for a turn it already answered, and a tool call
whose result is journalled is never run again. A call that started but has no
result is run again on resume; every shipped tool is idempotent (files are
overwritten whole, submissions are content-addressed), and a tool that is not
must say so in its description.

The loop orchestrates; each job it delegates has its own module:

- `_transcript`: the journal, its events, the images beside it, and the history
  (`History`) that the loop and a resume (`replay`) build from the same records.
- `_replies`: a model reply as the calls to run (structured, MiniMax XML or Hermes
  JSON in the text), and the answer to a reply that called no tool.
- `_context`: the pure trimming of the history to the context budget; the loop
  journals each trim's changes as ``context_trimmed`` and a resume applies them again.

Images: a tool may return content parts (`TextPart`, `ImagePart`). Each image
is stored once under ``images/<sha256>.png`` beside the transcript and journalled
as a reference; the images of one turn's tool calls reach the model in one user
message after that turn's tool results. An image counts ``image_tokens`` towards
the context estimate.

Context management: before each call the history's size is estimated. Over
``trim_at`` of the context length, images older than the recent turns are
dropped first, then old tool outputs are shortened; if that is not enough, the
oldest whole turns are dropped. The system prompt and the task are always kept.

Every journal write goes through `Journal.append_async`: the write and its fsync run
in a bounded thread pool, so one agent's fsync does not stall the event loop that
all agents of a process share. The loop waits for each write to be durable before it
moves on, with two exceptions, each write being a thread handoff and an fsync (~7 ms with
8 agents on 2 busy cores): a ``tool_started`` is written while its tool runs, and the
turn's last ``tool_result`` while the next model request is on its way. The next awaited
event waits for them (every event lands in order, and a failed write still ends the run).
A resume runs again every call of the last reply that has no journalled result, whether
or not its start was journalled, so a crash loses nothing a resume needs; no model reply
is ever acted on before it is durable. A ``tool_result`` carries ``tool_s``, the tool's
own time, measured around its handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from agentinfra.agent._content import ImagePart, TextPart, check_png, image_ref
from agentinfra.agent._context import ContextBudget, estimate_tokens, trim_context
from agentinfra.agent._model import Completion, ModelClient, Usage
from agentinfra.agent._profiles import profile_for
from agentinfra.agent._replies import feedback_for, normalize_reply
from agentinfra.agent._routing import split_endpoints
from agentinfra.agent._segments import call_tokens_of, encode_tokens
from agentinfra.agent._toolcalls import ToolCall
from agentinfra.agent._tools import Tool, tool_schemas
from agentinfra.agent._transcript import (
    History,
    JournalledContent,
    Transcript,
    last_result_of_turn,
    nudges_used,
    replay,
    wire_messages,
)
from agentinfra.errors import (
    AgentError,
    ConfigError,
    SandboxError,
    TaskEnvironmentError,
    ToolError,
)

__all__ = ["AgentLoop", "AgentOutcome", "LoopConfig"]

logger = logging.getLogger(__name__)
_UNKNOWN_IMAGE_TOKENS = 1_500


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopConfig:
    """One agent's model, endpoint and budgets. Stored in the transcript's first event."""

    model: str
    base_url: str
    """The endpoint, or several serving the same model, comma-separated: each run sticks to one
    (session affinity; `EndpointRouter`), and moves on when it is down or overloaded."""
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
    policy_version: str | None = None
    """The weights' version the endpoint serves (``--policy-version``), recorded with every model
    call (a trainer drops or corrects stale calls); `ModelClient.policy_version` may change it mid-run."""
    capture_tokens: bool = False
    """Ask the endpoint for the engine's token ids and logprobs with every call (``logprobs`` and
    vLLM's ``return_token_ids``). `agentinfra run` sets it from `probe_tokens`; off by default, so
    a run made before it existed resumes as it was (a hosted API refuses the unknown field)."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("model must not be empty (--model)")
        split_endpoints(self.base_url)  # one URL, or several comma-separated: checked
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


class _ToolOutcome(NamedTuple):
    content: JournalledContent
    is_error: bool
    internal_error: dict[str, str] | None = None
    """A tool that failed inside agentinfra, not by the model's mistake (`internal_error_of`)."""


def internal_error_of(exc: BaseException) -> dict[str, str]:
    """A tool's failure inside agentinfra, as journalled on its result (``internal_error``).

    ``kind`` is ``environment_died`` for the episode's sandbox, desktop or controller failing
    under it (`SandboxError`, `TaskEnvironmentError` and their subclasses), else ``internal``
    (agentinfra's own bug or a harness failure such as a `HarnessError`). A trainer reads it as
    the rollout's infra failure: the episode went on, but its reward is not the policy's.
    """
    kind = (
        "environment_died" if isinstance(exc, (SandboxError, TaskEnvironmentError)) else "internal"
    )
    return {"kind": kind, "type": type(exc).__name__, "message": str(exc)[:2000]}


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
        self.history = History(
            [
                {"role": "system", "content": system_prompt},
                {"role": "user", "content": task_prompt},
            ],
            keeps_reasoning=client.profile.keeps_reasoning,
        )
        self.turn = 0
        self.usage = Usage()
        self.started_wall_s = clock()
        self.last_prompt_tokens = 0
        self.status = "starting"
        self.policy_version = config.policy_version
        """Recorded with each model call; a caller that swaps the endpoint's weights mid-run sets it."""
        self._last_ids: list[int] | None = None
        """The last call's ``prompt_ids + completion_ids``: the next call's prompt is journalled against it."""
        self._data_urls: dict[str, str] = {}
        self._deferred: list[asyncio.Task[Any]] = []
        """Events being written while the loop goes on (`_append_later`), oldest first."""
        self._parameters = {name: t.parameters for name, t in self.tools.items()}
        self._budget = ContextBudget(
            limit_tokens=config.trim_at * config.context_tokens,
            keep_recent_turns=config.keep_recent_turns,
            keep_images=config.keep_images,
            fixed_chars=len(json.dumps(self.schemas)),
            image_tokens=self._image_tokens,
        )

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The history as the model sees it, image references unresolved."""
        return self.history.messages

    # -- start and resume -------------------------------------------------------------

    async def run(self) -> AgentOutcome:
        try:
            return await self._run()
        finally:  # a deferred write lands (or fails) before the caller may close the transcript
            if self._deferred:
                with contextlib.suppress(BaseException):
                    await asyncio.wait(self._deferred)
                for task in self._deferred:  # a failure the run did not get to raise is logged
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        logger.error("a journal write failed: %s", task.exception())

    async def _run(self) -> AgentOutcome:
        if self.transcript.events:
            outcome = await self._resume()
            if outcome is not None:
                return outcome
        else:
            await self._append(
                "loop_started",
                {"config": self.config.to_json(), "messages": self.messages, "tools": self.schemas},
            )
        try:
            return await self._turns()
        except AgentError as exc:
            self.status = f"failed: {exc}"
            await self._append("failed", {"turn": self.turn, "error": str(exc)[:2000]})
            raise

    async def _resume(self) -> AgentOutcome | None:
        """Rebuilds the run from its transcript and runs its unfinished calls; an outcome if it had ended."""
        pending = self._replay()
        stopped = [e for e in self.transcript.events if e.type == "stopped"]
        if stopped and stopped[-1].data["reason"] == "done":
            return self._outcome(stopped[-1].data["reason"])
        if not pending and self._ended_by_tool():
            return await self._stop("done")  # the crash came between that result and its stop
        await self._append("loop_resumed", {"turn": self.turn, "pending_calls": len(pending)})
        if pending:
            await self._run_calls(pending)
        return None

    def _replay(self) -> list[ToolCall]:
        """Rebuilds history, usage and turn from the transcript; returns calls still to run."""
        state = replay(self.transcript.events, self.history, started_wall_s=self.started_wall_s)
        self.started_wall_s = state.started_wall_s
        self.turn = state.turn
        self.usage = state.usage
        self.last_prompt_tokens = state.last_prompt_tokens
        calls, _ = call_tokens_of(self.transcript.events)
        last = calls[-1] if calls else None
        self._last_ids = last.all_ids if last is not None else None
        return state.pending

    # -- the turns ------------------------------------------------------------------------

    async def _turns(self) -> AgentOutcome:
        while True:
            reason = self._budget_exhausted()
            if reason is not None:
                return await self._stop(reason)
            await self._trim_context()
            self.turn += 1
            self.status = f"turn {self.turn}: waiting for the model"
            completion = await self.client.complete(
                self._wire(), self.schemas, stream=self.config.stream, on_retry=self._journal_retry,
                capture_tokens=self.config.capture_tokens,
            )  # fmt: skip
            calls = await self._record_reply(completion)
            if not calls:
                if not await self._answer_no_call(completion.message.get("content") or ""):
                    return await self._stop("done")
                continue
            if await self._run_calls(calls):
                return await self._stop("done")

    async def _record_reply(self, completion: Completion) -> tuple[ToolCall, ...]:
        """Journals the reply (its calls read and named) and adds it to the history; returns its calls."""
        reply = normalize_reply(
            completion.message, turn=self.turn, tool_parameters=self._parameters,
            xml_tool_calls=self.client.profile.xml_tool_calls,
        )  # fmt: skip
        self.usage = Usage(
            self.usage.prompt_tokens + completion.usage.prompt_tokens,
            self.usage.completion_tokens + completion.usage.completion_tokens,
        )
        self.last_prompt_tokens = completion.usage.prompt_tokens
        tokens = None
        if completion.tokens is not None:
            tokens = encode_tokens(completion.tokens, self._last_ids)
            self._last_ids = completion.tokens.all_ids
        else:
            self._last_ids = None
        await self._append(
            "model_response",
            {
                "turn": self.turn, "message": reply.message, "calls": [asdict(c) for c in reply.calls],
                "usage": {"prompt_tokens": completion.usage.prompt_tokens,
                          "completion_tokens": completion.usage.completion_tokens},
                "finish_reason": completion.finish_reason, "latency_s": round(completion.latency_s, 3),
                "attempts": completion.attempts, "tokens": tokens, "policy_version": self.policy_version,
            },
        )  # fmt: skip
        self.history.add_reply(reply.message)
        return reply.calls

    async def _answer_no_call(self, content: str) -> bool:
        """Answers a reply that called no tool (journalled as ``feedback``); False: the run is done."""
        feedback = feedback_for(
            content, tool_names=list(self.tools), nudges=self.config.nudges,
            nudges_used=nudges_used(self.transcript.events),
        )  # fmt: skip
        if feedback is None:
            return False
        await self._append(
            "feedback", {"turn": self.turn, "kind": feedback.kind, "text": feedback.text}
        )
        self.history.add_user(feedback.text)
        return True

    def _ended_by_tool(self) -> bool:
        """Whether the last journalled tool result is a successful call of a tool that ends the run."""
        result = last_result_of_turn(self.transcript.events)
        if result is None:
            return False
        tool = self.tools.get(str(result.get("name")))
        return tool is not None and tool.ends_run and not result.get("is_error")

    def _wire(self) -> list[dict[str, Any]]:
        """The history as sent; each image is read from disk once while it stays in the history."""
        wired = wire_messages(self.messages, self.transcript.load_image, self._data_urls)
        self._data_urls = wired.data_urls
        return wired.messages

    # -- tool calls -------------------------------------------------------------------------

    async def _run_calls(self, calls: Sequence[ToolCall]) -> bool:
        """Runs ``calls`` in order; True when the last one was a successful call of a tool that
        ends the run. The last result is written while the loop goes on (`_append_later`)."""
        ended = False
        for index, call in enumerate(calls):
            self.status = f"turn {self.turn}: {call.name}"
            self._append_later("tool_started", {"turn": self.turn, **asdict(call)})
            started = time.monotonic()
            outcome = await self._execute(call)
            elapsed = time.monotonic() - started
            content = self._with_notifications(outcome.content)
            result = {"turn": self.turn, "call_id": call.call_id, "name": call.name,
                      "content": content, "is_error": outcome.is_error, "tool_s": round(elapsed, 4)}  # fmt: skip
            if outcome.internal_error is not None:
                result["internal_error"] = outcome.internal_error
            tool = self.tools.get(call.name)
            ended = tool is not None and tool.ends_run and not outcome.is_error
            if index == len(calls) - 1 and not ended:
                self._append_later("tool_result", result)
            else:
                await self._append("tool_result", result)
            self.history.add_tool_result(call.call_id, content)
        self.history.flush_images()
        return ended

    async def _append(self, type_: str, data: dict[str, Any]) -> None:
        """Journals one event once the deferred one (if any) is durable; returns once this one is."""
        await self._settle()
        await self.transcript.append_async(type_, data)

    def _append_later(self, type_: str, data: dict[str, Any]) -> None:
        """Starts journalling one event (in order); the next `_append` waits for it and raises its failure."""
        self._deferred.append(asyncio.ensure_future(self.transcript.append_async(type_, data)))

    async def _settle(self) -> None:
        """Waits for the deferred writes; a cancel of the loop leaves them going (`run` waits for them)."""
        while self._deferred:
            task = self._deferred[0]
            try:
                await asyncio.shield(task)
            except BaseException:
                if (
                    task.done()
                ):  # its own failure, raised here once; a cancel of ours leaves it going
                    self._deferred.pop(0)
                raise
            self._deferred.pop(0)

    def _with_notifications(self, content: JournalledContent) -> JournalledContent:
        """``content`` with what happened meanwhile (grading results) appended."""
        notes = self.notifications() if self.notifications is not None else []
        if notes and isinstance(content, str):
            content += "\n\n" + "\n".join(notes)
        elif notes and isinstance(content, list):
            content.append({"type": "text", "text": "\n".join(notes)})
        return content

    async def _execute(self, call: ToolCall) -> _ToolOutcome:
        name = call.name
        if call.error:
            return _ToolOutcome(f"error: {call.error}", True)
        tool = self.tools.get(name)
        if tool is None:
            return _ToolOutcome(
                f"error: there is no tool {name!r}; available: {', '.join(self.tools)}", True
            )
        try:
            arguments = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as exc:
            return _ToolOutcome(
                f"error: the arguments of {name} are not valid JSON ({exc}); send a JSON object",
                True,
            )
        if not isinstance(arguments, dict):
            return _ToolOutcome(
                f"error: the arguments of {name} must be a JSON object, got {type(arguments).__name__}",
                True,
            )
        try:
            return _ToolOutcome(await self._journal_content(await tool.handler(arguments)), False)
        except ToolError as exc:
            return _ToolOutcome(f"error: {exc}", True)
        except Exception as exc:  # a bug in a tool must not end a 12-hour run
            logger.exception("tool %s failed", name)
            return _ToolOutcome(
                f"error: the tool {name} failed inside agentinfra ({type(exc).__name__}: {exc})",
                True,
                internal_error_of(exc),
            )

    async def _journal_content(self, result: Any) -> JournalledContent:
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
                sha = await self.transcript.store_image_async(part.png)
                parts.append(image_ref(sha, width, height))
        return parts

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

    # -- budgets ------------------------------------------------------------------------------

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

    async def _stop(self, reason: str) -> AgentOutcome:
        outcome = self._outcome(reason)
        self.status = f"stopped: {reason}"
        await self._append(
            "stopped",
            {"reason": reason, "turns": self.turn, "prompt_tokens": self.usage.prompt_tokens,
             "completion_tokens": self.usage.completion_tokens, "cost_usd": outcome.cost_usd},
        )  # fmt: skip
        return outcome

    def _outcome(self, reason: str) -> AgentOutcome:
        return AgentOutcome(reason, self.turn, self.usage, self.config.cost(self.usage))

    async def _journal_retry(
        self, attempt: int, status: int | None, wait_s: float, reason: str
    ) -> None:
        self.status = f"turn {self.turn}: retry {attempt} in {wait_s:.1f}s ({status})"
        await self._append(
            "retry", {"turn": self.turn, "attempt": attempt, "status": status, "wait_s": round(wait_s, 3),
                      "reason": reason[:500]},
        )  # fmt: skip

    # -- context ------------------------------------------------------------------------------

    def estimate_tokens(self) -> int:
        return estimate_tokens(self.messages, self._budget)

    def _image_tokens(self, ref: Any) -> int:
        if self.config.image_tokens is not None:
            return self.config.image_tokens
        width, height = ref.get("width"), ref.get("height")
        if isinstance(width, int) and isinstance(height, int):
            return self._profile.image_tokens(width, height)
        return _UNKNOWN_IMAGE_TOKENS

    async def _trim_context(self) -> None:
        """Trims the history to the budget (`trim_context`) and journals the changes, if any."""
        trim = trim_context(self.messages, self._budget)
        if not trim.changes:
            return
        self.history.messages = trim.messages
        await self._append(
            "context_trimmed",
            {"turn": self.turn, "changes": [c.to_json() for c in trim.changes],
             "estimated_tokens": trim.estimated_tokens, "context_tokens": self.config.context_tokens},
        )  # fmt: skip

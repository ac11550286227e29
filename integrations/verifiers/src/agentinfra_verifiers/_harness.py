"""`OneReplyHarness`: one chat completion, in process, through verifiers' interception endpoint.

verifiers' own tool-less loop (the `null` harness) is a PEP 723 program that `uv` provisions
from PyPI on every new runtime; a task that wants one reply needs none of that. The harness
contract allows an in-process loop as long as every model call goes through ``endpoint``
with ``secret``, so the trace (tokens, logprobs when the client is a train client) is
verifiers' own record of the call.
"""

from __future__ import annotations

from typing import Any

import verifiers.v1 as vf
from openai import AsyncOpenAI

__all__ = ["OneReplyHarness", "OneReplyHarnessConfig"]


class OneReplyHarnessConfig(vf.HarnessConfig):
    """No knobs: sampling comes from the run (`--sampling.*`), applied by the interception server."""


class OneReplyHarness(vf.Harness[OneReplyHarnessConfig]):
    """The task's system prompt and prompt, one reply, no tools; the reward reads the reply."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace[Any],
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> vf.ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages.extend(m.model_dump(mode="json", exclude_none=True) for m in prompt)
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            await client.chat.completions.create(model=ctx.model, messages=messages)  # type: ignore[arg-type]
        finally:
            await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")

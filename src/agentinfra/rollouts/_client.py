"""Clients of the rollout service: `AsyncRolloutClient` (aiohttp) and `RolloutClient`, its sync wrapper.

Every refusal is a `RolloutError` with the service's one-line message, its HTTP
``status`` and, for a 429, ``retry_after_s``; `AsyncRolloutClient.submit_group` can
wait out 429s itself (``retry_for_s``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import aiohttp

from agentinfra.errors import RolloutError
from agentinfra.rollouts._spec import GroupRequest

__all__ = ["AsyncRolloutClient", "RolloutClient"]


class AsyncRolloutClient:
    """One HTTP session to a rollout service at ``url`` (``http://127.0.0.1:7490``)."""

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._headers = headers
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncRolloutClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        try:
            async with self._http().request(
                method, self.url + path, json=body, params=params or None
            ) as answer:
                text = await answer.text()
                if answer.status >= 400:
                    raise _refusal(answer.status, text, answer.headers.get("Retry-After"))
                return json.loads(text) if answer.content_type == "application/json" else text
        except aiohttp.ClientError as exc:
            raise RolloutError(f"cannot reach the rollout service at {self.url}: {exc}") from None

    async def submit_group(
        self, request: GroupRequest | dict[str, Any], *, retry_for_s: float = 0.0
    ) -> dict[str, Any]:
        """Submits a group; returns ``{group_id, rollout_ids}``. A 429 is retried after its
        ``Retry-After`` while ``retry_for_s`` lasts, then raised."""
        body = request.model_dump(mode="json") if isinstance(request, GroupRequest) else request
        deadline = time.monotonic() + retry_for_s
        while True:
            try:
                answer: dict[str, Any] = await self._call("POST", "/v1/groups", body)
                return answer
            except RolloutError as exc:
                wait_s = exc.retry_after_s
                if exc.status != 429 or wait_s is None or time.monotonic() + wait_s > deadline:
                    raise
                await asyncio.sleep(wait_s)

    async def group(self, group_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call("GET", f"/v1/groups/{group_id}")
        return answer

    async def rollout(self, rollout_id: str, *, wait_s: float = 0.0) -> dict[str, Any]:
        """``{rollout_id, state, trajectory}``; waits up to ``wait_s`` for it to finish."""
        answer: dict[str, Any] = await self._call(
            "GET", f"/v1/rollouts/{rollout_id}", wait_s=wait_s
        )
        return answer

    async def trajectories(self, group_id: str) -> AsyncIterator[dict[str, Any]]:
        """The group's trajectories, each as soon as it finishes, until all G have."""
        try:
            async with self._http().get(
                f"{self.url}/v1/groups/{group_id}/trajectories",
                timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
            ) as answer:
                if answer.status >= 400:
                    raise _refusal(answer.status, await answer.text(), None)
                async for line in answer.content:
                    if line.strip():
                        yield json.loads(line)
        except aiohttp.ClientError as exc:
            raise RolloutError(f"the stream from {self.url} broke: {exc}") from None

    async def cancel(self, rollout_id: str, reason: str = "stale policy") -> dict[str, Any]:
        """Cancels a rollout; returns its (partial) trajectory, labelled ``cancelled`` unless it had finished."""
        answer: dict[str, Any] = await self._call(
            "POST", f"/v1/rollouts/{rollout_id}/cancel", {"reason": reason}
        )
        return answer

    async def grade(
        self, environment: str, task: str, submission: bytes, *, name: str = "submission"
    ) -> dict[str, Any]:
        """The trusted verdict of ``submission`` (idempotent: a repeat is not graded again)."""
        body = {"environment": environment, "task": task, "name": name,
                "submission_b64": base64.b64encode(submission).decode()}  # fmt: skip
        answer: dict[str, Any] = await self._call("POST", "/v1/grade", body)
        return answer

    async def metrics(self) -> str:
        return str(await self._call("GET", "/metrics"))


def _refusal(status: int, text: str, retry_after: str | None) -> RolloutError:
    try:
        message = str(json.loads(text).get("error", text))
    except (ValueError, AttributeError):
        message = text[:500]
    retry = (
        float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() else None
    )
    return RolloutError(f"{status}: {message}", status=status, retry_after_s=retry)


class RolloutClient:
    """`AsyncRolloutClient` for synchronous code: each call runs on a private event loop."""

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 600.0) -> None:
        self._args = (url,)
        self._kwargs: dict[str, Any] = {"token": token, "timeout_s": timeout_s}

    def _run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        async def call() -> Any:
            async with AsyncRolloutClient(*self._args, **self._kwargs) as client:
                return await getattr(client, method)(*args, **kwargs)

        return asyncio.run(call())

    def submit_group(
        self, request: GroupRequest | dict[str, Any], *, retry_for_s: float = 0.0
    ) -> dict[str, Any]:
        result: dict[str, Any] = self._run("submit_group", request, retry_for_s=retry_for_s)
        return result

    def group(self, group_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._run("group", group_id)
        return result

    def rollout(self, rollout_id: str, *, wait_s: float = 0.0) -> dict[str, Any]:
        result: dict[str, Any] = self._run("rollout", rollout_id, wait_s=wait_s)
        return result

    def trajectories(self, group_id: str) -> list[dict[str, Any]]:
        """All G trajectories of the group, in the order they finished (blocks until then)."""

        async def collect() -> list[dict[str, Any]]:
            async with AsyncRolloutClient(*self._args, **self._kwargs) as client:
                return [t async for t in client.trajectories(group_id)]

        return asyncio.run(collect())

    def cancel(self, rollout_id: str, reason: str = "stale policy") -> dict[str, Any]:
        result: dict[str, Any] = self._run("cancel", rollout_id, reason)
        return result

    def grade(
        self, environment: str, task: str, submission: bytes, *, name: str = "submission"
    ) -> dict[str, Any]:
        result: dict[str, Any] = self._run("grade", environment, task, submission, name=name)
        return result

    def metrics(self) -> str:
        return str(self._run("metrics"))

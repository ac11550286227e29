"""`AgentinfraService`: agentinfra's rollout service as a verifiers taskset needs it (HTTP, httpx).

``POST /v1/grade`` grades one submission in agentinfra's jails and is idempotent on the
submission's hash, so a retried or resumed rollout is not graded twice. The service reads
the task file at the path it is given: the taskset and the service share a filesystem
(or the same paths). The token is read from the environment variable the task config
names, never stored in a config verifiers writes to disk.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
from typing import Any

import httpx
import verifiers.v1 as vf

__all__ = [
    "DEFAULT_SERVICE_URL",
    "DEFAULT_TOKEN_VAR",
    "AgentinfraService",
    "ServiceError",
    "ServiceTaskConfig",
]

DEFAULT_SERVICE_URL = "http://127.0.0.1:7490"
DEFAULT_TOKEN_VAR = "AGENTINFRA_ROLLOUTS_TOKEN"


class ServiceError(RuntimeError):
    """The rollout service cannot be used, or it reported an infra failure: one line, with the knob."""


class ServiceTaskConfig(vf.TaskConfig):
    """Where each task's reward is graded (`--env.taskset.task.*`)."""

    service_url: str = DEFAULT_SERVICE_URL
    """The rollout service (`agentinfra rollouts serve`)."""
    token_var: str = DEFAULT_TOKEN_VAR
    """Environment variable holding its bearer token; unset or empty: no token sent."""
    grade_timeout_s: float = 900.0
    """How long one grading (or, for a whole-rollout task, one rollout) may take, waits for a
    free slot (429s) included."""


class AgentinfraService:
    """One rollout service: its grade endpoint, and whole rollouts (a group of one)."""

    def __init__(
        self, url: str, *, token: str | None = None, timeout_s: float = 900.0,
        token_var: str = DEFAULT_TOKEN_VAR,
    ) -> None:  # fmt: skip
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.token_var = token_var
        """Where the token came from, for the error messages."""
        self._has_token = bool(token)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    @classmethod
    def of(cls, config: ServiceTaskConfig) -> AgentinfraService:
        token = os.environ.get(config.token_var) or None
        return cls(config.service_url, token=token, timeout_s=config.grade_timeout_s,
                   token_var=config.token_var)  # fmt: skip

    def check(self) -> None:
        """Raises `ServiceError` unless the service answers and takes our token (``GET /metrics``)."""
        try:
            answer = httpx.get(f"{self.url}/metrics", headers=self._headers, timeout=10.0)
        except httpx.HTTPError as exc:
            raise ServiceError(
                f"cannot reach the agentinfra rollout service at {self.url} ({exc}); start "
                "`agentinfra rollouts serve` or set --env.taskset.task.service-url"
            ) from None
        if answer.status_code == 401:
            sent = "the token in" if self._has_token else "no token: nothing in"
            raise ServiceError(
                f"the rollout service at {self.url} refused the token (401; sent {sent} "
                f"${self.token_var}): put a token of its --token-file in that variable or name "
                "another with --env.taskset.task.token-var"
            )
        if answer.status_code >= 400:
            raise ServiceError(
                f"the rollout service at {self.url} answered {answer.status_code}: {answer.text[:300]}"
            )

    async def grade(
        self, environment: str, task: str, submission: bytes, *, name: str
    ) -> dict[str, Any]:
        """The verdict agentinfra's grader gave ``submission`` (waits out 429s until ``timeout_s``).

        Raises:
            ServiceError: the service is unreachable, refused the request, or took too long.
        """
        body = {"environment": environment, "task": task, "name": name,
                "submission_b64": base64.b64encode(submission).decode()}  # fmt: skip
        deadline = time.monotonic() + self.timeout_s
        async with httpx.AsyncClient(headers=self._headers, timeout=self.timeout_s) as http:
            while True:
                try:
                    answer = await http.post(f"{self.url}/v1/grade", json=body)
                except httpx.HTTPError as exc:
                    raise ServiceError(
                        f"cannot reach the rollout service at {self.url}: {exc!r}"
                    ) from None
                if answer.status_code != 429:
                    break
                wait_s = float(answer.headers.get("Retry-After", "5"))
                if time.monotonic() + wait_s > deadline:
                    raise ServiceError(f"the rollout service at {self.url} stayed busy for {self.timeout_s} s "
                                       "(--env.taskset.task.grade-timeout-s)")  # fmt: skip
                await asyncio.sleep(wait_s)
        if answer.status_code >= 400:
            raise ServiceError(f"the rollout service at {self.url} refused the grading "
                               f"({answer.status_code}): {_error_of(answer)}")  # fmt: skip
        verdict: dict[str, Any] = answer.json()
        return verdict

    async def rollout(self, group: dict[str, Any], *, poll_s: float = 30.0) -> dict[str, Any]:
        """The trajectory of a group of one rollout (``group``: a ``GroupRequest`` as JSON),
        run by the service with agentinfra's agent loop; waits up to ``timeout_s``.

        Raises:
            ServiceError: the service is unreachable, refused the group, or the rollout took too long.
        """
        deadline = time.monotonic() + self.timeout_s
        async with httpx.AsyncClient(headers=self._headers, timeout=poll_s + 30.0) as http:
            accepted = await self._call(
                http, "POST", "/v1/groups", json={**group, "group_size": 1}, until=deadline
            )
            (rid,) = accepted["rollout_ids"]
            try:
                while time.monotonic() < deadline:
                    path = f"/v1/rollouts/{rid}"
                    answer = await self._call(http, "GET", path, params={"wait_s": poll_s})
                    if answer.get("state") == "finished" and answer.get("trajectory") is not None:
                        trajectory: dict[str, Any] = answer["trajectory"]
                        return trajectory
            except asyncio.CancelledError:  # verifiers gave up on the rollout: so does the service
                await asyncio.shield(self._cancel(rid, "verifiers cancelled the rollout"))
                raise
            await self._cancel(rid, "verifiers timeout")
        raise ServiceError(
            f"rollout {rid} at {self.url} took more than {self.timeout_s} s "
            "(--env.taskset.task.grade-timeout-s)"
        )

    async def _cancel(self, rid: str, reason: str) -> None:
        async with httpx.AsyncClient(headers=self._headers, timeout=60.0) as http:
            await self._call(http, "POST", f"/v1/rollouts/{rid}/cancel", json={"reason": reason})

    async def _call(
        self, http: httpx.AsyncClient, method: str, path: str, *, until: float = 0.0, **kwargs: Any
    ) -> Any:
        """One request; a 429 is retried after its ``Retry-After`` while that ends before ``until``."""
        while True:
            try:
                answer = await http.request(method, self.url + path, **kwargs)
            except httpx.HTTPError as exc:
                raise ServiceError(
                    f"cannot reach the rollout service at {self.url}: {exc!r}"
                ) from None
            wait_s = float(answer.headers.get("Retry-After", "5"))
            if answer.status_code != 429 or time.monotonic() + wait_s > until:
                break
            await asyncio.sleep(wait_s)
        if answer.status_code >= 400:
            raise ServiceError(f"the rollout service at {self.url} refused {method} {path} "
                               f"({answer.status_code}): {_error_of(answer)}")  # fmt: skip
        return answer.json()


def _error_of(answer: httpx.Response) -> str:
    try:
        return str(answer.json().get("error", answer.text))[:500]
    except ValueError:
        return answer.text[:500]

"""What a trainer asks for: a group of G rollouts of one task (`GroupRequest`), and the group it becomes.

`GroupRequest` crosses the wire (``POST /v1/groups``) and goes into the service's
journal, so it is a pydantic model with a ``schema_version``. `Group` is a request
made concrete: its ``group_id``, its rollouts' ids, and the hidden grading seed the
G rollouts share (drawn from the OS, never shown to an agent, kept only in the
service's journal so that a restart grades with the same seed).

The G rollouts of a group share the task and the seed, and nothing else: each is
its own run directory, workspace and desktop.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentinfra.agent import LoopConfig

__all__ = ["MAX_GROUP_SIZE", "ROLLOUT_SCHEMA_VERSION", "Group", "GroupRequest", "new_group"]

ROLLOUT_SCHEMA_VERSION = 1
MAX_GROUP_SIZE = 256
"""The largest G one request may ask for (a bigger group is several requests)."""


class GroupRequest(BaseModel):
    """G rollouts of one task against the trainer's endpoint (the budgets are `agentinfra run`'s)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = ROLLOUT_SCHEMA_VERSION
    environment: str
    task: str
    """A task file on the service's machine."""
    group_size: int = Field(ge=1, le=MAX_GROUP_SIZE)
    model: str = Field(min_length=1)
    base_url: str = Field(min_length=1)
    api_key_env: str = "OPENAI_API_KEY"
    """The variable, in the service's environment, holding the endpoint's key (keys never travel)."""
    policy_version: str | None = None
    stream: bool = True
    max_turns: int | None = Field(default=200, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    hours: float = Field(default=12.0, gt=0)
    context_tokens: int = Field(default=196_608, ge=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    nudges: int = Field(default=0, ge=0)
    request_timeout_s: float = Field(default=600.0, gt=0)
    max_retries: int = Field(default=6, ge=0)
    """Retries of a failed model call before the rollout ends as a ``model_error``."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The environment's agent options (``--env-option``), checked by its agent-options model."""
    kv_session: bool = False
    """Each rollout is a KV session at agentinfra's vLLM connector (session hints)."""
    tokens: bool | None = None
    """Ask the engine for token ids and logprobs: None when the endpoint is found to return
    them (`agentinfra.agent.probe_tokens`), True always, False never (``tokens: "unavailable"``)."""

    def loop_config(self, *, capture_tokens: bool = False) -> LoopConfig:
        """The agent loop's config of every rollout of the group (``capture_tokens``: the probe's answer).

        Raises:
            ConfigError: a value the loop refuses (the message names it).
        """
        return LoopConfig(
            model=self.model, base_url=self.base_url.rstrip("/"), api_key_env=self.api_key_env,
            stream=self.stream, max_turns=self.max_turns, max_tokens=self.max_tokens,
            wall_hours=self.hours, context_tokens=self.context_tokens,
            max_output_tokens=self.max_output_tokens, nudges=self.nudges,
            request_timeout_s=self.request_timeout_s, max_retries=self.max_retries, kv_session=self.kv_session, policy_version=self.policy_version,
            capture_tokens=capture_tokens,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Group:
    """A request made concrete: ids and the shared hidden seed."""

    group_id: str
    request: GroupRequest
    seed: int
    """The hidden grading seed all G rollouts are graded with (never shown to an agent)."""
    rollout_ids: tuple[str, ...]
    capture_tokens: bool = False
    """Whether the rollouts ask the engine for token ids (decided once for the group)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "request": self.request.model_dump(mode="json"),
            "seed": self.seed,
            "rollout_ids": list(self.rollout_ids),
            "capture_tokens": self.capture_tokens,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Group:
        return cls(
            group_id=str(data["group_id"]),
            request=GroupRequest.model_validate(data["request"]),
            seed=int(data["seed"]),
            rollout_ids=tuple(str(r) for r in data["rollout_ids"]),
            capture_tokens=bool(data.get("capture_tokens", False)),
        )


def new_group(
    request: GroupRequest, *, group_id: str | None = None, capture_tokens: bool = False
) -> Group:
    """A fresh group for ``request``: a random id (unless given) and a seed from the OS."""
    gid = group_id or f"g{secrets.token_hex(6)}"
    return Group(
        group_id=gid,
        request=request,
        seed=secrets.randbelow(2**63),
        rollout_ids=tuple(f"{gid}-{index}" for index in range(request.group_size)),
        capture_tokens=capture_tokens,
    )

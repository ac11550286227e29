"""`ServiceRolloutHarness`: one verifiers rollout is one whole agentinfra rollout, run by the service.

The task's data says where the service is and what the group asks for (`RolloutTaskData`);
the run's model and endpoint come from verifiers (``ctx``). The trajectory's summary goes
into ``trace.info["agentinfra_rollout"]`` for the task's reward to read.
"""

from __future__ import annotations

import os
from typing import Any

import verifiers.v1 as vf
from pydantic import Field

from agentinfra_verifiers._service import AgentinfraService, ServiceError

__all__ = [
    "RolloutTaskData",
    "ServiceRolloutHarness",
    "ServiceRolloutHarnessConfig",
    "rollout_reward",
]


class RolloutTaskData(vf.TaskData):
    environment: str
    """agentinfra's environment name (``desktop``)."""
    task_path: str
    """The task file, a path the service can read."""
    service_url: str
    token_var: str
    timeout_s: float
    max_turns: int
    options: dict[str, Any] = Field(default_factory=dict)
    """The environment's agent options (``agentinfra run --env-option``)."""


class ServiceRolloutHarnessConfig(vf.HarnessConfig):
    """No knobs: the group's settings are the task's (`--env.taskset.task.*`)."""


class ServiceRolloutHarness(vf.Harness[ServiceRolloutHarnessConfig]):
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
        fields = data.model_dump()
        service = AgentinfraService(
            fields["service_url"], token=_token(fields["token_var"]), timeout_s=fields["timeout_s"],
            token_var=fields["token_var"],
        )  # fmt: skip
        group = {
            "environment": fields["environment"], "task": fields["task_path"], "model": ctx.model,
            "base_url": ctx.client.base_url, "api_key_env": ctx.client.api_key_var,
            "max_turns": fields["max_turns"], "options": fields.get("options") or {},
        }  # fmt: skip
        trajectory = await service.rollout(group)
        trace.info["agentinfra_rollout"] = {
            k: trajectory.get(k)
            for k in (
                "run_id",
                "group_id",
                "reward",
                "hack_flagged",
                "infra_failure",
                "turn_rewards",
            )
        }
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


def rollout_reward(trace: vf.Trace[Any]) -> float:
    """The trajectory's reward; raises `ServiceError` for a labelled infra failure (never a 0)."""
    summary = trace.info.get("agentinfra_rollout")
    if summary is None:
        raise ServiceError(
            "no agentinfra rollout ran for this trace (the harness is ServiceRolloutHarness)"
        )
    failure = summary.get("infra_failure")
    if failure:
        raise ServiceError(
            f"agentinfra's rollout {summary.get('run_id')} failed outside the episode "
            f"({failure.get('kind')}: {failure.get('message')}); an infra failure, not a reward of 0"
        )
    return float(summary.get("reward") or 0.0)


def _token(var: str) -> str | None:
    return os.environ.get(var) or None

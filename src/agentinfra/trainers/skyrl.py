"""A SkyRL generator (``GeneratorInterface``) that runs each prompt's trajectories as agentinfra rollouts.

SkyRL calls ``await generator.generate(input_batch)`` with a ``GeneratorInput`` and trains
on the ``GeneratorOutput`` it returns (``skyrl/train/generators/base.py``); `AgentinfraGenerator`
is that generator. Both types are TypedDicts, so nothing here imports SkyRL: the
trajectory ids in the output are the ``TrajectoryID`` objects SkyRL passed in.

Input: row ``i`` is one trajectory of environment ``env_classes[i]`` (an agentinfra
environment name: ``kernels``, ``desktop``) on the task file ``env_extras[i]["task"]``.
Rows that share ``trajectory_ids[i].instance_id`` become the G rollouts of one agentinfra
group (one hidden grading seed); the policy version is ``step-<global_step>`` from
``batch_metadata``; the per-call token limit is ``sampling_params["max_tokens"]`` (SkyRL's
``max_generate_length``). Other sampling parameters are the endpoint's and the agent
profile's (decision 0023).

Output (docs/trajectory.md, "Mappings to trainers' types"): the engine's ids, loss masks
and logprobs, cut where each segment's first engine-sampled token begins; ``rewards`` are
per trajectory (a float per row: agentinfra's trusted reward). With
``step_wise=True`` (SkyRL's ``generator.step_wise_trajectories``) each segment is a row,
``is_last_step`` marks a trajectory's last, and only that row carries the reward, as
SkyRL's step-wise docs require; without it a trajectory is one row, its last segment
(earlier segments of a multi-segment trajectory are dropped and counted in
``rollout_metrics``; use step-wise training to keep them).

Infra failures follow SkyRL's Harbor generator (``examples/train_integrations/harbor/
harbor_generator.py``): when any rollout of a prompt cannot be trained on (an infra failure,
or no engine ids), every row of that prompt becomes a placeholder (ids ``[0]``, loss mask
``[0]``, reward 0.0, stop reason ``error``): the prompt's group is all zeros, so it yields
no advantage and no gradient, and a reward nobody earned never enters a group's mean.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentinfra.errors import ConfigError
from agentinfra.trainers._convert import (
    SegmentSplit,
    gather_or_cancel,
    run_group,
    trainable_segments,
    untrainable_reason,
)

__all__ = ["AgentinfraGenerator", "SkyRLSettings"]

logger = logging.getLogger(__name__)

_PLACEHOLDER_STOP = "error"


@dataclass(frozen=True, slots=True, kw_only=True)
class SkyRLSettings:
    """What `AgentinfraGenerator` needs: the service, the endpoint the agents call, and the shape."""

    url: str
    """The rollout service (``agentinfra rollouts serve``), e.g. ``http://127.0.0.1:7490``."""
    base_url: str
    """The OpenAI-compatible endpoint the agents call (SkyRL's HTTP inference endpoint,
    ``get_endpoint_url()``); it must return token ids (vLLM's ``return_token_ids``)."""
    model: str
    """The model name at ``base_url`` (SkyRL's ``served_model_name``)."""
    token: str | None = None
    """The service's bearer token."""
    step_wise: bool = False
    """One row per segment (SkyRL ``generator.step_wise_trajectories=true``); else one per trajectory."""
    timeout_s: float | None = None
    """How long one batch waits for a rollout (None: as long as it takes)."""
    submit_retry_s: float = 600.0
    """How long a submission waits out the service's 429s."""
    request: dict[str, Any] = field(default_factory=dict)
    """More `GroupRequest` fields for every group (``max_turns``, ``context_tokens``, ``options``...)."""

    def __post_init__(self) -> None:
        for name in ("url", "base_url", "model"):
            if not getattr(self, name):
                raise ConfigError(f"SkyRLSettings.{name} is empty")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ConfigError(f"SkyRLSettings.timeout_s={self.timeout_s} must be > 0 or None")
        owned = {"environment", "task", "group_size", "model", "base_url", "policy_version"}
        if clash := sorted(owned & set(self.request)):
            raise ConfigError(
                f"SkyRLSettings.request sets {clash}, which the generator sets itself; remove them"
            )


def _default_client(settings: SkyRLSettings) -> Any:
    from agentinfra.rollouts import AsyncRolloutClient

    return AsyncRolloutClient(settings.url, token=settings.token)


@dataclass(slots=True)
class _Prompt:
    """The rows of one prompt (one agentinfra group), in input order."""

    environment: str
    task: str
    rows: list[int]


@dataclass(slots=True)
class _Rows:
    """``GeneratorOutput``'s per-row lists as they are built."""

    prompt_token_ids: list[list[int]] = field(default_factory=list)
    response_ids: list[list[int]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    loss_masks: list[list[int]] = field(default_factory=list)
    stop_reasons: list[str] = field(default_factory=list)
    rollout_logprobs: list[list[float]] = field(default_factory=list)
    trajectory_ids: list[Any] = field(default_factory=list)
    is_last_step: list[bool] = field(default_factory=list)
    generation_times: list[float] = field(default_factory=list)
    llm_times: list[float] = field(default_factory=list)
    env_times: list[float] = field(default_factory=list)
    env_metrics: list[dict[str, Any]] = field(default_factory=list)


class AgentinfraGenerator:
    """SkyRL's ``GeneratorInterface``: ``await generate(input_batch)`` returns a ``GeneratorOutput``."""

    def __init__(
        self,
        settings: SkyRLSettings,
        *,
        client_factory: Callable[[SkyRLSettings], Any] = _default_client,
    ) -> None:
        self.settings = settings
        self._client_factory = client_factory

    async def generate(self, input_batch: dict[str, Any]) -> dict[str, Any]:
        """Runs every row of ``input_batch`` as a rollout; the output's rows follow the input's order.

        Raises:
            ConfigError: a row names no task (``env_extras[i]["task"]``).
            RolloutError: the service refused a group or could not be reached.
        """
        prompts = _prompts_of(input_batch)
        trajectories: list[dict[str, Any]] = [{} for _ in input_batch["prompts"]]
        async with self._client_factory(self.settings) as client:
            groups = await gather_or_cancel([
                run_group(client, self._request(p, input_batch),
                          submit_retry_s=self.settings.submit_retry_s,
                          timeout_s=self.settings.timeout_s) for p in prompts
            ])  # fmt: skip
        for prompt, group in zip(prompts, groups, strict=True):
            for row, trajectory in zip(prompt.rows, group, strict=True):
                trajectories[row] = trajectory
        return self._output(input_batch, prompts, trajectories)

    def _request(self, prompt: _Prompt, input_batch: dict[str, Any]) -> dict[str, Any]:
        metadata = input_batch.get("batch_metadata")
        step = getattr(metadata, "global_step", None)
        request = {
            "environment": prompt.environment,
            "task": prompt.task,
            "group_size": len(prompt.rows),
            "model": self.settings.model,
            "base_url": self.settings.base_url,
            "policy_version": f"step-{step}" if step is not None else None,
            **self.settings.request,
        }
        sampling = input_batch.get("sampling_params") or {}
        limit = sampling.get("max_tokens") or sampling.get("max_generate_length")
        if limit and "max_output_tokens" not in request:
            request["max_output_tokens"] = int(limit)
        return request

    def _output(
        self,
        input_batch: dict[str, Any],
        prompts: Sequence[_Prompt],
        trajectories: list[dict[str, Any]],
    ) -> dict[str, Any]:
        ids = input_batch.get("trajectory_ids") or [None] * len(trajectories)
        masked_rows = _masked_rows(prompts, trajectories)
        rows = _Rows()
        dropped = 0
        for row, trajectory in enumerate(trajectories):
            if row in masked_rows:
                _add_placeholder(rows, trajectory, ids[row], masked_rows[row])
                continue
            splits = trainable_segments(trajectory)
            if not self.settings.step_wise:
                dropped += len(splits) - 1
                splits = splits[-1:]
            for position, split in enumerate(splits):
                _add_segment(rows, trajectory, ids[row], split, is_last=position == len(splits) - 1)
        return {
            "prompt_token_ids": rows.prompt_token_ids,
            "response_ids": rows.response_ids,
            "rewards": rows.rewards,
            "loss_masks": rows.loss_masks,
            "stop_reasons": rows.stop_reasons,
            "rollout_metrics": _metrics(trajectories, masked_rows, prompts, dropped),
            "rollout_logprobs": rows.rollout_logprobs,
            "trajectory_ids": rows.trajectory_ids if input_batch.get("trajectory_ids") else None,
            "trajectory_generation_times": rows.generation_times,
            "trajectory_time_splits": {"llm": rows.llm_times, "env": rows.env_times},
            "rollout_expert_indices": None,
            "rollout_sample_support": None,
            "is_last_step": rows.is_last_step if self.settings.step_wise else None,
            "env_metrics": rows.env_metrics,
            "pixel_values": None,
            "image_grid_thw": None,
        }


def _prompts_of(input_batch: dict[str, Any]) -> list[_Prompt]:
    """Groups the rows by ``instance_id`` (each row alone when SkyRL gave no trajectory ids)."""
    extras = input_batch.get("env_extras") or [{} for _ in input_batch["prompts"]]
    ids = input_batch.get("trajectory_ids")
    by_key: dict[tuple[str, str, str], _Prompt] = {}
    for row, (env_class, extra) in enumerate(zip(input_batch["env_classes"], extras, strict=True)):
        task = (extra or {}).get("task")
        if not task:
            raise ConfigError(
                f"row {row} has no env_extras['task'] (a task file on the rollout service's "
                "machine): add it to the dataset's extra_info"
            )
        instance = ids[row].instance_id if ids else f"row-{row}"
        key = (str(instance), str(env_class), str(task))
        by_key.setdefault(key, _Prompt(str(env_class), str(task), [])).rows.append(row)
    return list(by_key.values())


def _masked_rows(prompts: Sequence[_Prompt], trajectories: list[dict[str, Any]]) -> dict[int, str]:
    """Row -> why it is a placeholder: every row of a prompt with an untrainable rollout."""
    masked: dict[int, str] = {}
    for prompt in prompts:
        reasons = [untrainable_reason(trajectories[row]) for row in prompt.rows]
        first = next((r for r in reasons if r is not None), None)
        if first is None:
            continue
        for row, own in zip(prompt.rows, reasons, strict=True):
            masked[row] = own or f"group_member_{first}"
    return masked


def _time_splits(trajectory: dict[str, Any]) -> tuple[float, float, float]:
    time_s = trajectory.get("time") or {}
    llm = float(time_s.get("model_s") or 0.0)
    env = float(time_s.get("tools_s") or 0.0) + float(time_s.get("grading_s") or 0.0)
    return float(time_s.get("wall_s") or 0.0), llm, env


def _add_segment(
    rows: _Rows, trajectory: dict[str, Any], tid: Any, split: SegmentSplit, *, is_last: bool
) -> None:
    rows.prompt_token_ids.append(split.prompt_ids)
    rows.response_ids.append(split.response_ids)
    rows.loss_masks.append(split.loss_mask)
    rows.rollout_logprobs.append(split.logprobs)
    rows.rewards.append(float(trajectory["reward"]) if is_last else 0.0)
    rows.stop_reasons.append(split.finish_reason or "stop")
    _add_common(rows, trajectory, tid, is_last=is_last, segment=split.index, untrainable=None)


def _add_placeholder(rows: _Rows, trajectory: dict[str, Any], tid: Any, reason: str) -> None:
    rows.prompt_token_ids.append([0])
    rows.response_ids.append([0])
    rows.loss_masks.append([0])
    rows.rollout_logprobs.append([0.0])
    rows.rewards.append(0.0)
    rows.stop_reasons.append(_PLACEHOLDER_STOP)
    _add_common(rows, trajectory, tid, is_last=True, segment=None, untrainable=reason)


def _add_common(
    rows: _Rows,
    trajectory: dict[str, Any],
    tid: Any,
    *,
    is_last: bool,
    segment: int | None,
    untrainable: str | None,
) -> None:
    wall, llm, env = _time_splits(trajectory)
    rows.trajectory_ids.append(tid)
    rows.is_last_step.append(is_last)
    rows.generation_times.append(wall)
    rows.llm_times.append(llm)
    rows.env_times.append(env)
    failure = trajectory.get("infra_failure") or {}
    rows.env_metrics.append({
        "agentinfra_run_id": trajectory.get("run_id"),
        "agentinfra_group_id": trajectory.get("group_id"),
        "agentinfra_reward": trajectory.get("reward"),
        "agentinfra_hack_flagged": bool(trajectory.get("hack_flagged")),
        "agentinfra_stop_reason": trajectory.get("stop_reason"),
        "agentinfra_infra_failure": failure.get("kind"),
        "agentinfra_segment": segment,
        "agentinfra_untrainable": untrainable,
    })  # fmt: skip


def _metrics(
    trajectories: list[dict[str, Any]],
    masked_rows: dict[int, str],
    prompts: Sequence[_Prompt],
    dropped_segments: int,
) -> dict[str, Any]:
    graded = [t for row, t in enumerate(trajectories) if row not in masked_rows]
    rewards = [float(t["reward"]) for t in graded]
    return {
        "agentinfra/trajectories": len(trajectories),
        "agentinfra/infra_failures": sum(1 for t in trajectories if t.get("infra_failure")),
        "agentinfra/masked_trajectories": len(masked_rows),
        "agentinfra/masked_prompts": sum(1 for p in prompts if p.rows[0] in masked_rows),
        "agentinfra/dropped_segments": dropped_segments,
        "agentinfra/segments": sum(len(t.get("segments") or []) for t in graded),
        "agentinfra/avg_reward": sum(rewards) / len(rewards) if rewards else 0.0,
        "agentinfra/avg_turns": (
            sum(int(t.get("turns") or 0) for t in graded) / len(graded) if graded else 0.0
        ),
    }

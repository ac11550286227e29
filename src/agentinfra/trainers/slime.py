"""A slime custom generate function that runs each sample as an agentinfra rollout.

Use it with slime's ``--custom-generate-function-path agentinfra.trainers.slime.generate``
(signature ``async def generate(args, sample, sampling_params) -> Sample | list[Sample]``,
slime ``docs/en/get_started/customization.md``), and, to keep infra failures out of
group statistics, ``--dynamic-sampling-filter-path
agentinfra.trainers.slime.drop_groups_with_infra_failures``; when a rollout can come back in
several segments, ``--custom-reward-post-process-path
agentinfra.trainers.slime.group_advantages`` keeps GRPO's groups per prompt.

Settings are attributes of slime's ``args``, set in the YAML of ``--custom-config-path``
(slime copies each key onto ``args``): `SlimeSettings` lists them. Each sample names its
task in ``sample.metadata`` (slime's ``--metadata-key`` column): ``task`` (a task file on
the rollout service's machine) and optionally ``environment``.

The samples of one slime group (one ``group_index``, ``--n-samples-per-prompt`` of them)
become the G rollouts of one agentinfra group, so they are graded with the same hidden
seed: the first sample to arrive submits the group, each sample takes the next rollout.

What comes back (docs/trajectory.md, "Mappings to trainers' types"): one `Sample` per
trajectory segment that holds an engine-sampled token, all sharing ``rollout_id``, with the
engine's ids, the loss mask and logprobs cut where the engine's first sampled token
begins, and the trusted reward (split ``reward / K`` over K segments by default, as slime's
docs suggest). A rollout that cannot be trained on (an infra failure, or no engine ids)
comes back as one placeholder `Sample` with ``remove_sample`` set and its loss mask zero,
the pattern of slime's ``examples/coding_agent_rl/generate.py``: ``aborted`` when it was
cancelled, ``failed`` otherwise. Leave ``--group-rm`` off: it would recompute every
group's rewards over agentinfra's trusted ones. slime's ``Sample`` is imported at call
time; nothing here needs slime to import.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentinfra.errors import ConfigError
from agentinfra.trainers._convert import (
    SegmentSplit,
    trainable_segments,
    untrainable_reason,
    wait_rollout,
)

__all__ = [
    "SlimeSettings",
    "drop_groups_with_infra_failures",
    "generate",
    "group_advantages",
    "samples_of",
]

logger = logging.getLogger(__name__)

RewardSplit = Literal["divide", "repeat"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SlimeSettings:
    """The adapter's settings, read from slime's ``args`` (`from_args`); every name is ``agentinfra_<field>``."""

    url: str
    """The rollout service (``agentinfra rollouts serve``), e.g. ``http://127.0.0.1:7490``."""
    base_url: str
    """The OpenAI-compatible endpoint the agents call; it must return token ids (vLLM, or
    slime's ``OpenAIAdapter`` over SGLang): docs/trajectory.md, Capture."""
    model: str
    """The model name at ``base_url``."""
    token_file: Path | None = None
    """A file whose last word is the service's bearer token (None: no token)."""
    environment: str = "kernels"
    """The environment of samples whose metadata names none."""
    reward_split: RewardSplit = "divide"
    """``divide``: each of K segments gets ``reward / K``; ``repeat``: each gets ``reward``."""
    timeout_s: float | None = None
    """How long one sample waits for its rollout (None: as long as it takes)."""
    submit_retry_s: float = 600.0
    """How long a submission waits out the service's 429s."""
    request: dict[str, Any] = field(default_factory=dict)
    """More `GroupRequest` fields for every group (``max_turns``, ``context_tokens``, ``options``...)."""

    def __post_init__(self) -> None:
        for name in ("url", "base_url", "model"):
            if not getattr(self, name):
                raise ConfigError(f"agentinfra_{name} is empty: set it in --custom-config-path")
        if self.reward_split not in ("divide", "repeat"):
            raise ConfigError(
                f"agentinfra_reward_split={self.reward_split!r} must be 'divide' or 'repeat'"
            )
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ConfigError(f"agentinfra_timeout_s={self.timeout_s} must be > 0 or null")
        owned = {"environment", "task", "group_size", "model", "base_url"}
        if clash := sorted(owned & set(self.request)):
            raise ConfigError(
                f"agentinfra_request sets {clash}, which the adapter sets itself; remove them"
            )

    @classmethod
    def from_args(cls, args: Any) -> SlimeSettings:
        """The settings on slime's ``args`` (``agentinfra_url``, ``agentinfra_model``...).

        Raises:
            ConfigError: a required attribute is missing, or a value is refused.
        """
        missing = [f"agentinfra_{n}" for n in ("url", "base_url", "model")
                   if getattr(args, f"agentinfra_{n}", None) is None]  # fmt: skip
        if missing:
            raise ConfigError(
                f"slime's args lack {', '.join(missing)}: set them in the YAML of --custom-config-path"
            )
        token_file = getattr(args, "agentinfra_token_file", None)
        timeout = _number(args, "agentinfra_timeout_s")
        request = getattr(args, "agentinfra_request", None) or {}
        if not isinstance(request, dict):
            raise ConfigError(
                f"agentinfra_request={request!r} must be a mapping of GroupRequest fields "
                "(in the YAML of --custom-config-path)"
            )
        return cls(
            url=str(args.agentinfra_url),
            base_url=str(args.agentinfra_base_url),
            model=str(args.agentinfra_model),
            token_file=Path(token_file) if token_file else None,
            environment=str(getattr(args, "agentinfra_environment", None) or "kernels"),
            reward_split=getattr(args, "agentinfra_reward_split", None) or "divide",
            timeout_s=timeout,
            submit_retry_s=_number(args, "agentinfra_submit_retry_s") or 600.0,
            request=dict(request),
        )

    def token(self) -> str | None:
        """The bearer token: the last word of ``token_file``.

        Raises:
            ConfigError: the file cannot be read or is empty.
        """
        if self.token_file is None:
            return None
        try:
            words = self.token_file.read_text().split()
        except OSError as exc:
            raise ConfigError(
                f"cannot read agentinfra_token_file {self.token_file}: {exc}"
            ) from None
        if not words:
            raise ConfigError(f"agentinfra_token_file {self.token_file} is empty")
        return words[-1]


def _number(args: Any, name: str) -> float | None:
    """``args.<name>`` as a float (None when unset); a value that is not a number is a ConfigError."""
    value = getattr(args, name, None)
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if isinstance(value, bool) or number != number:  # NaN: never equal to itself
        raise ConfigError(
            f"{name}={value!r} must be a number (in the YAML of --custom-config-path)"
        )
    return number


def _sample_class() -> Any:
    try:
        return importlib.import_module("slime.utils.types").Sample
    except ImportError:
        raise ConfigError(
            "slime is not importable (slime.utils.types.Sample): run agentinfra.trainers.slime.generate "
            "inside slime's environment (--custom-generate-function-path)"
        ) from None


ClientFactory = Callable[[SlimeSettings], Any]
"""Makes the async context manager that yields a `RolloutSource` (default: `AsyncRolloutClient`)."""


def _default_client(settings: SlimeSettings) -> Any:
    from agentinfra.rollouts import AsyncRolloutClient

    return AsyncRolloutClient(settings.url, token=settings.token())


async def generate(
    args: Any,
    sample: Any,
    sampling_params: dict[str, Any],
    *,
    client_factory: ClientFactory = _default_client,
) -> Any:
    """slime's custom generate function: runs ``sample``'s task as an agentinfra rollout.

    Returns:
        A list of slime ``Sample``: one per trainable segment, or one placeholder.

    Raises:
        ConfigError: slime is not importable, a setting is missing or refused, or the
            sample's metadata names no task.
        RolloutError: the service refused the group or could not be reached.
    """
    sample_class = _sample_class()
    settings = SlimeSettings.from_args(args)
    request = _group_request(args, sample, sampling_params, settings)
    async with client_factory(settings) as client:
        rollout_id = await _broker().claim(
            _group_key(sample, request), request["group_size"],
            lambda: _submit_group(client_factory, settings, request),
        )  # fmt: skip
        trajectory = await wait_rollout(client, rollout_id, settings.timeout_s)
    return samples_of(trajectory, sample, sample_class, reward_split=settings.reward_split)


async def _submit_group(
    client_factory: ClientFactory, settings: SlimeSettings, request: dict[str, Any]
) -> dict[str, Any]:
    """Submits a group on a client of its own: the group's samples all wait on it, so it must
    not close with the sample that happened to start it (a cancelled sample closes its client)."""
    async with client_factory(settings) as client:
        answer: dict[str, Any] = await client.submit_group(
            request, retry_for_s=settings.submit_retry_s
        )
        return answer


def _group_request(
    args: Any, sample: Any, sampling_params: dict[str, Any], settings: SlimeSettings
) -> dict[str, Any]:
    metadata = sample.metadata or {}
    task = metadata.get("task")
    if not task:
        raise ConfigError(
            f"sample {sample.index} has no metadata['task'] (a task file on the rollout service's "
            "machine): add it to the prompt data's --metadata-key column"
        )
    request: dict[str, Any] = {
        "environment": str(metadata.get("environment") or settings.environment),
        "task": str(task),
        "group_size": int(getattr(args, "n_samples_per_prompt", 1) or 1)
        if sample.group_index is not None
        else 1,
        "model": settings.model,
        "base_url": settings.base_url,
        **settings.request,
    }
    if "max_output_tokens" not in request and sampling_params.get("max_new_tokens"):
        request["max_output_tokens"] = int(sampling_params["max_new_tokens"])
    return request


def _group_key(sample: Any, request: dict[str, Any]) -> tuple[object, ...]:
    if sample.group_index is None:
        return ("sample", id(sample))
    return ("group", sample.group_index, request["environment"], request["task"])


_OPEN_GROUP_TTL_S = 3600.0
"""An open group not fully claimed after this long is forgotten (its samples never all came)."""


@dataclass(slots=True)
class _OpenGroup:
    submission: asyncio.Future[dict[str, Any]]
    opened_at: float
    claimed: int = 0


class _GroupBroker:
    """Gives the samples of one slime group the rollouts of one agentinfra group, in arrival order.

    One per event loop, no lock: between two awaits the claim is atomic. A group whose
    rollouts are all claimed is forgotten, so a later re-run of the same ``group_index``
    (slime re-queues aborted samples) submits a new group; one left partly claimed is
    forgotten after `_OPEN_GROUP_TTL_S`.
    """

    def __init__(self) -> None:
        self._open: dict[tuple[object, ...], _OpenGroup] = {}

    async def claim(
        self,
        key: tuple[object, ...],
        size: int,
        submit: Callable[[], Awaitable[dict[str, Any]]],
    ) -> str:
        now = time.monotonic()
        for stale in [k for k, e in self._open.items() if now - e.opened_at > _OPEN_GROUP_TTL_S]:
            del self._open[stale]
        entry = self._open.get(key)
        if entry is None:
            entry = _OpenGroup(asyncio.ensure_future(submit()), opened_at=now)
            self._open[key] = entry
        position = entry.claimed
        entry.claimed += 1
        if entry.claimed >= size:
            del self._open[key]
        try:
            answer = await asyncio.shield(entry.submission)
        except BaseException:
            if self._open.get(key) is entry:
                del self._open[key]
            raise
        return str(answer["rollout_ids"][position])


_BROKERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _GroupBroker] = (
    weakref.WeakKeyDictionary()
)


def _broker() -> _GroupBroker:
    return _BROKERS.setdefault(asyncio.get_running_loop(), _GroupBroker())


def samples_of(
    trajectory: dict[str, Any],
    sample: Any,
    sample_class: Any,
    *,
    reward_split: RewardSplit = "divide",
) -> list[Any]:
    """The slime ``Sample``s of one agentinfra trajectory, copies of ``sample`` (docs/trajectory.md).

    Args:
        trajectory: One trajectory as the rollout service returns it.
        sample: The slime sample it was generated for (prompt, index, group_index kept).
        sample_class: slime's ``Sample`` (its ``Status`` enum is used).
        reward_split: How a rollout's reward is shared by its segments.
    """
    rollout_id = sample.rollout_id if sample.rollout_id is not None else sample.index
    common = _metadata(trajectory)
    reason = untrainable_reason(trajectory)
    if reason is not None:
        return [_placeholder(trajectory, sample, sample_class, rollout_id, reason, common)]
    splits = trainable_segments(trajectory)
    reward = float(trajectory["reward"])
    share = reward / len(splits) if reward_split == "divide" else reward
    time_s = trajectory.get("time") or {}
    outside_s = float(time_s.get("tools_s") or 0.0) + float(time_s.get("grading_s") or 0.0)
    out = []
    for position, split in enumerate(splits):
        is_last = position == len(splits) - 1
        out.append(
            _segment_sample(
                split, sample, sample_class, rollout_id, share, common,
                outside_s=outside_s if is_last else 0.0, segment_count=len(splits),
            )
        )  # fmt: skip
    return out


def _metadata(trajectory: dict[str, Any]) -> dict[str, Any]:
    return {
        "agentinfra_run_id": trajectory.get("run_id"),
        "agentinfra_group_id": trajectory.get("group_id"),
        "agentinfra_environment": trajectory.get("environment"),
        "agentinfra_task": trajectory.get("task"),
        "agentinfra_reward": trajectory.get("reward"),
        "agentinfra_turn_rewards": trajectory.get("turn_rewards") or [],
        "agentinfra_hack_flagged": bool(trajectory.get("hack_flagged")),
        "agentinfra_stop_reason": trajectory.get("stop_reason"),
        "agentinfra_infra_failure": trajectory.get("infra_failure"),
        "agentinfra_policy_version": trajectory.get("policy_version"),
    }


def _segment_sample(
    split: SegmentSplit,
    sample: Any,
    sample_class: Any,
    rollout_id: int | None,
    reward: float,
    common: dict[str, Any],
    *,
    outside_s: float,
    segment_count: int,
) -> Any:
    out = copy.copy(sample)
    out.tokens = split.prompt_ids + split.response_ids
    out.response_length = len(split.response_ids)
    out.loss_mask = split.loss_mask
    out.rollout_log_probs = split.logprobs
    out.reward = reward
    out.weight_versions = split.policy_versions
    out.rollout_id = rollout_id
    out.session_id = sample.session_id or common["agentinfra_run_id"]
    out.non_generation_time = outside_s
    out.status = (
        sample_class.Status.TRUNCATED
        if split.finish_reason == "length"
        else sample_class.Status.COMPLETED
    )
    out.metadata = {
        **(sample.metadata or {}), **common,
        "agentinfra_segment": split.index, "agentinfra_segments": segment_count,
        "agentinfra_break_reason": split.break_reason,
    }  # fmt: skip
    return out


def _placeholder(
    trajectory: dict[str, Any],
    sample: Any,
    sample_class: Any,
    rollout_id: int | None,
    reason: str,
    common: dict[str, Any],
) -> Any:
    out = copy.copy(sample)
    out.tokens = [0, 0]
    out.response_length = 1
    out.loss_mask = [0]
    out.rollout_log_probs = [0.0]
    out.reward = 0.0
    out.remove_sample = True
    out.weight_versions = []
    out.rollout_id = rollout_id
    out.session_id = sample.session_id or common["agentinfra_run_id"]
    failure = trajectory.get("infra_failure") or {}
    out.status = (
        sample_class.Status.ABORTED
        if failure.get("kind") == "cancelled"
        else sample_class.Status.FAILED
    )
    out.metadata = {**(sample.metadata or {}), **common, "agentinfra_untrainable": reason}
    logger.info("rollout %s is masked out of training: %s", trajectory.get("run_id"), reason)
    return out


def drop_groups_with_infra_failures(args: Any, samples: list[Any], **kwargs: Any) -> Any:
    """slime's ``--dynamic-sampling-filter-path``: drops a group that holds a masked-out rollout.

    Keeps infra failures out of group statistics: a group's mean and spread are computed
    only over rollouts that were actually graded (slime then samples another group).
    """
    output = importlib.import_module("slime.rollout.filter_hub.base_types").DynamicFilterOutput
    flat = [s for item in samples for s in (item if isinstance(item, list) else [item])]
    masked = [s.metadata.get("agentinfra_untrainable") for s in flat
              if s.metadata.get("agentinfra_untrainable")]  # fmt: skip
    if masked:
        return output(keep=False, reason=f"agentinfra_untrainable:{masked[0]}")
    return output(keep=True, reason=None)


def group_advantages(args: Any, samples: list[Any]) -> tuple[list[float], list[float]]:
    """slime's ``--custom-reward-post-process-path``: GRPO advantages per slime group, per rollout.

    slime's built-in normalization reshapes rewards to ``n_samples_per_prompt`` columns and,
    when a custom generate function fans a rollout out into several Samples, falls back to
    one group over the whole batch (``slime/ray/rollout.py``, ``_post_process_rewards``).
    Here a group is a ``group_index``, each rollout (``rollout_id``) counts once with its
    whole reward, every segment of a rollout gets that rollout's advantage (SkyRL's
    step-wise broadcast), and masked-out rollouts neither enter the mean and spread nor get
    an advantage. ``args.grpo_std_normalization`` (slime's flag) divides by the spread.

    Returns:
        The raw rewards and the advantages, one each per sample, in ``samples``' order.
    """
    raw = [float(s.reward or 0.0) for s in samples]
    by_group: dict[object, dict[object, float]] = {}
    for s in samples:
        if not s.metadata.get("agentinfra_untrainable"):
            total = s.metadata.get("agentinfra_reward", s.reward)
            by_group.setdefault(s.group_index, {})[s.rollout_id] = float(total or 0.0)
    divide = bool(getattr(args, "grpo_std_normalization", True))
    stats = {g: _mean_spread(list(r.values())) for g, r in by_group.items()}
    advantages = []
    for s in samples:
        if s.metadata.get("agentinfra_untrainable"):
            advantages.append(0.0)
            continue
        mean, spread = stats[s.group_index]
        centred = by_group[s.group_index][s.rollout_id] - mean
        advantages.append(centred / (spread + 1e-6) if divide else centred)
    return raw, advantages


def _mean_spread(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``torch.std``'s default; 0 for one value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5

"""TRL's `GRPOTrainer` trains on agentinfra rollouts: a ``rollout_func`` over the rollout service.

TRL 1.16 (``trl/trainer/grpo_trainer.py``, ``GRPOTrainer._generate``) calls
``rollout_func(prompts, trainer)`` with this process's generation batch. Its ``RepeatSampler``
puts each dataset prompt ``num_generations`` (G) times in a row, and TRL later normalises
rewards over consecutive rows (``rewards.view(-1, G)``), so the function returns one row per
prompt, in the prompts' order: ``prompt_ids``, ``completion_ids`` and ``logprobs`` (lists of
lists), plus ``env_mask`` (TRL's tool mask: 1 on model tokens, 0 on what the environment
wrote; multiplied into the completion mask of the loss) and per-row extra fields TRL hands
to every reward function (``reward``, ``infra_failure``, ``run_id``, ...).

What this module makes of it (decision 0018):

- **A prompt is a task.** The dataset's ``prompt`` column holds task files on the service's
  machine (plain strings). Each run of G rows is one `GroupRequest` of G rollouts (one hidden
  grading seed), all submitted at once, then streamed back and put in rollout order.
- **Rows are the engine's tokens** (docs/trajectory.md): with ``p`` the first sampled position
  of a segment, ``prompt_ids = token_ids[:p]``, ``completion_ids = token_ids[p:]``,
  ``env_mask = loss_mask[p:]``, ``logprobs = logprobs[p:]`` with 0.0 where the mask is 0 (as
  TRL's own tool loop fills them) and None kept on a sampled token whose logprob the engine did
  not return (TRL turns it into NaN and leaves it out of its importance-sampling correction).
  Nothing is re-tokenized; a rollout whose ``tokens`` is not ``exact`` is refused.
- **One row per rollout, so one segment.** A context break splits a trajectory into segments;
  TRL has one prompt and one completion per row. ``segments="last"`` trains on the last
  segment (the episode's end and its submissions; ``segments_dropped`` says how many came
  before); ``segments="refuse"`` raises instead.
- **Infra failures stay out of the group statistics.** Their ``reward`` is None: TRL treats a
  row for which every reward function returned None as unscorable (left out of its group's
  mean and std, advantage 0), and its ``env_mask`` is all 0, so none of its tokens enter the
  loss or its normalisation. A failure without tokens is a one-token placeholder row (the
  tokenizer's EOS, masked). Other reward functions passed to the trainer should also return
  None where ``infra_failure`` is set.
- **Weights** are TRL's job: with ``use_vllm=True`` in server mode TRL pushes the policy into the
  vLLM server over NCCL before it calls this function (CUDA only); the rollouts are then asked
  for with ``policy_version`` = the trainer's global step. Without it nothing updates the server,
  and the version stays ``"0"`` (or what ``policy_version`` returns).

Only this module imports TRL's world; it needs nothing of TRL at import time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import ValidationError

from agentinfra.errors import ConfigError, RolloutError
from agentinfra.rollouts import AsyncRolloutClient, GroupRequest
from agentinfra.trainers._convert import trainable_segments

__all__ = [
    "RESERVED_FIELDS",
    "TrainerLike",
    "TrlRow",
    "agentinfra_reward",
    "rollout_func",
    "row_of_trajectory",
    "tasks_of",
]

logger = logging.getLogger(__name__)

RESERVED_FIELDS = frozenset(
    {"environment", "task", "group_size", "model", "base_url", "policy_version"}
)
"""`GroupRequest` fields the rollout function sets itself (``request`` may not hold them)."""

Segments = Literal["last", "refuse"]
_Groups = list[list[dict[str, Any]]]


class TrainerLike(Protocol):
    """What the rollout function reads of a TRL ``GRPOTrainer`` (its attributes in TRL 1.16)."""

    num_generations: int
    num_generations_eval: int
    use_vllm: bool
    model: Any
    state: Any
    processing_class: Any


@dataclass(frozen=True, slots=True)
class TrlRow:
    """One rollout as a row of TRL's rollout output."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float | None]
    env_mask: list[int]
    reward: float | None
    """None for an infra failure (TRL: unscorable, out of the group's statistics)."""
    infra_failure: str | None
    """The failure's kind (docs/trajectory.md), or None."""
    run_id: str
    segments_dropped: int
    """Segments before the one trained on (``segments="last"``)."""


def rollout_func(
    service_url: str,
    *,
    model: str,
    base_url: str,
    environment: str = "kernels",
    token: str | None = None,
    segments: Segments = "last",
    request: Mapping[str, Any] | None = None,
    policy_version: Callable[[TrainerLike], str | None] | None = None,
    retry_for_s: float = 600.0,
    timeout_s: float = 600.0,
) -> Callable[[list[Any], TrainerLike], dict[str, list[Any]]]:
    """The ``rollout_func`` for TRL's ``GRPOTrainer``: each prompt (a task file) run as agentinfra rollouts.

    Args:
        service_url: The rollout service (``agentinfra rollouts serve``), e.g. ``http://127.0.0.1:7490``.
        model: The model name the agents send to ``base_url`` (as the engine serves it).
        base_url: The engine's OpenAI-compatible endpoint, as the service's machine reaches it.
        environment: The registered environment of every task (``kernels``, ``desktop``).
        token: The service's bearer token, if it needs one.
        segments: What a rollout split by a context break gives: ``"last"`` its last segment,
            ``"refuse"`` a `RolloutError`.
        request: Other `GroupRequest` fields for every group (``max_turns``, ``max_output_tokens``,
            ``options``, ...); ``tokens`` defaults to True (the engine's ids are required).
        policy_version: The policy version each group is asked with, from the trainer; default:
            the global step when TRL syncs the weights into vLLM (``use_vllm``), else ``"0"``.
        retry_for_s: How long a full service (429) is waited out before the step fails.
        timeout_s: Timeout of each call to the service (the groups' streams have none).

    Raises:
        ConfigError: a bad argument or ``request`` field (the message names it).
    """
    if segments not in ("last", "refuse"):
        raise ConfigError(f"segments={segments!r} must be 'last' or 'refuse'")
    fields = {"tokens": True, **(request or {})}
    reserved = sorted(RESERVED_FIELDS & fields.keys())
    if reserved:
        raise ConfigError(
            f"request={reserved} are set by rollout_func itself: pass them as its arguments"
        )
    _group_request(
        environment, "<task>", 1, model, base_url, None, fields
    )  # refuses bad fields now
    version_of = policy_version or _default_policy_version

    def generate(prompts: list[Any], trainer: TrainerLike) -> dict[str, list[Any]]:
        size = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        tasks = tasks_of(prompts, size)
        version = version_of(trainer)
        requests = [
            _group_request(environment, task, size, model, base_url, version, fields)
            for task in tasks
        ]
        groups = _run_sync(_collect(service_url, token, requests, retry_for_s, timeout_s))
        eos = _eos_of(trainer.processing_class)
        rows = [row_of_trajectory(t, segments=segments, eos_id=eos) for g in groups for t in g]
        logger.info(
            "%d rollouts of %d tasks (policy %s): %d infra failures", len(rows), len(tasks),
            version, sum(r.infra_failure is not None for r in rows),
        )  # fmt: skip
        return _columns(rows)

    return generate


def agentinfra_reward(
    prompts: list[Any], completions: list[Any], reward: list[float | None], **kwargs: Any
) -> list[float | None]:
    """A TRL reward function: the trusted reward agentinfra's graders gave each rollout (None for
    an infra failure). Pass it in ``reward_funcs`` with `rollout_func`."""
    return list(reward)


def tasks_of(prompts: Sequence[Any], group_size: int) -> list[str]:
    """The task of each group of ``group_size`` consecutive prompts (TRL's order).

    Raises:
        ConfigError: a prompt is not a task path, or the prompts do not form whole groups.
    """
    for prompt in prompts:
        if not isinstance(prompt, str) or not prompt:
            raise ConfigError(
                f"prompt {str(prompt)[:80]!r} is not a task: the dataset's 'prompt' column must "
                "hold task files on the rollout service's machine (plain strings)"
            )
    chunks = [list(prompts[i : i + group_size]) for i in range(0, len(prompts), group_size)]
    for chunk in chunks:
        if len(chunk) != group_size or len(set(chunk)) != 1:
            raise ConfigError(
                f"TRL gave {len(prompts)} prompts that do not form groups of num_generations="
                f"{group_size} ({sorted(set(chunk))} in one group of {len(chunk)}): each "
                "process's generation batch must hold whole groups (make "
                "per_device_train_batch_size * steps_per_generation a multiple of num_generations)"
            )
    return [chunk[0] for chunk in chunks]


def row_of_trajectory(
    trajectory: Mapping[str, Any], *, segments: Segments = "last", eos_id: int
) -> TrlRow:
    """One trajectory (docs/trajectory.md) as TRL's row.

    Raises:
        RolloutError: a rollout that is not an infra failure has no exact tokens, or has
            several segments and ``segments="refuse"``.
    """
    run_id = str(trajectory.get("run_id"))
    failure = trajectory.get("infra_failure")
    kind = str(failure.get("kind")) if isinstance(failure, Mapping) else None
    parts = trajectory.get("segments") or []
    if kind is None and trajectory.get("tokens") != "exact":
        raise RolloutError(
            f"rollout {run_id} has tokens={trajectory.get('tokens')!r}, not 'exact': TRL trains on "
            "the engine's ids only; serve the model with vLLM (it returns token ids) at base_url"
        )
    if kind is None and len(parts) > 1 and segments == "refuse":
        raise RolloutError(
            f"rollout {run_id} has {len(parts)} segments (breaks "
            f"{[s.get('break_reason') for s in parts[1:]]}) and TRL takes one sequence per "
            "rollout: pass segments='last', or give the agent a larger context_tokens"
        )
    reward = None if kind is not None else float(trajectory["reward"])
    dropped = max(0, len(parts) - 1)
    splits = trainable_segments(trajectory) if parts else []
    last = splits[-1] if splits and splits[-1].index == len(parts) - 1 else None
    if last is None:  # the last segment holds no engine-sampled token
        return TrlRow([eos_id], [eos_id], [0.0], [0], reward, kind, run_id, dropped)
    # an infra failure's tokens stay out of the loss and its normalisation
    mask = last.loss_mask if kind is None else [0] * len(last.loss_mask)
    raw = parts[-1]["logprobs"][len(last.prompt_ids) :]  # None kept on a sampled token (see above)
    logprobs = [(None if r is None else lp) if m else 0.0
                for r, m, lp in zip(raw, last.loss_mask, last.logprobs, strict=True)]  # fmt: skip
    return TrlRow(
        prompt_ids=last.prompt_ids, completion_ids=last.response_ids, logprobs=logprobs,
        env_mask=mask, reward=reward, infra_failure=kind, run_id=run_id, segments_dropped=dropped,
    )  # fmt: skip


def _columns(rows: Sequence[TrlRow]) -> dict[str, list[Any]]:
    return {
        "prompt_ids": [r.prompt_ids for r in rows],
        "completion_ids": [r.completion_ids for r in rows],
        "logprobs": [r.logprobs for r in rows],
        "env_mask": [r.env_mask for r in rows],
        "reward": [r.reward for r in rows],
        "infra_failure": [r.infra_failure for r in rows],
        "run_id": [r.run_id for r in rows],
        "segments_dropped": [r.segments_dropped for r in rows],
    }


def _default_policy_version(trainer: TrainerLike) -> str:
    return str(trainer.state.global_step) if trainer.use_vllm else "0"


def _eos_of(processing_class: Any) -> int:
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    eos = getattr(tokenizer, "eos_token_id", None)
    if not isinstance(eos, int):
        raise ConfigError(
            f"the trainer's processing_class {type(processing_class).__name__} has no eos_token_id"
        )
    return eos


def _group_request(
    environment: str, task: str, size: int, model: str, base_url: str,
    version: str | None, fields: Mapping[str, Any],
) -> GroupRequest:  # fmt: skip
    try:
        return GroupRequest(
            environment=environment, task=task, group_size=size, model=model, base_url=base_url,
            policy_version=version, **fields,
        )  # fmt: skip
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(
            f"rollout_func: {where}={first.get('input')!r}: {first['msg']} "
            "(a GroupRequest field: fix the argument or request=)"
        ) from None


async def _collect(
    url: str, token: str | None, requests: Sequence[GroupRequest], retry_for_s: float,
    timeout_s: float,
) -> _Groups:  # fmt: skip
    """Submits every group, then waits for all of them; each group's trajectories in rollout order."""
    async with AsyncRolloutClient(url, token=token, timeout_s=timeout_s) as client:
        try:
            accepted = [await client.submit_group(r, retry_for_s=retry_for_s) for r in requests]
        except RolloutError as exc:
            if exc.status:
                raise
            raise RolloutError(
                f"{exc} (rollout_func's service_url: is `agentinfra rollouts serve` running there?)"
            ) from None
        return list(await asyncio.gather(*(_group_of(client, a) for a in accepted)))


async def _group_of(
    client: AsyncRolloutClient, accepted: Mapping[str, Any]
) -> list[dict[str, Any]]:
    order = {rid: index for index, rid in enumerate(accepted["rollout_ids"])}
    trajectories = [t async for t in client.trajectories(accepted["group_id"])]
    if sorted(str(t.get("run_id")) for t in trajectories) != sorted(order):
        raise RolloutError(
            f"group {accepted['group_id']} streamed {len(trajectories)} trajectories, "
            f"not its {len(order)} rollouts {sorted(order)}"
        )
    return sorted(trajectories, key=lambda t: order[str(t["run_id"])])


def _run_sync(coroutine: Coroutine[Any, Any, _Groups]) -> _Groups:
    """Runs ``coroutine`` to its end from TRL's synchronous loop (in a thread if a loop is running here)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()

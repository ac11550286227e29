"""From an agentinfra trajectory (docs/trajectory.md) to the pieces every trainer's sample is made of.

`trainable_segments` cuts each segment at ``p``, the index of its first engine-sampled
token: ``prompt_ids = token_ids[:p]``, ``response_ids = token_ids[p:]`` with the loss mask
and logprobs cut the same way (a ``null`` logprob, on a token the engine did not sample,
becomes ``0.0``). Nothing is re-tokenized: the ids are the engine's, as the service
returned them. `untrainable_reason` says why a trajectory must not be trained on (an
infra failure, or no engine ids at all), so adapters mask it instead of training on a
reward of 0 that nobody earned.

`run_group` runs one group through the rollout service and returns its trajectories in
rollout order; a cancelled caller cancels the rollouts it started.

Pure functions and one coroutine; used by `agentinfra.trainers.slime` and
`agentinfra.trainers.skyrl` (and usable by any adapter that needs the same cut).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from agentinfra.errors import RolloutError

__all__ = [
    "RolloutSource",
    "SegmentSplit",
    "gather_or_cancel",
    "run_group",
    "trainable_segments",
    "untrainable_reason",
    "wait_rollout",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_POLL_S = 240.0
"""One long poll of ``GET /v1/rollouts/{id}`` (the service caps a wait at 300 s)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentSplit:
    """One segment cut where its engine-sampled tokens begin (all lists are new lists)."""

    index: int
    """The segment's index in the trajectory's ``segments``."""
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    """One per response id: 1 where the engine sampled it, 0 on tool results and template tokens."""
    logprobs: list[float]
    """One per response id: the engine's logprob where ``loss_mask`` is 1, else 0.0."""
    finish_reason: str | None
    """The ``finish_reason`` of the segment's last call (``stop``, ``length``, ``tool_calls``)."""
    policy_versions: list[str]
    """The ``policy_version`` of each of the segment's calls that recorded one, in call order."""
    break_reason: str | None
    """Why this segment started (null for the first; docs/trajectory.md, Segments)."""


def untrainable_reason(trajectory: Mapping[str, Any]) -> str | None:
    """Why ``trajectory`` must be masked out rather than trained on; None when it is trainable.

    The reason is ``infra_failure:<kind>`` for a rollout that failed outside the episode's
    control, ``tokens_unavailable`` when the engine returned no ids, ``no_sampled_tokens``
    when no segment holds a token the engine sampled.
    """
    failure = trajectory.get("infra_failure")
    if failure:
        return f"infra_failure:{failure.get('kind', 'unknown')}"
    if trajectory.get("tokens") == "unavailable" or not trajectory.get("segments"):
        return "tokens_unavailable"
    if not trainable_segments(trajectory):
        return "no_sampled_tokens"
    return None


def trainable_segments(trajectory: Mapping[str, Any]) -> list[SegmentSplit]:
    """Every segment of ``trajectory`` that holds an engine-sampled token, cut at its first one.

    Raises:
        RolloutError: a segment's ``token_ids``, ``loss_mask`` and ``logprobs`` differ in
            length, or name a call that is not in ``calls`` (the trajectory is corrupt).
    """
    calls: Sequence[Mapping[str, Any]] = trajectory.get("calls") or []
    splits = []
    for index, segment in enumerate(trajectory.get("segments") or []):
        _check_segment(trajectory, index, segment, len(calls))
        mask = segment["loss_mask"]
        start = next((i for i, bit in enumerate(mask) if bit), None)
        if start is None:
            continue
        own_calls = [calls[i] for i in segment["calls"]]
        splits.append(
            SegmentSplit(
                index=index,
                prompt_ids=list(segment["token_ids"][:start]),
                response_ids=list(segment["token_ids"][start:]),
                loss_mask=[int(bit) for bit in mask[start:]],
                logprobs=[0.0 if lp is None else float(lp) for lp in segment["logprobs"][start:]],
                finish_reason=own_calls[-1].get("finish_reason") if own_calls else None,
                policy_versions=[str(c["policy_version"]) for c in own_calls
                                 if c.get("policy_version") is not None],
                break_reason=segment.get("break_reason"),
            )
        )  # fmt: skip
    return splits


def _check_segment(
    trajectory: Mapping[str, Any], index: int, segment: Mapping[str, Any], call_count: int
) -> None:
    lengths = {len(segment["token_ids"]), len(segment["loss_mask"]), len(segment["logprobs"])}
    if len(lengths) != 1:
        raise RolloutError(
            f"trajectory {trajectory.get('run_id')!r} segment {index}: token_ids, loss_mask and "
            f"logprobs differ in length ({sorted(lengths)}); the trajectory is corrupt"
        )
    bad = [i for i in segment["calls"] if not 0 <= i < call_count]
    if bad:
        raise RolloutError(
            f"trajectory {trajectory.get('run_id')!r} segment {index} names calls {bad} "
            f"beyond its {call_count} calls; the trajectory is corrupt"
        )


class RolloutSource(Protocol):
    """What `run_group` needs of `agentinfra.rollouts.AsyncRolloutClient` (a fake may stand in)."""

    async def submit_group(
        self, request: Any, *, retry_for_s: float = 0.0
    ) -> dict[str, Any]: ...  # pragma: no cover

    async def rollout(self, rollout_id: str, *, wait_s: float = 0.0) -> dict[str, Any]: ...

    async def cancel(self, rollout_id: str, reason: str = "stale policy") -> dict[str, Any]: ...


async def run_group(
    client: RolloutSource,
    request: Mapping[str, Any],
    *,
    submit_retry_s: float = 600.0,
    timeout_s: float | None = None,
) -> list[dict[str, Any]]:
    """Submits ``request`` (a `GroupRequest` as JSON) and returns its G trajectories in rollout order.

    Raises:
        RolloutError: the service refused the group (a 429 outlasting ``submit_retry_s``
            included), or a rollout did not finish within ``timeout_s``.
    """
    answer = await client.submit_group(dict(request), retry_for_s=submit_retry_s)
    rollout_ids = [str(r) for r in answer["rollout_ids"]]
    return await gather_or_cancel([wait_rollout(client, r, timeout_s) for r in rollout_ids])


async def gather_or_cancel(awaitables: Sequence[Awaitable[T]]) -> list[T]:
    """Every result in order; when one raises, the others are cancelled (each cancels its
    rollout at the service) before the first error is raised."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def wait_rollout(
    client: RolloutSource, rollout_id: str, timeout_s: float | None = None
) -> dict[str, Any]:
    """The trajectory of ``rollout_id`` once it finishes; cancels it if the caller is cancelled.

    Raises:
        RolloutError: it did not finish within ``timeout_s`` (it is cancelled first).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while True:
            left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if left <= 0:
                await _cancel_quietly(client, rollout_id, "timed out at the trainer")
                raise RolloutError(
                    f"rollout {rollout_id} did not finish within {timeout_s} s "
                    "(raise agentinfra_timeout_s for slime, SkyRLSettings.timeout_s for SkyRL)"
                )
            answer = await client.rollout(rollout_id, wait_s=left)
            if answer.get("state") == "finished" and answer.get("trajectory") is not None:
                trajectory: dict[str, Any] = answer["trajectory"]
                return trajectory
    except asyncio.CancelledError:
        await asyncio.shield(_cancel_quietly(client, rollout_id, "the trainer cancelled it"))
        raise


async def _cancel_quietly(client: RolloutSource, rollout_id: str, reason: str) -> None:
    with contextlib.suppress(RolloutError):
        await client.cancel(rollout_id, reason)
        logger.info("cancelled rollout %s: %s", rollout_id, reason)

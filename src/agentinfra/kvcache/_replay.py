"""Trace replay: hit rates of a policy, Belady's offline optimum, and what they save.

A trace is Mooncake's JSONL format: one request per line with ``timestamp`` (ms),
``input_length`` and ``output_length`` (tokens) and ``hash_ids`` (the prompt as a
chain of blocks; equal ids mean the same prefix block), plus an optional
``session_id`` (agentinfra's generated agent traces).

Replay semantics (the same for every policy and for the optimum):

- a request hits the leading run of its blocks that is cached; the hit rate is
  those hits over all requested blocks;
- after the request, its full blocks are stored (missing ones inserted head to
  tail, then all touched tail to head); a trailing partial block
  (``input_length`` not a multiple of the block size) is not cacheable, as in real
  engines that only cache full blocks (``cache_partial_blocks`` changes this);
- Belady's MIN evicts the cached block whose next request is farthest away, and
  bypasses a block that would itself be that victim;
- with ``session_hints``, a session's last request carries the agent's "done"
  hint: the blocks no other session ever requested leave the cache at once (what
  the store does on SESSION ``close``), so they stop taking room from live agents.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentinfra.errors import ConfigError, TraceFormatError
from agentinfra.kvcache._index import BlockIndex
from agentinfra.kvcache._policies import make_policy

__all__ = [
    "CostModel",
    "ReplayResult",
    "TraceRequest",
    "belady_hit_rate",
    "capacity_for_fraction",
    "read_trace",
    "replay",
    "unique_blocks",
]

_NEVER = 1 << 62


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[Hashable, ...]
    session_id: str | None = None


def _parse_line(text: str, where: str) -> TraceRequest:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise TraceFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [k for k in ("timestamp", "input_length", "hash_ids") if k not in row]
    if missing:
        raise TraceFormatError(f"{where}: missing field(s) {', '.join(missing)}")
    ids = row["hash_ids"]
    if not isinstance(ids, list) or not all(isinstance(i, int | str) for i in ids):
        raise TraceFormatError(f"{where}: hash_ids must be a list of integers or strings")
    numbers = (row["timestamp"], row["input_length"], row.get("output_length", 0))
    if not all(isinstance(n, int | float) and not isinstance(n, bool) for n in numbers):
        raise TraceFormatError(
            f"{where}: timestamp, input_length and output_length must be numbers"
        )
    session = row.get("session_id")
    return TraceRequest(
        timestamp_ms=float(row["timestamp"]),
        input_length=int(row["input_length"]),
        output_length=int(row.get("output_length", 0)),
        hash_ids=tuple(ids),
        session_id=None if session is None else str(session),
    )


def read_trace(path: Path) -> list[TraceRequest]:
    """Reads a JSONL trace; blank lines are skipped.

    Raises:
        TraceFormatError: a malformed line; the message names the file and line.
        ConfigError: the file cannot be read.
    """
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read trace {path}: {exc.strerror}") from None
    requests = [
        _parse_line(line, f"{path}:{number}")
        for number, line in enumerate(lines, start=1)
        if line.strip()
    ]
    if not requests:
        raise TraceFormatError(f"{path}: no requests in trace")
    return requests


def unique_blocks(requests: Iterable[TraceRequest]) -> int:
    """Number of distinct block ids in ``requests``."""
    return len({key for request in requests for key in request.hash_ids})


@dataclass(frozen=True, slots=True, kw_only=True)
class CostModel:
    """Model geometry and tier bandwidths for the prefill-time estimate.

    Defaults: an 8B dense model (Llama-3-8B geometry: 32 layers, 8 KV heads of
    dimension 128, bf16 KV) prefilling at 400 TFLOP/s effective, with the cache
    tier read at 25 GB/s (host memory over PCIe 5).
    """

    params: float = 8.0e9
    num_layers: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    kv_dtype_bytes: int = 2
    prefill_flops_per_s: float = 4.0e14
    tier_read_bytes_per_s: float = 25.0e9

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    def recompute_s(self, tokens: int) -> float:
        """Prefill time of ``tokens`` (2 FLOPs per parameter per token)."""
        return 2.0 * self.params * tokens / self.prefill_flops_per_s

    def load_s(self, tokens: int) -> float:
        """Time to read the KV of ``tokens`` from the cache tier."""
        return tokens * self.kv_bytes_per_token / self.tier_read_bytes_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    """Outcome of one replay; `to_json` is the CLI's ``--json`` object."""

    requests: int
    blocks: int
    unique_blocks: int
    capacity_blocks: int
    policy: str
    hit_rate: float
    belady_hit_rate: float | None
    hit_blocks: int
    inserted_blocks: int
    evicted_blocks: int
    block_tokens: int
    bytes_read: int
    bytes_written: int
    prefill_s_recompute_all: float
    prefill_s_saved: float
    cost_model: dict[str, float] = field(default_factory=dict)
    session_hints: bool = False
    released_blocks: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict, with the ratio to Belady when it was computed."""
        data = asdict(self)
        data["bytes_moved"] = {"memory": {"read": self.bytes_read, "written": self.bytes_written}}
        optimum = self.belady_hit_rate
        data["ratio_to_belady"] = self.hit_rate / optimum if optimum else None
        return data


def _cacheable(request: TraceRequest, block_tokens: int, cache_partial: bool) -> Sequence[Hashable]:
    ids = request.hash_ids
    if cache_partial or not ids or request.input_length >= len(ids) * block_tokens:
        return ids
    return ids[:-1]


def replay(
    requests: Sequence[TraceRequest],
    *,
    capacity_blocks: int,
    policy: str,
    block_tokens: int = 512,
    cache_partial_blocks: bool = False,
    with_belady: bool = True,
    cost: CostModel | None = None,
    session_hints: bool = False,
) -> ReplayResult:
    """Replays ``requests`` through one cache of ``capacity_blocks`` under ``policy``."""
    if capacity_blocks < 0:
        raise ConfigError(f"capacity_blocks={capacity_blocks} must be >= 0 (--capacity-blocks)")
    index = BlockIndex(capacity_blocks, make_policy(policy))
    hits = total = inserted = evicted = released = 0
    last = {r.session_id: i for i, r in enumerate(requests) if r.session_id is not None}
    holders: dict[
        Hashable, str | None
    ] = {}  # the one session that requested a block, or None: shared
    held: dict[str, list[Hashable]] = {}
    for number, request in enumerate(requests):
        ids = request.hash_ids
        hits += index.leading_hits(ids)
        total += len(ids)
        keep = _cacheable(request, block_tokens, cache_partial_blocks)
        parent: Hashable | None = None
        for key in keep:
            if key not in index:
                result = index.insert(key, parent=parent)
                inserted += result.is_admitted
                evicted += len(result.evicted)
            parent = key
        index.touch(keep)
        session = request.session_id
        if session_hints and session is not None:
            mine = held.setdefault(session, [])
            for key in keep:
                if key not in holders:
                    holders[key] = session
                    mine.append(key)
                elif holders[key] != session:
                    holders[key] = None
            if last[session] == number:  # the agent is done
                for key in held.pop(session):
                    if holders.get(key) == session and index.remove(key):
                        released += 1
    model = cost or CostModel()
    block_bytes = block_tokens * model.kv_bytes_per_token
    hit_tokens = hits * block_tokens
    optimum = (
        belady_hit_rate(
            requests,
            capacity_blocks,
            block_tokens=block_tokens,
            cache_partial_blocks=cache_partial_blocks,
        )
        if with_belady
        else None
    )
    return ReplayResult(
        requests=len(requests),
        blocks=total,
        unique_blocks=unique_blocks(requests),
        capacity_blocks=capacity_blocks,
        policy=policy,
        hit_rate=hits / total if total else 0.0,
        belady_hit_rate=optimum,
        hit_blocks=hits,
        inserted_blocks=inserted,
        evicted_blocks=evicted,
        block_tokens=block_tokens,
        bytes_read=hits * block_bytes,
        bytes_written=inserted * block_bytes,
        prefill_s_recompute_all=model.recompute_s(total * block_tokens),
        prefill_s_saved=max(0.0, model.recompute_s(hit_tokens) - model.load_s(hit_tokens)),
        cost_model={k: float(v) for k, v in asdict(model).items()},
        session_hints=session_hints,
        released_blocks=released,
    )


def _next_uses(requests: Sequence[TraceRequest]) -> list[list[int]]:
    """For each request and each of its blocks, the index of the next request using it."""
    following: dict[Hashable, int] = {}
    result: list[list[int]] = [[] for _ in requests]
    for position in range(len(requests) - 1, -1, -1):
        ids = requests[position].hash_ids
        result[position] = [following.get(key, _NEVER) for key in ids]
        for key in ids:
            following[key] = position
    return result


def belady_hit_rate(
    requests: Sequence[TraceRequest],
    capacity_blocks: int,
    *,
    block_tokens: int = 512,
    cache_partial_blocks: bool = False,
) -> float:
    """Hit rate of Belady's MIN (with bypass) at ``capacity_blocks``, same semantics as `replay`."""
    next_use = _next_uses(requests)
    cached: dict[Hashable, int] = {}
    heap: list[tuple[int, int, Hashable]] = []
    hits = total = tick = 0
    for position, request in enumerate(requests):
        ids = request.hash_ids
        run = 0
        for key in ids:
            if key not in cached:
                break
            run += 1
        hits += run
        total += len(ids)
        keep = len(_cacheable(request, block_tokens, cache_partial_blocks))
        for key, upcoming in zip(ids[:keep], next_use[position][:keep], strict=True):
            if capacity_blocks == 0:
                break
            tick += 1
            cached[key] = upcoming
            heapq.heappush(heap, (-upcoming, -tick, key))  # ties: the deepest block goes first
            while len(cached) > capacity_blocks:
                negative, _, victim = heapq.heappop(heap)
                if cached.get(victim) == -negative:
                    del cached[victim]
    return hits / total if total else 0.0


def capacity_for_fraction(requests: Sequence[TraceRequest], fraction: float) -> int:
    """``fraction`` of the trace's unique blocks, at least one."""
    if not 0 < fraction <= 1 or math.isnan(fraction):
        raise ConfigError(f"capacity fraction {fraction} must be in (0, 1] (--capacity-fraction)")
    return max(1, int(unique_blocks(requests) * fraction))

"""Synthetic agent-session traces in Mooncake's format, plus ``session_id``.

Each session starts from one of a few shared system prompts (with tool
definitions), then grows turn by turn: every turn re-sends the whole context and
appends the model's output and a tool result. Between turns the agent waits on a
tool (an exponential pause). Some turns fan out sub-agents that inherit the
parent's context and run their own short sessions. Sessions start as a Poisson
process. The generator is seeded and deterministic.
"""

from __future__ import annotations

import heapq
import json
import random
from dataclasses import dataclass
from pathlib import Path

from agentinfra.errors import ConfigError

__all__ = ["AgentTraceConfig", "generate_agent_trace", "write_trace"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentTraceConfig:
    """Shape of a generated agent trace."""

    sessions: int = 200
    block_tokens: int = 512
    system_prompts: int = 4
    system_prompt_blocks: int = 12
    mean_turns: float = 12.0
    mean_blocks_per_turn: float = 2.0
    mean_tool_pause_s: float = 20.0
    mean_session_gap_s: float = 5.0
    subagent_probability: float = 0.05
    subagent_fanout: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.system_prompts < 1 or self.mean_turns < 1:
            raise ConfigError("sessions, system_prompts and mean_turns must be >= 1")
        if not 0 <= self.subagent_probability <= 1:
            raise ConfigError(f"subagent_probability={self.subagent_probability} must be in [0, 1]")


@dataclass(order=True)
class _Pending:
    at_s: float
    order: int
    session_id: str
    context: list[int]
    turns_left: int


def generate_agent_trace(config: AgentTraceConfig) -> list[dict[str, object]]:
    """Requests ordered by time: ``timestamp`` (ms), lengths, ``hash_ids``, ``session_id``."""
    rng = random.Random(config.seed)
    next_id = 0

    def fresh(count: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + count))
        next_id += count
        return ids

    prompts = [fresh(config.system_prompt_blocks) for _ in range(config.system_prompts)]
    queue: list[_Pending] = []
    start = 0.0
    for number in range(config.sessions):
        start += rng.expovariate(1 / config.mean_session_gap_s)
        turns = max(1, round(rng.expovariate(1 / config.mean_turns)))
        heapq.heappush(
            queue,
            _Pending(start, len(queue), f"s{number}", list(rng.choice(prompts)) + fresh(1), turns),
        )
    rows: list[dict[str, object]] = []
    order = config.sessions
    while queue:
        item = heapq.heappop(queue)
        partial = rng.randrange(1, config.block_tokens)
        rows.append(
            {
                "timestamp": int(item.at_s * 1000),
                "input_length": len(item.context) * config.block_tokens + partial,
                "output_length": rng.randrange(50, 2000),
                "hash_ids": [*item.context, fresh(1)[0]],
                "session_id": item.session_id,
            }
        )
        if item.turns_left <= 1:
            continue
        grown = item.context + fresh(
            max(1, round(rng.expovariate(1 / config.mean_blocks_per_turn)))
        )
        pause = rng.expovariate(1 / config.mean_tool_pause_s)
        heapq.heappush(
            queue, _Pending(item.at_s + pause, order, item.session_id, grown, item.turns_left - 1)
        )
        order += 1
        if rng.random() < config.subagent_probability:
            for _ in range(config.subagent_fanout):
                sub = f"{item.session_id}.{order}"  # order is unique: one id per sub-agent
                turns = max(1, round(rng.expovariate(2 / config.mean_turns)))
                heapq.heappush(
                    queue,
                    _Pending(item.at_s + pause * rng.random(), order, sub, grown + fresh(1), turns),
                )
                order += 1
    return rows


def write_trace(rows: list[dict[str, object]], path: Path) -> None:
    """Writes rows as JSONL."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))

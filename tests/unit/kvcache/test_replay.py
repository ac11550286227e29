from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentinfra.cli import app
from agentinfra.errors import TraceFormatError
from agentinfra.kvcache import TraceRequest, belady_hit_rate, read_trace, replay
from agentinfra.kvcache._tracegen import AgentTraceConfig, generate_agent_trace


def req(ids: list[int], *, partial: bool = False) -> TraceRequest:
    return TraceRequest(0.0, len(ids) * 512 - (100 if partial else 0), 10, tuple(ids))


def test_leading_run_semantics_exact() -> None:
    trace = [req([1, 2, 3]), req([1, 2, 3, 4]), req([9, 2, 3])]
    result = replay(trace, capacity_blocks=10, policy="lru")
    # request 2 hits 1,2,3; request 3 misses at 9 even though 2 and 3 are cached
    assert result.hit_blocks == 3
    assert result.blocks == 10
    assert result.hit_rate == pytest.approx(0.3)
    assert result.belady_hit_rate == pytest.approx(0.3)


def test_partial_trailing_block_is_not_cached() -> None:
    trace = [req([1, 2], partial=True), req([1, 2], partial=True)]
    assert replay(trace, capacity_blocks=10, policy="lru").hit_blocks == 1
    assert (
        replay(trace, capacity_blocks=10, policy="lru", cache_partial_blocks=True).hit_blocks == 2
    )


def test_capacity_bounds_hits_and_belady_beats_lru_on_a_loop() -> None:
    # The classic cyclic pattern: LRU with capacity 2 over a loop of 3 misses every time.
    trace = [req([k]) for k in [1, 2, 3] * 5]
    assert replay(trace, capacity_blocks=2, policy="lru", with_belady=False).hit_blocks == 0
    assert belady_hit_rate(trace, 2) == pytest.approx(8 / 15)  # two hits per cycle after the first
    assert replay(trace, capacity_blocks=0, policy="lru").hit_blocks == 0


@pytest.mark.parametrize("policy", ["lru", "prefix-lru", "lfu-aging"])
def test_no_policy_beats_belady_on_agent_traces(policy: str) -> None:
    rows = generate_agent_trace(AgentTraceConfig(sessions=30, seed=3))
    trace = [
        TraceRequest(r["timestamp"], r["input_length"], r["output_length"], tuple(r["hash_ids"]))
        for r in rows
    ]  # type: ignore[arg-type]
    for capacity in (20, 80, 300):
        result = replay(trace, capacity_blocks=capacity, policy=policy)
        assert result.belady_hit_rate is not None
        assert 0 < result.hit_rate <= result.belady_hit_rate + 1e-12


def test_malformed_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 5, "hash_ids": [1]}\n\n{"timestamp": 1, "hash_ids": [1]}\n'
    )
    with pytest.raises(TraceFormatError, match=r"t.jsonl:3: missing field\(s\) input_length"):
        read_trace(path)
    path.write_text("not json\n")
    with pytest.raises(TraceFormatError, match=r"t.jsonl:1: not JSON"):
        read_trace(path)
    path.write_text('{"timestamp": 0, "input_length": 5, "hash_ids": [[1]]}\n')
    with pytest.raises(TraceFormatError, match="hash_ids"):
        read_trace(path)


def test_cli_replay_json(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": i, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2 + i % 2]}
        for i in range(6)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(
        app, ["kv", "replay", str(path), "--capacity-blocks", "3", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for field in (
        "requests",
        "blocks",
        "capacity_blocks",
        "policy",
        "hit_rate",
        "belady_hit_rate",
        "bytes_moved",
        "prefill_s_saved",
    ):
        assert field in data
    assert data["requests"] == 6
    assert data["hit_rate"] == pytest.approx(9 / 12)


def test_cli_replay_bad_trace_is_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("{}\n")
    result = CliRunner().invoke(app, ["kv", "replay", str(path)])
    assert result.exit_code != 0
    assert isinstance(result.exception, TraceFormatError)


def test_cli_gen_trace_then_compare(tmp_path: Path) -> None:
    path = tmp_path / "agents.jsonl"
    made = CliRunner().invoke(app, ["kv", "gen-trace", str(path), "--sessions", "8", "--seed", "2"])
    assert made.exit_code == 0, made.output
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert {"timestamp", "input_length", "output_length", "hash_ids", "session_id"} <= set(rows[0])
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
    by_session: dict[str, list[list[int]]] = {}
    for row in rows:
        by_session.setdefault(row["session_id"], []).append(row["hash_ids"])
    for turns in by_session.values():  # every turn re-sends the previous context
        for before, after in itertools.pairwise(turns):
            assert after[: len(before) - 1] == before[:-1]
    result = CliRunner().invoke(
        app, ["kv", "compare", str(path), "--capacity-fraction", "0.1", "--json"]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted(line["policy"] for line in lines) == ["lfu-aging", "lru", "prefix-lru"]
    assert all(line["hit_rate"] <= line["belady_hit_rate"] + 1e-9 for line in lines)


def test_session_hints_release_a_done_agents_private_blocks() -> None:
    from agentinfra.kvcache import TraceRequest, replay

    requests = [
        TraceRequest(0, 32, 1, (1, 2, 10), "a"),  # 1, 2: a shared system prompt
        TraceRequest(1, 32, 1, (1, 2, 20), "b"),
        TraceRequest(2, 32, 1, (1, 2, 10, 11), "a"),  # a is done after this one
        TraceRequest(3, 32, 1, (1, 2, 20, 21, 22), "b"),
        TraceRequest(4, 32, 1, (1, 2, 20, 21, 22, 23), "b"),
    ]
    plain = replay(requests, capacity_blocks=4, policy="lru", block_tokens=8, with_belady=False)
    hinted = replay(
        requests,
        capacity_blocks=4,
        policy="lru",
        block_tokens=8,
        with_belady=False,
        session_hints=True,
    )
    assert (
        hinted.released_blocks == 3
    )  # the done agents' own blocks still cached (1, 2 are shared: kept)
    assert hinted.hit_blocks > plain.hit_blocks  # b's context no longer pushed out by a's

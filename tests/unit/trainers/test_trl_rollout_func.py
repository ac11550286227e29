"""`agentinfra.trainers.trl`: trajectories become TRL's rollout rows, groups follow TRL's order, bad input is one line.

The service side is a loopback HTTP server speaking the rollout service's two routes the
function uses (``POST /v1/groups``, the NDJSON trajectory stream); the trainer is an object
with the attributes TRL's ``GRPOTrainer`` has. The real service, vLLM and TRL run in
``tests/integration/test_trl_training.py``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from agentinfra.errors import ConfigError, RolloutError
from agentinfra.trainers.trl import agentinfra_reward, rollout_func, row_of_trajectory, tasks_of

EOS = 2


def segment(calls: list[tuple[list[int], list[int]]], first: int = 0) -> dict[str, Any]:
    """A segment built as docs/trajectory.md says: first prompt, then per call new prompt tokens and the completion."""
    tokens: list[int] = []
    mask: list[int] = []
    logprobs: list[float | None] = []
    for prompt_new, completion in calls:
        tokens += prompt_new + completion
        mask += [0] * len(prompt_new) + [1] * len(completion)
        logprobs += [None] * len(prompt_new) + [-0.5 - t / 100 for t in completion]
    return {"token_ids": tokens, "loss_mask": mask, "logprobs": logprobs,
            "calls": list(range(first, first + len(calls))), "break_reason": None if first == 0 else "context_trim",
            "break_position": None if first == 0 else 3}  # fmt: skip


def trajectory(
    run_id: str, *segments: dict[str, Any], reward: float = 0.5, **extra: Any
) -> dict[str, Any]:
    named = max((i for s in segments for i in s["calls"]), default=-1) + 1
    calls = [{"turn": i, "finish_reason": "stop"} for i in range(named)]  # the calls segments name
    return {"run_id": run_id, "tokens": "exact", "segments": list(segments), "reward": reward,
            "infra_failure": None, "group_id": "g", "calls": calls, **extra}  # fmt: skip


ONE = segment([([10, 11, 12], [20, 21]), ([13, 14], [22, 23, EOS])])


def test_a_one_segment_trajectory_is_the_engines_ids_with_agentinfras_mask() -> None:
    row = row_of_trajectory(trajectory("r0", ONE), eos_id=EOS)
    assert row.prompt_ids == [10, 11, 12]
    assert row.completion_ids == [20, 21, 13, 14, 22, 23, EOS]
    assert row.env_mask == [1, 1, 0, 0, 1, 1, 1]
    assert row.logprobs == [-0.7, -0.71, 0.0, 0.0, -0.72, -0.73, -0.52]
    assert (row.reward, row.infra_failure, row.run_id, row.segments_dropped) == (0.5, None, "r0", 0)


def test_a_sampled_token_without_a_logprob_stays_none_for_trl_to_neutralise() -> None:
    seg = segment([([10, 11], [20, 21])])
    seg["logprobs"][3] = None
    assert row_of_trajectory(trajectory("r", seg), eos_id=EOS).logprobs == [-0.7, None]


def test_several_segments_give_the_last_or_a_one_line_refusal() -> None:
    second = segment([([10, 11, 99, 13, 14], [30, 31])], first=2)
    split = trajectory("r1", ONE, second)
    row = row_of_trajectory(split, eos_id=EOS)
    assert (row.prompt_ids, row.completion_ids, row.env_mask) == (
        [10, 11, 99, 13, 14],
        [30, 31],
        [1, 1],
    )
    assert row.segments_dropped == 1
    with pytest.raises(
        RolloutError, match=r"rollout r1 has 2 segments .*'context_trim'.*segments='last'"
    ):
        row_of_trajectory(split, segments="refuse", eos_id=EOS)


@pytest.mark.parametrize("tokens", ["unavailable", "partial"])
def test_a_rollout_without_exact_tokens_is_refused_in_one_line(tokens: str) -> None:
    with pytest.raises(
        RolloutError, match=rf"rollout r2 has tokens='{tokens}', not 'exact'"
    ) as caught:
        row_of_trajectory(trajectory("r2", ONE, tokens=tokens), eos_id=EOS)
    assert "\n" not in str(caught.value)


def test_an_infra_failure_is_unscorable_and_masked_out() -> None:
    failed = trajectory(
        "r3", ONE, reward=0.0, infra_failure={"kind": "model_error", "message": "x"}
    )
    row = row_of_trajectory(failed, eos_id=EOS)
    assert (row.reward, row.infra_failure) == (None, "model_error")
    assert row.completion_ids == [
        20,
        21,
        13,
        14,
        22,
        23,
        EOS,
    ]  # the tokens it had, none of them trained
    assert row.env_mask == [0] * 7
    # a failure before any model call (no tokens at all) is a masked one-token row, even with segments="refuse"
    empty = trajectory(
        "r4", reward=0.0, tokens="unavailable", infra_failure={"kind": "internal", "message": "x"}
    )
    row = row_of_trajectory(empty, segments="refuse", eos_id=EOS)
    assert (row.prompt_ids, row.completion_ids, row.env_mask, row.logprobs) == (
        [EOS],
        [EOS],
        [0],
        [0.0],
    )
    assert row.reward is None


def test_tasks_come_from_whole_groups_in_trls_order() -> None:
    assert tasks_of(["a.py", "a.py", "b.py", "b.py", "a.py", "a.py"], 2) == ["a.py", "b.py", "a.py"]
    with pytest.raises(
        ConfigError, match=r"groups of num_generations=2 .*\['a.py', 'b.py'\].*multiple"
    ):
        tasks_of(["a.py", "b.py", "b.py", "b.py"], 2)
    with pytest.raises(ConfigError, match=r"num_generations=3 \(\['a.py'\] in one group of 2\)"):
        tasks_of(["a.py", "a.py"], 3)
    with pytest.raises(ConfigError, match=r"prompt \"\[\{'role'.*is not a task"):
        tasks_of([[{"role": "user", "content": "a.py"}]], 1)


def test_bad_arguments_are_refused_when_the_function_is_made() -> None:
    make = {"model": "m", "base_url": "http://127.0.0.1:1/v1"}
    with pytest.raises(
        ConfigError, match=r"request=\['group_size', 'policy_version'\] are set by rollout_func"
    ):
        rollout_func("http://x", **make, request={"group_size": 2, "policy_version": "1"})
    with pytest.raises(ConfigError, match=r"max_turns=0: .*greater than or equal to 1.*request="):
        rollout_func("http://x", **make, request={"max_turns": 0})
    with pytest.raises(ConfigError, match=r"no_such=1: Extra inputs"):
        rollout_func("http://x", **make, request={"no_such": 1})
    with pytest.raises(ConfigError, match=r"segments='first' must be"):
        rollout_func("http://x", **make, segments="first")  # type: ignore[arg-type]


class FakeService:
    """``POST /v1/groups`` and ``GET /v1/groups/{gid}/trajectories`` on loopback; trajectories
    are streamed in reverse rollout order (the service streams them as they finish)."""

    def __init__(self, make: Any) -> None:
        self.requests: list[dict[str, Any]] = []
        self.groups: dict[str, list[str]] = {}
        self.make = make
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                service.requests.append(body | {"auth": self.headers.get("Authorization")})
                gid = f"g{len(service.groups)}"
                service.groups[gid] = [f"{gid}-{i}" for i in range(body["group_size"])]
                self._send(202, json.dumps({"group_id": gid, "rollout_ids": service.groups[gid]}))

            def do_GET(self) -> None:
                gid = self.path.split("/")[3]
                request = service.requests[int(gid[1:])]
                lines = [
                    json.dumps(service.make(rid, request)) for rid in reversed(service.groups[gid])
                ]
                self._send(200, "".join(line + "\n" for line in lines), "application/x-ndjson")

            def _send(self, status: int, text: str, kind: str = "application/json") -> None:
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeService:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def fake_trainer(generations: int = 2, *, training: bool = True, use_vllm: bool = False) -> Any:
    return SimpleNamespace(num_generations=generations, num_generations_eval=1, use_vllm=use_vllm,
                           model=SimpleNamespace(training=training), state=SimpleNamespace(global_step=7),
                           processing_class=SimpleNamespace(eos_token_id=EOS))  # fmt: skip


def task_trajectory(rid: str, request: dict[str, Any]) -> dict[str, Any]:
    """Rollout ``gN-i`` of task ``t``: its ids say which task and which rollout it is."""
    task, index = int(request["task"].removesuffix(".py")[-1]), int(rid.rsplit("-", 1)[1])
    failed = {"kind": "environment_died", "message": "x"} if rid == "g1-1" else None
    return trajectory(rid, segment([([100 + task], [200 + index, EOS])]), reward=task + index / 10,
                      infra_failure=failed)  # fmt: skip


@pytest.fixture
def service() -> Iterator[FakeService]:
    with FakeService(task_trajectory) as fake:
        yield fake


def test_rows_are_in_trls_order_one_group_per_task(service: FakeService) -> None:
    generate = rollout_func(service.url, model="m", base_url="http://engine/v1", token="secret",
                            request={"max_turns": 3})  # fmt: skip
    out = generate(["t1.py", "t1.py", "t2.py", "t2.py", "t1.py", "t1.py"], fake_trainer())
    assert [r["task"] for r in service.requests] == ["t1.py", "t2.py", "t1.py"]
    for request in service.requests:
        assert request["group_size"] == 2
        assert (request["model"], request["base_url"], request["environment"]) == (
            "m",
            "http://engine/v1",
            "kernels",
        )
        assert (request["max_turns"], request["tokens"], request["policy_version"]) == (
            3,
            True,
            "0",
        )
        assert request["auth"] == "Bearer secret"
    assert out["run_id"] == [
        "g0-0",
        "g0-1",
        "g1-0",
        "g1-1",
        "g2-0",
        "g2-1",
    ]  # rollout order, not stream order
    assert out["prompt_ids"] == [[101], [101], [102], [102], [101], [101]]
    assert out["completion_ids"] == [[200, EOS], [201, EOS]] * 3
    assert out["env_mask"] == [[1, 1], [1, 1], [1, 1], [0, 0], [1, 1], [1, 1]]
    assert out["reward"] == [1.0, 1.1, 2.0, None, 1.0, 1.1]
    assert out["infra_failure"] == [None, None, None, "environment_died", None, None]
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs", "env_mask", "reward",
                        "infra_failure", "run_id", "segments_dropped"}  # fmt: skip
    assert agentinfra_reward([], [], reward=out["reward"]) == out["reward"]


def test_eval_groups_use_num_generations_eval_and_vllm_sync_sets_the_policy_version(
    service: FakeService,
) -> None:
    generate = rollout_func(service.url, model="m", base_url="http://engine/v1")
    out = generate(["t1.py", "t2.py"], fake_trainer(training=False, use_vllm=True))
    assert [(r["group_size"], r["policy_version"]) for r in service.requests] == [
        (1, "7"),
        (1, "7"),
    ]
    assert out["run_id"] == ["g0-0", "g1-0"]
    custom = rollout_func(
        service.url, model="m", base_url="http://engine/v1", policy_version=lambda t: "v9"
    )
    custom(["t1.py", "t1.py"], fake_trainer())
    assert service.requests[-1]["policy_version"] == "v9"


def test_a_g_mismatch_is_refused_before_anything_runs(service: FakeService) -> None:
    generate = rollout_func(service.url, model="m", base_url="http://engine/v1")
    with pytest.raises(ConfigError, match="num_generations=3"):
        generate(["t1.py", "t1.py"], fake_trainer(3))
    assert service.requests == []


def test_a_service_that_lost_a_rollout_is_an_error() -> None:
    with FakeService(lambda rid, req: task_trajectory("g0-9", req)) as fake:
        generate = rollout_func(fake.url, model="m", base_url="http://engine/v1")
        with pytest.raises(
            RolloutError, match=r"group g0 streamed 2 trajectories, not its 2 rollouts"
        ):
            generate(["t1.py", "t1.py"], fake_trainer())


def test_an_unreachable_service_is_one_line_naming_it() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    generate = rollout_func(f"http://127.0.0.1:{port}", model="m", base_url="http://engine/v1")
    with pytest.raises(
        RolloutError,
        match=rf"cannot reach the rollout service at http://127.0.0.1:{port}.*service_url",
    ) as caught:
        generate(["t1.py"], fake_trainer(1))
    assert "\n" not in str(caught.value)


def test_it_also_runs_where_an_event_loop_is_already_running(service: FakeService) -> None:
    generate = rollout_func(service.url, model="m", base_url="http://engine/v1")

    async def inside_a_loop() -> dict[str, list[Any]]:
        return generate(["t1.py", "t1.py"], fake_trainer())

    assert asyncio.run(inside_a_loop())["run_id"] == ["g0-0", "g0-1"]

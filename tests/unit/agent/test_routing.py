"""Several engines behind one model: affinity per run, load, and engines that die or come back."""

from __future__ import annotations

import asyncio

import pytest

from agentinfra.agent import ModelClient, Reply, ScriptedModelServer
from agentinfra.agent._profiles import profile_for
from agentinfra.agent._routing import EndpointRouter, split_endpoints
from agentinfra.errors import ConfigError

A, B, C = "http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1", "http://127.0.0.1:3/v1"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_run_sticks_to_one_endpoint_and_new_runs_spread() -> None:
    router = EndpointRouter([A, B, C])
    homes = {}
    for turn in range(5):
        for run in range(6):
            url = router.route(f"run-{run}")
            homes.setdefault(run, url)
            assert url == homes[run], (turn, run)
            router.finished(url)
    assert sorted(router.stats().runs.values()) == [2, 2, 2]
    assert router.stats().requests == {A: 10, B: 10, C: 10}


def test_an_overloaded_endpoint_sheds_a_run_and_counts_it() -> None:
    router = EndpointRouter([A, B], max_imbalance=2)
    assert router.route("hot") == A
    for _ in range(2):  # three in flight on A, none on B: 3 - 0 > 2
        assert router.route("hot") == A
    assert router.route("cold") == B
    router.finished(B)
    assert router.route("hot") == B
    assert router.stats().moved_overload == 1


def test_a_dead_endpoints_runs_move_and_it_gets_the_next_new_run_when_back() -> None:
    clock = Clock()
    router = EndpointRouter([A, B], cooldown_s=5.0, clock=clock)
    first, second = router.route("r1"), router.route("r2")
    assert {first, second} == {A, B}
    router.finished(first)
    router.finished(second, reached=False)  # refused: down for 5 s
    assert not router.stats().up[second]
    assert router.any_other_up(second)
    moved = router.route("r2")
    assert moved == first
    router.finished(moved)
    assert router.stats().moved_down == 1
    clock.now = 6.0  # back (restarted): no runs, nothing in flight
    assert router.route("r3") == second
    router.finished(second)
    assert router.route("r2") == first  # r2 stays where it moved


def test_forgotten_runs_free_their_endpoint() -> None:
    router = EndpointRouter([A, B])
    for run in ("r1", "r2", "r3"):
        router.finished(router.route(run))
    router.forget("r1")
    router.forget("r3")
    router.forget("never-seen")
    assert sorted(router.stats().runs.values()) == [0, 1]


def test_bad_endpoint_lists_are_refused_in_one_line() -> None:
    assert split_endpoints(f"{A}, {B}") == (A, B)
    with pytest.raises(ConfigError, match="names an endpoint twice"):
        split_endpoints(f"{A},{A}")
    with pytest.raises(ConfigError, match="has an empty endpoint"):
        split_endpoints(f"{A},")
    with pytest.raises(ConfigError, match="must start with http"):
        split_endpoints(f"{A},127.0.0.1:8000")
    with pytest.raises(ConfigError, match="max_imbalance=0"):
        EndpointRouter([A], max_imbalance=0)


def _ok(_: dict[str, object]) -> Reply:
    return Reply(content="ok")


def test_clients_over_two_real_servers_keep_affinity_and_survive_one_dying() -> None:
    """Real HTTP: six runs over two scripted servers; one server stops mid-way and comes
    back on its port. No request fails, each run's requests hit one server until its server
    dies, and the restarted server gets the next new run."""
    one = ScriptedModelServer(_ok, models=["m"]).__enter__()
    two = ScriptedModelServer(_ok, models=["m"]).__enter__()
    port_two = int(two.base_url.rsplit(":", 1)[1].split("/")[0])
    base = f"{one.base_url},{two.base_url}"

    async def runs() -> None:
        clients = [
            ModelClient(
                base_url=base,
                model="m",
                api_key="test-key",
                api_key_env="K",
                profile=profile_for("m"),
                max_retries=3,
                backoff_s=0.01,
                kv_session=f"run-{i}",
            )
            for i in range(6)
        ]
        messages = [{"role": "user", "content": "hi"}]
        for client in clients:
            await client.complete(messages, [], stream=False)
        homes = [client.last_endpoint for client in clients]
        assert sorted(homes) == sorted([one.base_url] * 3 + [two.base_url] * 3)
        for client in clients:
            await client.complete(messages, [], stream=False)
        assert [client.last_endpoint for client in clients] == homes
        two.__exit__(None, None, None)  # an engine dies
        for client in clients:
            await client.complete(messages, [], stream=False)  # none fails
        assert {client.last_endpoint for client in clients} == {one.base_url}
        router = clients[0].router
        assert router is not None
        assert router.stats().moved_down == 3
        again = ScriptedModelServer(_ok, models=["m"], port=port_two).__enter__()
        try:
            router._down_until[two.base_url] = 0.0  # its cooldown over
            late = ModelClient(base_url=base, model="m", api_key="test-key", api_key_env="K",
                               profile=profile_for("m"), kv_session="run-late")  # fmt: skip
            await late.complete(messages, [], stream=False)
            assert late.last_endpoint == two.base_url
            assert len(again.requests) == 1
            await late.close()
        finally:
            again.__exit__(None, None, None)
        for client in clients:
            await client.close()
        assert sum(router.stats().runs.values()) == 0

    try:
        asyncio.run(runs())
        assert len(one.requests) == 3 * 2 + 6
    finally:
        one.__exit__(None, None, None)

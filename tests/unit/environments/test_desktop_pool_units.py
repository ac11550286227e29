"""The desktop pool without desktops: the health rule, the size knob, and who may take from a pool."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from agentinfra._settings import load_settings
from agentinfra.environments.desktop import DesktopConfig, DesktopPool
from agentinfra.environments.desktop._pool import active_pool, health_problem, take_pooled
from agentinfra.errors import ConfigError
from agentinfra.rollouts import RolloutService, ServiceConfig

RECORDED = {(10, 100): "python", (11, 101): "Xvfb", (12, 102): "dbus-daemon", (13, 103): "openbox"}


def alive(**changes: tuple[str, str] | None) -> dict[tuple[int, int], tuple[str, str]]:
    """RECORDED, all sleeping, with ``changes`` by comm (None: gone)."""
    now = {key: (comm, "S") for key, comm in RECORDED.items()}
    for comm, value in changes.items():
        key = next(k for k, c in RECORDED.items() if c == comm.replace("_", "-"))
        if value is None:
            del now[key]
        else:
            now[key] = value
    return now


def test_a_desktop_whose_processes_are_the_recorded_ones_is_healthy() -> None:
    assert health_problem(RECORDED, alive()) is None


def test_a_dead_stopped_or_zombie_process_makes_it_unhealthy() -> None:
    assert health_problem(RECORDED, alive(Xvfb=None)) == "Xvfb (pid 11) is gone"
    assert (
        health_problem(RECORDED, alive(openbox=("openbox", "Z")))
        == "openbox (pid 13) is in state Z"
    )
    assert health_problem(RECORDED, alive(dbus_daemon=("dbus-daemon", "T"))) == (
        "dbus-daemon (pid 12) is in state T"
    )


def test_a_recycled_pid_is_not_the_recorded_process() -> None:
    now = alive(Xvfb=None)
    now[(11, 999)] = ("Xvfb", "S")  # same pid, another start time
    assert health_problem(RECORDED, now) == "Xvfb (pid 11) is gone"


def test_a_stray_process_of_the_uid_makes_it_unhealthy() -> None:
    now = alive()
    now[(50, 500)] = ("sleep", "S")
    now[(51, 501)] = ("sh", "S")
    assert health_problem(RECORDED, now) == "stray process sleep (pid 50) and 1 more"


@pytest.mark.parametrize("size", [-1, 65, True, 2.0, "2"])
def test_a_bad_pool_size_is_refused_naming_the_flag(size: object) -> None:
    with pytest.raises(
        ConfigError, match=r"desktop pool size .* is outside 0\.\.64; set --desktop-pool"
    ):
        DesktopPool(size=size)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [-1, 65, True, 2.0, "2"])
def test_the_service_refuses_a_bad_pool_size(size: int, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"desktop_pool=.* must be in 0\.\.64 \(--desktop-pool\)"):
        ServiceConfig(state_dir=tmp_path, desktop_pool=size)
    assert ServiceConfig(state_dir=tmp_path).desktop_pool == 0


def test_without_a_pool_or_of_another_shape_an_episode_starts_its_own() -> None:
    async def main() -> None:
        assert await take_pooled() is None
        async with DesktopPool(size=0) as pool:  # size 0: installed, never filled
            assert active_pool() is pool
            assert await take_pooled(DesktopConfig(width=1280, height=720)) is None
            assert pool.stats().misses == 0  # another shape never asks this pool
            assert await take_pooled() is None
            assert pool.stats().misses == 1
            # An episode on another event loop (run_scripted in a worker thread) never takes from it.
            assert await asyncio.to_thread(asyncio.run, take_pooled()) is None
            assert pool.stats().misses == 1
            with pytest.raises(ConfigError, match="a desktop pool already runs"):
                await DesktopPool(size=1).start()
        assert active_pool() is None

    asyncio.run(main())


def test_a_service_that_fails_to_start_leaves_no_pool_running(tmp_path: Path) -> None:
    """The port is taken: start fails, and no pool is left installed (nor filling in the background)."""

    async def main() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            config = ServiceConfig(
                state_dir=tmp_path, port=port, desktop_pool=1, check_endpoint=False
            )
            service = RolloutService(config, load_settings(), api_key_of=lambda _: "")
            try:
                with pytest.raises(OSError, match=r"(?i)address already in use"):
                    await service.start()
                assert active_pool() is None
            finally:
                left = active_pool()
                if left is not None:  # the defect: close what it left, so other tests run
                    await left.close()
                await service.close()

    asyncio.run(main())

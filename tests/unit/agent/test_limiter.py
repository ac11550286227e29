"""The endpoint limiter shared by runs: in-flight cap, request rate, and a 429 pausing everyone."""

from __future__ import annotations

import asyncio
import itertools
import time

from agentinfra.agent import EndpointLimiter


def test_rate_and_in_flight_limits() -> None:
    async def scenario() -> tuple[list[float], int]:
        limiter = EndpointLimiter(max_in_flight=2, rpm=600)  # one start per 0.1 s
        starts: list[float] = []
        peak = current = 0

        async def call() -> None:
            nonlocal peak, current
            async with limiter:
                starts.append(time.monotonic())
                current += 1
                peak = max(peak, current)
                await asyncio.sleep(0.05)
                current -= 1

        await asyncio.gather(*(call() for _ in range(5)))
        return starts, peak

    starts, peak = asyncio.run(scenario())
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 0.09
    assert peak <= 2


def test_a_429_pauses_every_run_on_the_endpoint() -> None:
    async def scenario() -> float:
        limiter = EndpointLimiter()
        limiter.back_off(0.3)  # one run got Retry-After: 0.3
        started = time.monotonic()
        async with limiter:  # another run's next call waits too
            return time.monotonic() - started

    assert asyncio.run(scenario()) >= 0.29

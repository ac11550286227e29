"""Several engines behind one model: each run sticks to one (session affinity).

An agent's requests share a growing prefix, so sending all of a run's requests to
the engine that served its last one is what keeps that engine's prefix cache
(and the KV store's session) warm. `EndpointRouter` does that for every
`ModelClient` of a process that names the same endpoints:

- a run's first request goes to the live endpoint with the fewest requests in
  flight, then the fewest runs; an engine added or restarted (none of either)
  gets the next new run;
- later requests go where the run went before, unless that endpoint is
  overloaded: more than ``max_imbalance`` requests in flight beyond the least
  loaded live one. The run then moves (counted: it pays a cold prefix once);
- an endpoint that refuses connections is down for ``cooldown_s``; its runs move
  on at their next request, and it is tried again after the cooldown.

Pure bookkeeping under one lock, no I/O: `route` is microseconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentinfra.errors import ConfigError

__all__ = ["EndpointRouter", "RouterStats", "router_for", "split_endpoints"]


def split_endpoints(base_url: str) -> tuple[str, ...]:
    """The endpoints of a ``base_url``: one URL, or several separated by commas.

    Raises:
        ConfigError: an empty list, a URL twice, or one not http(s).
    """
    urls = tuple(part.strip() for part in base_url.split(","))
    if not urls or any(not url for url in urls):
        raise ConfigError(f"base_url {base_url!r} has an empty endpoint (--base-url URL[,URL...])")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url {url!r} must start with http:// or https:// (--base-url)")
    if len(set(urls)) != len(urls):
        raise ConfigError(f"base_url {base_url!r} names an endpoint twice (--base-url)")
    return urls


@dataclass(frozen=True, slots=True)
class RouterStats:
    """Per endpoint: requests in flight, runs assigned, requests sent, and whether it is up."""

    in_flight: dict[str, int]
    runs: dict[str, int]
    requests: dict[str, int]
    up: dict[str, bool]
    moved_overload: int
    moved_down: int


class EndpointRouter:
    """Routes runs (by session id) over ``urls`` with affinity, load and liveness."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        max_imbalance: int = 4,
        cooldown_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ConfigError("EndpointRouter needs at least one endpoint (--base-url)")
        if max_imbalance < 1 or cooldown_s < 0:
            raise ConfigError(
                f"max_imbalance={max_imbalance} must be >= 1 and cooldown_s={cooldown_s} >= 0"
            )
        self.urls = tuple(urls)
        self.max_imbalance = max_imbalance
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._home: dict[str, str] = {}
        self._in_flight = dict.fromkeys(self.urls, 0)
        self._runs = dict.fromkeys(self.urls, 0)
        self._requests = dict.fromkeys(self.urls, 0)
        self._down_until = dict.fromkeys(self.urls, 0.0)
        self._moved = {"overload": 0, "down": 0}

    def route(self, session: str) -> str:
        """The endpoint for ``session``'s next request (counted in flight until `finished`)."""
        with self._lock:
            now = self._clock()
            live = [u for u in self.urls if self._down_until[u] <= now] or list(self.urls)
            home = self._home.get(session)
            if home is not None:
                least = min(self._in_flight[u] for u in live)
                if home not in live:
                    self._moved["down"] += 1
                elif self._in_flight[home] - least > self.max_imbalance:
                    self._moved["overload"] += 1
                else:
                    return self._sent(home)
                self._runs[home] -= 1
            chosen = min(live, key=lambda u: (self._in_flight[u], self._runs[u]))
            self._home[session] = chosen
            self._runs[chosen] += 1
            return self._sent(chosen)

    def _sent(self, url: str) -> str:
        self._in_flight[url] += 1
        self._requests[url] += 1
        return url

    def finished(self, url: str, *, reached: bool = True) -> None:
        """A request to ``url`` ended; ``reached=False``: it could not connect (down a while)."""
        with self._lock:
            self._in_flight[url] -= 1
            if reached:
                self._down_until[url] = 0.0
            else:
                self._down_until[url] = self._clock() + self.cooldown_s

    def forget(self, session: str) -> None:
        """``session`` has ended: its endpoint no longer counts it."""
        with self._lock:
            home = self._home.pop(session, None)
            if home is not None:
                self._runs[home] -= 1

    def any_other_up(self, url: str) -> bool:
        """Whether another endpoint than ``url`` is up now (a failed request may move at once)."""
        with self._lock:
            now = self._clock()
            return any(u != url and self._down_until[u] <= now for u in self.urls)

    def stats(self) -> RouterStats:
        with self._lock:
            now = self._clock()
            return RouterStats(
                dict(self._in_flight), dict(self._runs), dict(self._requests),
                {u: self._down_until[u] <= now for u in self.urls},
                self._moved["overload"], self._moved["down"],
            )  # fmt: skip


_ROUTERS: dict[tuple[str, ...], EndpointRouter] = {}
_ROUTERS_LOCK = threading.Lock()


def router_for(urls: Sequence[str]) -> EndpointRouter:
    """The process's router over ``urls``: every client naming the same endpoints shares it."""
    key = tuple(urls)
    with _ROUTERS_LOCK:
        router = _ROUTERS.get(key)
        if router is None:
            router = _ROUTERS[key] = EndpointRouter(key)
        return router

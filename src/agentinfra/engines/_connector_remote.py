"""The vLLM connector's one connection to `agentinfra kv serve`, on a private event-loop thread.

vLLM calls the connector from its own threads and never awaits, so the connector
keeps one `AsyncCacheClient` on a background loop and every call returns a
`concurrent.futures.Future`: the scheduler polls it, the worker waits on it.
No vLLM or torch here.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import TypeVar

from agentinfra.engines._connector_plan import ConnectorCounters, ConnectorSettings
from agentinfra.kvcache import AsyncCacheClient, BlockKey

__all__ = ["CacheRemote", "begin_session"]

_T = TypeVar("_T")


class CacheRemote:
    """One connection to the cache server on a private event-loop thread; each call returns a Future.

    A failed call drops the connection (counted as a network error); the next call
    reconnects, at most once a second.
    """

    def __init__(self, settings: ConnectorSettings, counters: ConnectorCounters) -> None:
        self.settings = settings
        self.counters = counters
        self.loop = asyncio.new_event_loop()
        self._client: AsyncCacheClient | None = None
        self._retry_at = 0.0
        self._connecting = asyncio.Lock()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="agentinfra-kv", daemon=True
        )
        self._thread.start()

    async def _connected(self) -> AsyncCacheClient:
        async with self._connecting:  # calls in flight at once share one connection
            if self._client is None:
                if time.monotonic() < self._retry_at:
                    raise ConnectionError("the kv server was unreachable less than a second ago")
                try:
                    self._client = await AsyncCacheClient.connect(
                        self.settings.host, self.settings.port, tenant=self.settings.tenant,
                        token=self.settings.token, timeout_s=self.settings.timeout_s,
                    )  # fmt: skip
                except Exception:
                    self._retry_at = time.monotonic() + 1.0
                    raise
            return self._client

    def call(self, fn: Callable[[AsyncCacheClient], Awaitable[_T]]) -> Future[_T]:
        async def run() -> _T:
            client = await self._connected()
            try:
                return await asyncio.wait_for(fn(client), self.settings.timeout_s)
            except Exception:
                self._client = None
                self.counters.network_errors += 1
                with contextlib.suppress(Exception):
                    await client.close()
                raise

        return asyncio.run_coroutine_threadsafe(run(), self.loop)

    def close(self) -> None:
        async def shut() -> None:
            if self._client is not None:
                with contextlib.suppress(Exception):
                    await self._client.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), self.loop).result(2)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(2)
        if not self._thread.is_alive():
            self.loop.close()


async def begin_session(
    client: AsyncCacheClient, session: str, keys: list[BlockKey], parent: str | None
) -> int:
    """A turn's lookup: SESSION ``begin`` (prefetch and pin the prefix); its leading hits."""
    answer = await client.session(session, "begin", keys, parent=parent)
    return int(answer.get("hits", 0))

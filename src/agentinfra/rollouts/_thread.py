"""A `RolloutService` in this process, on an event loop of its own thread, for synchronous callers.

A trainer whose loop is synchronous (TRL's `GRPOTrainer`, a notebook) and wants the service in
its own process starts one with ``with ServiceThread(config, settings, api_key_of=...) as url:``; services
proper run with ``asyncio.run`` (`agentinfra rollouts serve`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from agentinfra._settings import Settings
from agentinfra.rollouts._service import RolloutService, ServiceConfig

__all__ = ["ServiceThread"]


class ServiceThread:
    """``with ServiceThread(config, settings) as url``: the service's base URL while the block runs."""

    def __init__(
        self,
        config: ServiceConfig,
        settings: Settings,
        *,
        api_key_of: Callable[[str], str],
        timeout_s: float = 300.0,
    ) -> None:
        """``api_key_of`` maps a group's ``api_key_env`` to its key (as `RolloutService`);
        ``timeout_s`` bounds the start and the close."""
        self.service = RolloutService(config, settings, api_key_of=api_key_of)
        self._timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="agentinfra-rollouts", daemon=True
        )

    def __enter__(self) -> str:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.service.start(), self._loop).result(
                self._timeout_s
            )
        except BaseException:
            self._stop()
            raise
        return f"http://{self.service.config.host}:{self.service.port}"

    def __exit__(self, *exc: object) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.service.close(), self._loop).result(
                self._timeout_s
            )
        finally:
            self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

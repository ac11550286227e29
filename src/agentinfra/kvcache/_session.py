"""`Session`: an agent session's handle on the store's working-set bookkeeping.

A session pins its blocks while a turn is active and gives them a time-to-live
between turns; the bookkeeping itself lives in `TieredStore` (under its lock),
and the handle only forwards to it, so a session is never used without its store.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agentinfra.kvcache._keys import BlockKey

if TYPE_CHECKING:
    from agentinfra.kvcache._store import TieredStore

__all__ = ["Session", "SessionState"]


class SessionState(enum.Enum):
    """Where an agent session is in its turn cycle."""

    ACTIVE = "active"
    WAITING = "waiting"
    IDLE = "idle"
    CLOSED = "closed"


class Session:
    """An agent session (or sub-agent) whose blocks the store treats as one working set."""

    def __init__(self, store: TieredStore, session_id: str, parent: Session | None) -> None:
        self.session_id = session_id
        self.parent = parent
        self.state = SessionState.IDLE
        self.keys: list[BlockKey] = []
        self.deadline_s: float | None = None
        self._store = store
        self._pinned: list[BlockKey] = []

    def begin_turn(self, keys: Sequence[BlockKey]) -> int:
        """Starts a turn over prefix ``keys``: prefetches and pins them; returns the hit run."""
        return self._store._begin_turn(self, keys)

    def add(self, keys: Sequence[BlockKey]) -> None:
        """Adds blocks the turn produced (already `put`) to the session and pins them."""
        self._store._add_to_session(self, keys)

    def end_turn(self, *, ttl_s: float) -> None:
        """The agent now waits on a tool: unpin, and demote the blocks after ``ttl_s``."""
        self._store._end_turn(self, ttl_s)

    def close(self, *, release_private: bool = False) -> None:
        """Ends the session and its sub-agents; their blocks become ordinary.

        ``release_private``: the agent is done, so the blocks no other session ever
        held (its own turns, not a shared system prompt or a parent's context) leave
        memory at once (to disk when there is one) instead of ageing out there.
        """
        self._store._close_session(self, release_private)

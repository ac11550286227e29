"""The run journal: the shared append-only journal (`agentinfra._journal`), raising `HarnessError`."""

from __future__ import annotations

from agentinfra._journal import JOURNAL_SCHEMA_VERSION, Event
from agentinfra._journal import Journal as _Journal
from agentinfra.errors import HarnessError

__all__ = ["JOURNAL_SCHEMA_VERSION", "Event", "Journal"]


class Journal(_Journal):
    """A run's journal; every failure is a `HarnessError`."""

    error_class = HarnessError

"""Progress of long gradings (replay, regrade, re-measure): a value the CLI draws."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["OnProgress", "Progress", "ProgressTracker"]


@dataclass(frozen=True, slots=True)
class Progress:
    """``done`` of ``total`` submissions graded; ``current`` is the one that just started or ended (``event``)."""

    phase: str
    event: Literal["started", "finished"]
    done: int
    total: int
    current: str | None
    elapsed_s: float


OnProgress = Callable[[Progress], None]


@dataclass
class ProgressTracker:
    """Counts one phase's gradings and reports each start and end to ``callback``."""

    phase: str
    total: int
    callback: OnProgress | None
    done: int = 0
    started: float = field(default_factory=time.monotonic)

    def _emit(self, event: Literal["started", "finished"], current: str | None) -> None:
        if self.callback is not None:
            elapsed = time.monotonic() - self.started
            self.callback(Progress(self.phase, event, self.done, self.total, current, elapsed))

    def begin(self, current: str) -> None:
        self._emit("started", current)

    def finish(self, current: str) -> None:
        self.done += 1
        self._emit("finished", current)

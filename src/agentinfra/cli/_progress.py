"""Progress of long gradings on stderr: a live bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.progress import (
    Progress as Bar,
)

from agentinfra.harness import OnProgress, Progress

__all__ = ["plain_line", "progress_view"]


def plain_line(progress: Progress) -> str:
    """One line per finished grading, for logs and pipes."""
    minutes, seconds = divmod(int(progress.elapsed_s), 60)
    current = f"; last {progress.current[:12]}" if progress.current else ""
    return f"{progress.phase}: {progress.done}/{progress.total} graded{current}; {minutes}:{seconds:02d} elapsed"


@contextlib.contextmanager
def progress_view(console: Console) -> Iterator[OnProgress]:
    """A callback that shows each phase's gradings: done of total, the current one, elapsed time."""
    if not console.is_terminal:
        announced: set[str] = set()

        def plain(progress: Progress) -> None:
            if progress.phase not in announced:
                announced.add(progress.phase)
                console.print(
                    f"{progress.phase}: grading {progress.total} submission(s)", highlight=False
                )
            if progress.event == "finished":
                console.print(plain_line(progress), highlight=False, soft_wrap=True)

        yield plain
        return
    columns = (
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[current]}"), TimeElapsedColumn(),
    )  # fmt: skip
    with Bar(*columns, console=console) as bar:
        tasks: dict[str, TaskID] = {}

        def live(progress: Progress) -> None:
            if progress.phase not in tasks:
                tasks[progress.phase] = bar.add_task(
                    progress.phase, total=progress.total, current=""
                )
            current = f"{progress.event} {progress.current[:12]}" if progress.current else ""
            bar.update(tasks[progress.phase], completed=progress.done, current=current)

        yield live

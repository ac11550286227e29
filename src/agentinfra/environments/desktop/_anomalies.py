"""Anomalies of desktop agent runs, read after the fact from each episode's action journal.

Every check reads only trusted files: the run's verdicts (as the harness hands
them over in a `RunView`), the action journal the desktop agent wrote beside
the episode (``workspace/episode/actions.jsonl``: each action, with the hashes
of the graded files after it), the task, and optionally the task audit
(``agentinfra desktop audit --json``). The grader's own findings
(``gui_only_bypass``, ``success_without_action``, ``replay_mismatch``) are in
the verdicts already; these are the checks that need a whole episode or
several runs:

- ``success_after_fail``: the episode ended with FAIL on a feasible task, and
  that final state passed. The agent gave up on a task that was already done,
  or the grader passes a state nobody produced.
- ``one_step_write``: a graded file absent after setup appears in its final
  form in one step whose action types a shell command or runs code (a file
  written directly, not through the application). A heuristic, stated as one:
  saving through a dialog is a key press or a click and is not flagged, nor is
  a shell command in a task whose ``related_apps`` include the terminal.
- ``identical_actions``: two runs of different tasks executed the same action
  sequence (at least `MIN_SEQUENCE` actions besides screenshots and waits): a
  policy that does not look at the screen.
- ``do_nothing_passes``: the run passed a task whose do-nothing episode also
  scores above 0 in the audit; this success is no evidence of skill.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentinfra.environments import Anomaly, RunView
from agentinfra.environments.desktop._agent import executed_actions, read_actions
from agentinfra.environments.desktop._task import DesktopTask, load_desktop_task
from agentinfra.errors import AgentInfraError

__all__ = ["MIN_SEQUENCE", "desktop_anomalies"]

MIN_SEQUENCE = 3
_SHELL = re.compile(r">|\btee\b|\bcp\b|\bmv\b|\bprintf\b|\becho\b|\bcat\b|\bpython3?\b|\bdd\b")
_IDLE = ({"action": "screenshot"}, "WAIT", {"action_type": "WAIT"})


def _typed(action: Any) -> str:
    """What an action types or runs, as text ('' for pointer actions and key presses)."""
    if isinstance(action, str):
        return action
    if isinstance(action, dict):
        if action.get("action") == "type":
            return str(action.get("text", ""))
        if action.get("action_type") == "TYPING":
            return str((action.get("parameters") or {}).get("text", ""))
    return ""


def _writes_directly(
    entry: dict[str, Any], before: dict[str, Any] | None, track: str, terminal_task: bool
) -> bool:
    for candidate in (entry, before):
        if candidate is None:
            continue
        action = candidate.get("action")
        if isinstance(action, str) and track == "code" and action not in ("WAIT", "DONE", "FAIL"):
            return True
        if not terminal_task and _SHELL.search(_typed(action)):
            return True
    return False


def _one_step_writes(
    run: RunView, task: DesktopTask, entries: list[dict[str, Any]], track: str
) -> list[Anomaly]:
    setup = next((e for e in entries if e.get("setup")), None)
    executed = [e for e in executed_actions(entries) if isinstance(e.get("files"), dict)]
    if setup is None or not executed:
        return []
    found = []
    terminal_task = "terminal" in (task.raw.get("related_apps") or [])
    for path in task.graded_files():
        if setup["files"].get(path) is not None:
            continue
        final = executed[-1]["files"].get(path)
        for index, entry in enumerate(executed):
            sha = entry["files"].get(path)
            if sha is None:
                continue
            before = executed[index - 1] if index else None
            if sha == final and _writes_directly(entry, before, track, terminal_task):
                found.append(Anomaly(str(run.path), "one_step_write",
                                     f"{path} did not exist after setup and appeared in its final form at step "
                                     f"{entry.get('step')} by a typed command or code, not through an application",
                                     entry.get("step"), entry.get("turn")))  # fmt: skip
            break
    return found


def _signature(entries: list[dict[str, Any]]) -> str | None:
    actions = [e.get("action") for e in executed_actions(entries)]
    actions = [a for a in actions if a not in _IDLE]
    if len(actions) < MIN_SEQUENCE:
        return None
    return json.dumps(actions, sort_keys=True)


def _audit_rows(audit: Path | None) -> dict[str, dict[str, Any]]:
    if audit is None:
        return {}
    rows: dict[str, dict[str, Any]] = {}
    try:
        lines = audit.read_text().splitlines()
    except OSError as exc:
        raise AgentInfraError(f"cannot read the audit {audit}: {exc.strerror} (--audit)") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows[str(Path(row["path"]).resolve())] = row
        except (ValueError, KeyError, TypeError):
            raise AgentInfraError(
                f"{audit}:{number} is not a line of `agentinfra desktop audit --json` (--audit)"
            ) from None
    return rows


def desktop_anomalies(runs: Sequence[RunView], audit: Path | None = None) -> list[Anomaly]:
    """Every anomaly of ``runs`` (see the module docstring), in run order."""
    audit_rows = _audit_rows(audit)
    found: list[Anomaly] = []
    by_signature: dict[str, list[tuple[RunView, str, dict[str, Any]]]] = defaultdict(list)
    for run in runs:
        try:
            task = load_desktop_task(run.task)
        except AgentInfraError as exc:
            found.append(
                Anomaly(
                    str(run.path),
                    "task_unreadable",
                    f"the run's task {run.task} no longer loads: {exc}",
                )
            )
            continue
        entries = read_actions(run.workspace / "episode")
        track = str(run.options.get("track", "gui-only"))
        final = run.submissions[-1] if run.submissions else {}
        last = next((e for e in reversed(entries) if e.get("action") in ("DONE", "FAIL")), None)
        if (
            last is not None
            and last["action"] == "FAIL"
            and not task.infeasible
            and final.get("source") == "agent:final-fail.tar"
            and final.get("outcome") == "passed"
            and (final.get("score") or 0) > 0
        ):
            found.append(Anomaly(str(run.path), "success_after_fail",
                                 "the agent ended with FAIL on a feasible task, and that final state passed",
                                 last.get("step"), last.get("turn")))  # fmt: skip
        if run.passed:
            found += _one_step_writes(run, task, entries, track)
            row = audit_rows.get(str(task.path.resolve()))
            if row is not None and (row.get("do_nothing_score") or 0) > 0:
                found.append(Anomaly(str(run.path), "do_nothing_passes",
                                     f"a do-nothing episode of task {task.id} scores {row['do_nothing_score']:g} "
                                     "in the audit: this success is no evidence"))  # fmt: skip
        signature = _signature(entries)
        if signature is not None:
            first = executed_actions(entries)[0]
            by_signature[signature].append((run, task.id, first))
    for group in by_signature.values():
        tasks = {task_id for _, task_id, _ in group}
        if len(tasks) < 2:
            continue
        for run, task_id, first in group:
            others = sorted(tasks - {task_id})
            found.append(Anomaly(str(run.path), "identical_actions",
                                 f"the same {MIN_SEQUENCE}+ action sequence as the run(s) of task(s) "
                                 f"{', '.join(others)}: a policy that ignores the screen",
                                 first.get("step"), first.get("turn")))  # fmt: skip
    return found

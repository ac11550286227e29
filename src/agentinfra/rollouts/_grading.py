"""`GradeDesk`: ``POST /v1/grade``'s work: one submission graded in isolation, once per key.

The key (`grade_key`) is SHA-256 over the environment's name, the task's and the
submission's hashes and the submission's name. A key is graded once: a repeat while it
is being graded waits for that grading (`GradeLedger`), a repeat afterwards gets the
answer kept in memory or, after a restart, the one stored in ``<folder>/<key>.json``
(written atomically before the first answer is sent). At most ``max_in_flight`` distinct
gradings are accepted at once; the next gets None (the service answers 429). An accepted
grading takes its cores from ``slots``, the pool it shares with the service's rollouts,
and waits for them.

A grading that raises or outlasts ``timeout_s`` once it has its cores is an infra failure (``grader_error``),
never the submission's 0, and is not remembered (a repeat grades again). Hidden seeds are
fresh from the OS for each grading, as in a run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentinfra._atomic import write_atomic
from agentinfra._settings import Settings
from agentinfra.environments import Environment, Outcome, Submission, environment_definition
from agentinfra.errors import ConfigError
from agentinfra.rollouts._book import GradeLedger
from agentinfra.rollouts._slots import GradingSlots, grading_cost

__all__ = ["GradeDesk", "grade_key"]


def grade_key(environment: str, task: bytes, name: str, submission: bytes) -> str:
    """The idempotency key of a grading: SHA-256 over the environment, the task's and the submission's hashes."""
    digest = hashlib.sha256()
    for part in (environment.encode(), hashlib.sha256(task).digest(), name.encode(),
                 hashlib.sha256(submission).digest()):  # fmt: skip
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:1000]


class GradeDesk:
    """Grades submissions for trainers that run their own loop; idempotent and bounded."""

    def __init__(
        self,
        folder: Path,
        settings: Settings,
        *,
        max_in_flight: int,
        timeout_s: float,
        slots: GradingSlots | None = None,
        observe: Callable[[float], None] = lambda _: None,
    ) -> None:
        self.folder = folder
        self.slots = slots or GradingSlots()
        self.settings = settings
        self.timeout_s = timeout_s
        self.ledger = GradeLedger(max_in_flight)
        self._observe = observe
        self._done: dict[str, asyncio.Event] = {}
        self._environments: dict[tuple[str, str], Environment] = {}

    async def grade(
        self, environment_name: str, task_path: str, name: str, data: bytes
    ) -> dict[str, Any] | None:
        """The verdict (``graded``: whether this call graded it), or None when too many run at once.

        Raises:
            ConfigError: an unknown environment, or a task that is missing or does not load.
        """
        environment = await self._environment(environment_name, task_path)
        key = grade_key(environment_name, environment.task.data, name, data)
        stored = await asyncio.to_thread(self._stored, key)
        if stored is not None:
            return {**stored, "graded": False}
        while True:
            claim = self.ledger.claim(key)
            if claim.kind == "done":
                assert claim.answer is not None
                return {**claim.answer, "graded": False}
            if claim.kind == "full":
                return None
            if claim.kind == "new":
                break
            await self._done.setdefault(key, asyncio.Event()).wait()
        self._done.setdefault(key, asyncio.Event())
        answer: dict[str, Any] | None = None
        try:
            answer = await self._evaluate(environment, key, Submission(data=data, name=name))
            if answer["infra_failure"] is None:
                data_out = json.dumps(answer).encode()
                await asyncio.to_thread(write_atomic, self.folder / f"{key}.json", data_out)
        finally:
            self.ledger.settle(key, answer if answer and answer["infra_failure"] is None else None)
            self._done.pop(key).set()
        return {**answer, "graded": True}

    def _stored(self, key: str) -> dict[str, Any] | None:
        path = self.folder / f"{key}.json"
        if not path.is_file():
            return None
        answer: dict[str, Any] = json.loads(path.read_bytes())
        return answer

    async def _environment(self, name: str, task_path: str) -> Environment:
        opened = self._environments.get((name, task_path))
        if opened is not None:
            return opened
        definition = environment_definition(name)
        if not Path(task_path).is_file():
            raise ConfigError(f"no task file at {task_path} (task)")
        task = await asyncio.to_thread(definition.load_task, Path(task_path))
        environment = definition.open(task, definition.new_settings(self.settings))
        self._environments[(name, task_path)] = environment
        return environment

    async def _evaluate(
        self, environment: Environment, key: str, submission: Submission
    ) -> dict[str, Any]:
        started = time.monotonic()
        infra: dict[str, str] | None = None
        try:
            async with self.slots.hold(grading_cost(environment.settings)):
                evaluation = await asyncio.wait_for(
                    environment.evaluate(submission), self.timeout_s
                )
        except TimeoutError:
            infra = {
                "kind": "grader_error",
                "message": f"grading took more than {self.timeout_s} s",
            }
            evaluation = None
        except Exception as exc:  # a grader crash is an infra failure, never the submission's 0
            infra = {"kind": "grader_error", "message": _one_line(f"{type(exc).__name__}: {exc}")}
            evaluation = None
        elapsed = time.monotonic() - started
        self._observe(elapsed)
        if evaluation is None:
            return {"key": key, "outcome": Outcome.GRADER_ERROR.value, "score": None, "correct": False,
                    "hack_flagged": False, "findings": [], "infra_failure": infra, "grading_s": elapsed}  # fmt: skip
        if evaluation.outcome is Outcome.GRADER_ERROR:
            infra = {
                "kind": "grader_error",
                "message": _one_line(evaluation.error or "grader error"),
            }
        return {
            "key": key, "outcome": evaluation.outcome.value, "score": evaluation.score,
            "score_unit": evaluation.score_unit, "correct": evaluation.correct,
            "hack_flagged": evaluation.is_hack,
            "findings": [f.model_dump(mode="json") for f in evaluation.findings],
            "infra_failure": infra, "grading_s": elapsed,
        }  # fmt: skip

"""The environment registry: built-ins by name, registered definitions, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentinfra.environments import (
    ENTRY_POINT_GROUP,
    EnvironmentDefinition,
    Evaluation,
    Outcome,
    ScoreSpec,
    Submission,
    Task,
    environment_definition,
    environment_names,
    register_environment,
)
from agentinfra.errors import ConfigError
from agentinfra.harness import RunSpec, open_environment

ROOT = Path(__file__).resolve().parents[3]


def test_kernels_is_registered_and_loads_its_task() -> None:
    definition = environment_definition("kernels")
    assert definition.score.unit == "speedup"
    assert "kernels" in environment_names()
    spec = RunSpec(run_id="r", task=str(ROOT / "examples/kernels/problems/11_slow_cumsum.py"))
    environment = open_environment(spec)
    assert environment.name == "kernels"
    assert environment.task.name == "11_slow_cumsum.py"
    assert (
        environment.task.data == (ROOT / "examples/kernels/problems/11_slow_cumsum.py").read_bytes()
    )


def test_kernels_is_declared_as_an_entry_point() -> None:
    from importlib.metadata import entry_points

    names = {p.name: p.value for p in entry_points(group=ENTRY_POINT_GROUP)}
    assert names.get("kernels") == "agentinfra.environments.kernels:ENVIRONMENT"


def test_unknown_name_lists_what_exists() -> None:
    with pytest.raises(ConfigError, match=r"unknown environment 'desk'; available: .*kernels"):
        environment_definition("desk")


def test_a_bad_task_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist or is not a file"):
        environment_definition("kernels").load_task(tmp_path / "missing.py")


def test_register_a_new_environment() -> None:
    class Echo:
        name = "echo-test"
        grader_version = "e-1"
        score = ScoreSpec(unit="success")

        def __init__(self, task: Task, settings: object) -> None:
            self.task, self.settings = task, settings

        async def evaluate(self, submission: Submission, *, seed: int | None = None) -> Evaluation:
            ok = submission.data == self.task.data
            return Evaluation(environment=self.name, outcome=Outcome.PASSED if ok else Outcome.FAILED,
                              correct=ok, score=float(ok), score_unit="success")  # fmt: skip

    definition = EnvironmentDefinition(
        name="echo-test", description="echo", grader_version="e-1", score=Echo.score,
        load_task=lambda path: Task(path.name, path.read_bytes()), create=Echo,  # type: ignore[arg-type]
    )  # fmt: skip
    register_environment(definition)
    assert environment_definition("echo-test") is definition
    assert "echo-test" in environment_names()
    with pytest.raises(ConfigError, match="already registered"):
        register_environment(definition)
    register_environment(definition, replace=True)


def test_submission_and_task_are_content_addressed() -> None:
    assert Submission(b"x").sha256 == Task("t", b"x").sha256
    assert Submission(b"x", name="a.py").sha256 == Submission(b"x", name="b.py").sha256


def test_old_kernel_verdicts_read_as_evaluations() -> None:
    old = {"schema_version": 1, "outcome": "passed", "correct": True, "speedup": 2.5, "speedup_ci": [2.0, 3.0],
           "findings": [], "provenance": {"sandbox": "namespaces"}, "candidate_ms": 1.0}  # fmt: skip
    evaluation = Evaluation.from_json(old)
    assert (evaluation.score, evaluation.score_unit, evaluation.score_ci) == (
        2.5,
        "speedup",
        (2.0, 3.0),
    )
    assert evaluation.details["candidate_ms"] == 1.0
    assert Evaluation.from_json(evaluation.to_json()) == evaluation

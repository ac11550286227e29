"""Each compatibility reader in `agentinfra.harness._migrations`, on what an older agentinfra wrote."""

from __future__ import annotations

import json
from pathlib import Path

from agentinfra.environments import Evaluation
from agentinfra.environments.kernels import KernelSettings
from agentinfra.harness import RunDirectory, RunSpec, load_recording
from agentinfra.harness._migrations import read_evaluation, recording_environment, run_spec

OLD_GRADER = {"threads": 2, "timeout_s": 60.0, "timing_pairs": 9, "correctness_seeds": 3,
              "memory_limit_bytes": 1 << 30, "max_processes": 32, "device": "cpu", "fork_server": False}  # fmt: skip


def test_a_schema_1_kernels_spec_keeps_its_grader_settings_as_its_own() -> None:
    old = {"schema_version": 1, "run_id": "r", "environment": "kernels", "task": "/t.py",
           "agent": {}, "budget": {"wall_hours": 2.0}, "grader": OLD_GRADER, "seed": 7}  # fmt: skip
    assert run_spec(old) == {"run_id": "r", "environment": "kernels", "task": "/t.py", "agent": {},
                             "budget": {"wall_hours": 2.0}, "schema_version": 2, "settings": OLD_GRADER}  # fmt: skip
    spec = RunSpec.model_validate(old)
    assert (spec.schema_version, spec.environment) == (2, "kernels")
    assert KernelSettings.model_validate(spec.settings) == KernelSettings(**OLD_GRADER)


def test_a_schema_1_spec_of_another_environment_starts_from_its_defaults() -> None:
    old = {"schema_version": 1, "run_id": "r", "environment": "desktop", "task": "/t.json",
           "grader": OLD_GRADER}  # fmt: skip
    assert run_spec(old)["settings"] == {}
    assert RunSpec.model_validate(old).settings == {}


def test_a_schema_1_spec_without_environment_was_of_kernels() -> None:
    assert run_spec({"schema_version": 1, "run_id": "r", "task": "/t.py"}) == {
        "run_id": "r", "task": "/t.py", "schema_version": 2, "environment": "kernels", "settings": {},
    }  # fmt: skip


def test_a_current_spec_passes_unchanged() -> None:
    current = {
        "schema_version": 2,
        "run_id": "r",
        "environment": "x",
        "task": "/t",
        "settings": {"a": 1},
    }
    assert run_spec(current) is current
    built = {"run_id": "r", "environment": "x", "task": "/t"}  # no schema_version: built in code
    assert run_spec(built) is built


def test_an_old_run_json_opens(tmp_path: Path) -> None:
    task = tmp_path / "task.py"
    task.write_text("x = 1\n")
    run = RunDirectory.create(tmp_path / "run", RunSpec(run_id="r", environment="kernels", task=str(task)),
                              grader_version="g-1")  # fmt: skip
    run.close()
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    info["spec"] = {"schema_version": 1, "run_id": "r", "environment": "kernels", "task": str(task),
                    "agent": {}, "budget": {"wall_hours": 12.0}, "grader": OLD_GRADER}  # fmt: skip
    (tmp_path / "run" / "run.json").write_text(json.dumps(info))
    reopened = RunDirectory.open(tmp_path / "run")
    try:
        assert reopened.spec.settings == OLD_GRADER
        assert reopened.spec.schema_version == 2
    finally:
        reopened.close()


def test_a_recording_without_environment_was_of_kernels(tmp_path: Path) -> None:
    assert recording_environment({"schema_version": 1}) == "kernels"
    assert recording_environment({"schema_version": 1, "environment": "desktop"}) == "desktop"
    (tmp_path / "recording.json").write_text(
        json.dumps({"schema_version": 1, "task": "t.py", "submissions": []})
    )
    assert load_recording(tmp_path)["environment"] == "kernels"


def test_a_schema_1_kernel_verdict_reads_as_an_evaluation() -> None:
    old = {"schema_version": 1, "outcome": "passed", "correct": True, "speedup": 2.5, "speedup_ci": [2.0, 3.0],
           "findings": [], "provenance": {"sandbox": "namespaces"}, "candidate_ms": 1.0}  # fmt: skip
    evaluation = read_evaluation(old, environment="kernels")
    assert (evaluation.environment, evaluation.score, evaluation.score_unit, evaluation.score_ci) == (
        "kernels", 2.5, "speedup", (2.0, 3.0),
    )  # fmt: skip
    assert evaluation.details == {"candidate_ms": 1.0, "speedup": 2.5}
    assert evaluation.provenance == {"sandbox": "namespaces"}
    assert read_evaluation(evaluation.to_json(), environment="other") == evaluation
    assert Evaluation.from_json(evaluation.to_json()) == evaluation

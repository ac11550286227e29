"""The environment registry: built-ins by name, registered definitions, clear errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from agentinfra._settings import load_settings
from agentinfra.environments import (
    ENTRY_POINT_GROUP,
    EnvironmentDefinition,
    Evaluation,
    NoSettings,
    Outcome,
    ScoreSpec,
    Submission,
    Task,
    environment_definition,
    environment_names,
    register_environment,
    unregister_environment,
)
from agentinfra.environments.kernels import KernelSettings
from agentinfra.errors import ConfigError
from agentinfra.harness import RunSpec, open_environment

ROOT = Path(__file__).resolve().parents[3]


def test_kernels_is_registered_and_loads_its_task() -> None:
    definition = environment_definition("kernels")
    assert definition.score.unit == "speedup"
    assert "kernels" in environment_names()
    spec = RunSpec(
        run_id="r",
        environment="kernels",
        task=str(ROOT / "examples/kernels/problems/11_slow_cumsum.py"),
        settings={"timing_pairs": 7},
    )
    environment = open_environment(spec)
    assert environment.name == "kernels"
    assert environment.settings == KernelSettings(timing_pairs=7)
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


class EchoSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    repeats: int = Field(default=1, ge=1)


class EchoOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    loud: bool = False


class Echo:
    name = "echo-test"
    grader_version = "e-1"
    score = ScoreSpec(unit="success")

    def __init__(self, task: Task, settings: EchoSettings) -> None:
        self.task, self.settings = task, settings

    async def evaluate(self, submission: Submission, *, seed: int | None = None) -> Evaluation:
        ok = submission.data == self.task.data * self.settings.repeats
        return Evaluation(environment=self.name, outcome=Outcome.PASSED if ok else Outcome.FAILED,
                          correct=ok, score=float(ok), score_unit="success")  # fmt: skip


def echo_definition() -> EnvironmentDefinition[EchoSettings]:
    return EnvironmentDefinition(
        name="echo-test", description="echo", grader_version="e-1", score=Echo.score,
        load_task=lambda path: Task(path.name, path.read_bytes()), settings=EchoSettings,
        create=Echo, agent_options=EchoOptions,  # type: ignore[arg-type]
        strict_settings=lambda s: s.model_copy(update={"repeats": s.repeats * 3}),
    )  # fmt: skip


@pytest.fixture
def echo() -> Iterator[EnvironmentDefinition[EchoSettings]]:
    definition = echo_definition()
    register_environment(definition)
    yield definition
    unregister_environment(definition.name)


def test_register_a_new_environment(echo: EnvironmentDefinition[EchoSettings]) -> None:
    assert environment_definition("echo-test") is echo
    assert "echo-test" in environment_names()
    with pytest.raises(ConfigError, match="already registered"):
        register_environment(echo)
    register_environment(echo, replace=True)
    assert environment_definition("echo-test") is echo


def test_unregister_leaves_no_trace() -> None:
    register_environment(echo_definition())
    unregister_environment("echo-test")
    assert "echo-test" not in environment_names()
    with pytest.raises(ConfigError, match="unknown environment 'echo-test'"):
        environment_definition("echo-test")
    unregister_environment("echo-test")  # nothing registered: nothing happens


def test_a_definition_validates_its_own_settings_and_options(
    echo: EnvironmentDefinition[EchoSettings],
) -> None:
    environment = echo.open(Task("t", b"ab"), {"repeats": 2})
    assert environment.settings == EchoSettings(repeats=2)
    assert echo.settings_of(EchoSettings(repeats=3)) == EchoSettings(repeats=3)
    assert echo.new_settings(load_settings({})) == EchoSettings()
    assert echo.strict_settings is not None
    assert echo.strict_settings(EchoSettings(repeats=2)) == EchoSettings(repeats=6)
    assert echo.options_of({"loud": "true"}) == {"loud": True}
    assert echo.options_of({}) == {}
    with pytest.raises(ConfigError) as bad_value:
        echo.settings_of({"repeats": 0})
    assert str(bad_value.value) == (
        "echo-test setting: repeats=0: Input should be greater than or equal to 1 (run.json spec.settings)"
    )
    with pytest.raises(ConfigError) as unknown:
        echo.options_of({"quiet": "1"})
    assert (
        str(unknown.value) == "echo-test agent option: unknown 'quiet'; known: loud (--env-option)"
    )


def test_builtin_settings_and_options_models() -> None:
    kernels = environment_definition("kernels")
    desktop = environment_definition("desktop")
    assert kernels.settings is KernelSettings
    assert kernels.agent_options is NoSettings
    assert kernels.new_settings(
        load_settings({"AGENTINFRA_GRADER_THREADS": "3"})
    ) == KernelSettings(threads=3)
    assert kernels.strict_settings is not None
    assert kernels.quick_settings is not None
    assert kernels.strict_settings(KernelSettings(timing_pairs=6, correctness_seeds=3)) == (
        KernelSettings(timing_pairs=12, correctness_seeds=6)
    )
    assert kernels.quick_settings(KernelSettings()) == KernelSettings(timing_pairs=8)
    assert desktop.strict_settings is None
    assert desktop.quick_settings is None
    assert desktop.new_settings(
        load_settings({"AGENTINFRA_DESKTOP_MIRROR": "/m"})
    ).model_dump() == {"mirror": "/m"}
    assert desktop.options_of({"screenshot_width": "800", "track": "code"}) == {
        "screenshot_width": 800,
        "track": "code",
    }
    with pytest.raises(ConfigError) as bad:
        desktop.options_of({"observation": "smell"})
    assert str(bad.value) == (
        "unknown observation 'smell'; use one of screenshot, a11y, both (--observation)"
    )
    with pytest.raises(ConfigError) as none:
        kernels.options_of({"track": "code"})
    assert str(none.value) == "kernels agent option: unknown 'track'; known: none (--env-option)"


def test_submission_and_task_are_content_addressed() -> None:
    assert Submission(b"x").sha256 == Task("t", b"x").sha256
    assert Submission(b"x", name="a.py").sha256 == Submission(b"x", name="b.py").sha256

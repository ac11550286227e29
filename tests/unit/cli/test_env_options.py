"""`agentinfra run`'s environment options: ``--env-option KEY=VALUE`` and the named flags, checked by
the environment's own agent-options model, with no branch on the environment's name."""

from __future__ import annotations

import pytest

from agentinfra.cli._agent import _agent_options
from agentinfra.environments import environment_definition
from agentinfra.errors import ConfigError

NO_FLAGS = {"action_space": None, "track": None, "observation": None, "screenshot_width": None,
            "desktops": None}  # fmt: skip


def test_pairs_and_flags_become_the_models_options() -> None:
    desktop = environment_definition("desktop")
    flags = NO_FLAGS | {"observation": "a11y", "desktops": 3}
    options = _agent_options(
        desktop, flags, ["track=code", "screenshot-width=800", "a11y_tokens=900"]
    )
    assert options == {"track": "code", "screenshot_width": 800, "a11y_tokens": 900,
                       "observation": "a11y", "desktops": 3}  # fmt: skip
    assert _agent_options(desktop, NO_FLAGS, []) == {}
    assert _agent_options(environment_definition("kernels"), NO_FLAGS, []) == {}


@pytest.mark.parametrize(
    ("env", "flags", "pairs", "message"),
    [
        ("kernels", {"action_space": "computer_use"}, [],
         "--action-space is a desktop option; this run's --env is kernels"),
        ("kernels", {}, ["track=code"], "kernels agent option: unknown 'track'; known: none (--env-option)"),
        ("desktop", {}, ["track"], "--env-option 'track' must be KEY=VALUE, e.g. --env-option track=code"),
        ("desktop", {}, ["=code"], "--env-option '=code' must be KEY=VALUE, e.g. --env-option track=code"),
        ("desktop", {}, ["screenshot_width=wide"],
         "desktop agent option: screenshot_width='wide': Input should be a valid integer, unable to parse "
         "string as an integer (--env-option)"),
        ("desktop", {}, ["colour=red"],
         "desktop agent option: unknown 'colour'; known: action_space, track, observation, screenshot_width, "
         "coordinates, a11y_tokens, desktops, width, height (--env-option)"),
        ("desktop", {"observation": "smell"}, [],
         "unknown observation 'smell'; use one of screenshot, a11y, both (--observation)"),
    ],
)  # fmt: skip
def test_bad_options_are_one_line_errors_naming_the_value_and_the_knob(
    env: str, flags: dict[str, object], pairs: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        _agent_options(environment_definition(env), NO_FLAGS | flags, pairs)
    assert str(error.value) == message


def test_regrade_strict_applies_the_environments_rule(capsys: pytest.CaptureFixture[str]) -> None:
    from agentinfra.cli._runs import _strict_settings
    from agentinfra.harness import RunSpec

    kernels = RunSpec(run_id="r", environment="kernels", task="/t.py", settings={"timing_pairs": 7})
    strict = _strict_settings(kernels)
    assert (strict["timing_pairs"], strict["correctness_seeds"]) == (14, 4)
    desktop = RunSpec(run_id="r", environment="desktop", task="/t.json", settings={"mirror": "/m"})
    assert _strict_settings(desktop) == {"mirror": "/m"}
    assert "desktop has no stricter grading; regrading as the run was graded" in " ".join(
        capsys.readouterr().err.split()
    )

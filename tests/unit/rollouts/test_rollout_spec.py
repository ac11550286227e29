"""Groups: ids, the shared hidden seed, the wire model's checks and round trip."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentinfra.errors import AgentError, ConfigError, HarnessError, SandboxError
from agentinfra.rollouts import Group, GroupRequest, grade_key, infra_failure_of, new_group


def _request(**fields: object) -> GroupRequest:
    base: dict[str, object] = {"environment": "kernels", "task": "/t.py", "group_size": 4,
                               "model": "m", "base_url": "http://127.0.0.1:1/v1"}  # fmt: skip
    return GroupRequest.model_validate({**base, **fields})


def test_a_group_has_g_rollouts_one_seed_and_round_trips() -> None:
    group = new_group(_request(policy_version="v7"))
    assert group.rollout_ids == tuple(f"{group.group_id}-{i}" for i in range(4))
    again = Group.from_json(group.to_json())
    assert again == group
    assert new_group(_request()).seed != group.seed  # drawn from the OS each time
    probed = new_group(_request(), capture_tokens=True)
    assert Group.from_json(probed.to_json()).capture_tokens is True
    assert _request(policy_version="v7").loop_config(capture_tokens=True).capture_tokens is True
    assert _request(policy_version="v7").loop_config().policy_version == "v7"


@pytest.mark.parametrize(
    ("fields", "where"),
    [({"group_size": 0}, "group_size"), ({"model": ""}, "model"), ({"extra": 1}, "extra")],
)
def test_bad_requests_are_refused(fields: dict[str, object], where: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _request(**fields)
    assert caught.value.errors()[0]["loc"][0] == where


def test_the_loop_config_carries_the_budgets() -> None:
    config = _request(max_turns=3, stream=False, kv_session=True).loop_config()
    assert (config.max_turns, config.stream, config.kv_session) == (3, False, True)
    with pytest.raises(ConfigError, match="base_url"):
        _request(base_url="ftp://x").loop_config()


def test_grade_keys_change_with_every_part() -> None:
    key = grade_key("kernels", b"task", "solution.py", b"code")
    assert key == grade_key("kernels", b"task", "solution.py", b"code")
    others = {grade_key("desktop", b"task", "solution.py", b"code"),
              grade_key("kernels", b"task2", "solution.py", b"code"),
              grade_key("kernels", b"task", "other.py", b"code"),
              grade_key("kernels", b"task", "solution.py", b"code2")}  # fmt: skip
    assert key not in others
    assert len(others) == 4


def test_infra_failures_are_labelled_by_kind() -> None:
    assert (
        infra_failure_of(AgentError("model call failed after 6 attempts"))["kind"] == "model_error"
    )
    assert infra_failure_of(SandboxError("jail died"))["kind"] == "environment_died"
    assert infra_failure_of(HarnessError("disk full"))["kind"] == "internal"

"""`agentinfra.trainers.slime`: recorded trajectories in, slime `Sample`s out, every field checked.

slime is not on PyPI (the ``slime`` there is another project), so its types are mirrored
here field for field from THUDM/slime at commit 624b824a898ab0ec1fcb4d373004c7f3852bf515:
`Sample` from ``slime/utils/types.py``, `DynamicFilterOutput` from
``slime/rollout/filter_hub/base_types.py``, and the length rules of
``Sample._validate_response_metadata_lengths`` and of ``slime/ray/rollout.py`` (a loss mask
per response token). The mirror is installed as the ``slime`` modules the adapter imports.

The trajectories are real (tests/fixtures/trajectories/README.md): SmolLM2-135M-Instruct in
vLLM through ``agentinfra rollouts run`` and the rollout service.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import sys
import types
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from agentinfra.errors import ConfigError, RolloutError
from agentinfra.trainers import slime as adapter

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "trajectories"


def load(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line]


# --- the mirror of slime's types (slime/utils/types.py @ 624b824a) ---------------------------
# Annotations are slime's text exactly (checked with ast against that file when this was written).

torch = types.SimpleNamespace(Tensor=list)  # slime's tensors; annotations only


@dataclass
class SpecInfo:
    spec_accept_token_num: int = 0
    spec_draft_token_num: int = 0
    spec_verify_ct: int = 0
    completion_token_num: int = 0


@dataclass
class PrefixCacheInfo:
    cached_tokens: int = 0
    total_prompt_tokens: int = 0


@dataclass
class Sample:
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | torch.Tensor | None = None
    rollout_top_p_token_offsets: list[int] | torch.Tensor | None = None
    rollout_routed_experts: list[list[int]] | torch.Tensor | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0
    spec_info: SpecInfo = field(default_factory=SpecInfo)
    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)


SLIME_SAMPLE_FIELDS = [
    "group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs",
    "multimodal_train_inputs", "multimodal_train_input_id", "apply_chat_template_kwargs",
    "response", "response_length", "label", "reward", "loss_mask", "weight_versions",
    "rollout_log_probs", "rollout_top_p_token_ids", "rollout_top_p_token_offsets",
    "rollout_routed_experts", "remove_sample", "teacher_log_probs", "status", "metadata",
    "generate_function_path", "custom_rm_path", "train_metadata", "session_id",
    "non_generation_time", "spec_info", "prefix_cache_info",
]  # fmt: skip
"""slime's `Sample` fields in declaration order, read off slime/utils/types.py @ 624b824a."""


@dataclass
class DynamicFilterOutput:
    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False


@pytest.fixture
def slime_types(monkeypatch: pytest.MonkeyPatch) -> type[Sample]:
    """Installs the mirror as ``slime.utils.types`` and ``slime.rollout.filter_hub.base_types``."""
    modules = {name: types.ModuleType(name) for name in (
        "slime", "slime.utils", "slime.utils.types", "slime.rollout",
        "slime.rollout.filter_hub", "slime.rollout.filter_hub.base_types")}  # fmt: skip
    modules["slime.utils.types"].Sample = Sample  # type: ignore[attr-defined]
    modules["slime.rollout.filter_hub.base_types"].DynamicFilterOutput = DynamicFilterOutput  # type: ignore[attr-defined]
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return Sample


def test_the_mirror_has_slimes_fields_in_order() -> None:
    assert [f.name for f in fields(Sample)] == SLIME_SAMPLE_FIELDS
    assert [s.value for s in Sample.Status] == [
        "pending",
        "completed",
        "truncated",
        "aborted",
        "failed",
    ]


def check_sample(sample: Sample) -> None:
    """Every field as slime defines it, and the lengths slime itself checks."""
    assert isinstance(sample.tokens, list)
    assert all(type(t) is int for t in sample.tokens)
    assert type(sample.response_length) is int
    assert 0 < sample.response_length <= len(sample.tokens)
    assert isinstance(sample.loss_mask, list)
    assert set(sample.loss_mask) <= {0, 1}
    assert len(sample.loss_mask) == sample.response_length  # _validate_response_metadata_lengths
    assert isinstance(sample.rollout_log_probs, list)
    assert all(type(lp) is float for lp in sample.rollout_log_probs)
    assert len(sample.rollout_log_probs) == sample.response_length
    assert type(sample.reward) is float
    assert isinstance(sample.status, Sample.Status)
    assert sample.status is not Sample.Status.PENDING
    assert isinstance(sample.weight_versions, list)
    assert all(isinstance(v, str) for v in sample.weight_versions)
    assert type(sample.rollout_id) is int
    assert isinstance(sample.session_id, str)
    assert sample.session_id
    assert isinstance(sample.metadata, dict)
    assert type(sample.remove_sample) is bool
    assert type(sample.non_generation_time) is float
    assert sample.non_generation_time >= 0
    assert sample.rollout_top_p_token_ids is None
    assert sample.rollout_routed_experts is None


def slime_sample(index: int = 4, group_index: int = 2, **metadata: Any) -> Sample:
    return Sample(group_index=group_index, index=index, prompt="solve it",
                  metadata={"task": "/tasks/t.py", **metadata})  # fmt: skip


def engine_sampled(trajectory: dict[str, Any], calls: list[int]) -> list[int]:
    return [t for i in calls for t in trajectory["calls"][i]["completion_ids"]]


def test_a_truncated_kernels_rollout_is_one_sample_of_the_engines_tokens(
    slime_types: type[Sample],
) -> None:
    trajectory = load("kernels_truncated.jsonl")[0]
    (segment,) = trajectory["segments"]
    (out,) = adapter.samples_of(trajectory, slime_sample(), slime_types)
    check_sample(out)
    assert out.tokens == segment["token_ids"]
    start = segment["loss_mask"].index(1)
    assert out.response_length == len(segment["token_ids"]) - start
    assert out.tokens[: -out.response_length] == trajectory["calls"][0]["prompt_ids"]
    assert out.loss_mask == segment["loss_mask"][start:]
    response = out.tokens[-out.response_length :]
    assert [t for t, m in zip(response, out.loss_mask, strict=True) if m] == engine_sampled(
        trajectory, segment["calls"]
    )
    sampled_lp = [lp for lp, m in zip(out.rollout_log_probs or [], out.loss_mask, strict=True) if m]
    assert sampled_lp == [
        lp for i in segment["calls"] for lp in trajectory["calls"][i]["completion_logprobs"]
    ]
    assert all(
        lp == 0.0 for lp, m in zip(out.rollout_log_probs or [], out.loss_mask, strict=True) if not m
    )
    assert trajectory["calls"][-1]["finish_reason"] == "length"
    assert out.status is Sample.Status.TRUNCATED
    assert out.reward == trajectory["reward"] == 0.0
    assert out.rollout_id == 4
    assert out.index == 4
    assert out.group_index == 2
    assert out.prompt == "solve it"
    assert out.remove_sample is False
    assert out.weight_versions == []
    assert out.metadata["task"] == "/tasks/t.py"
    assert out.metadata["agentinfra_run_id"] == trajectory["run_id"] == out.session_id
    assert (
        out.non_generation_time == trajectory["time"]["tools_s"] + trajectory["time"]["grading_s"]
    )


def test_a_multi_segment_rollout_gives_one_sample_per_segment_sharing_rollout_id(
    slime_types: type[Sample],
) -> None:
    trajectory = next(t for t in load("desktop_rerender.jsonl") if len(t["segments"]) == 2)
    samples = adapter.samples_of(trajectory, slime_sample(index=7), slime_types)
    assert len(samples) == 2
    for out, segment in zip(samples, trajectory["segments"], strict=True):
        check_sample(out)
        assert out.tokens == segment["token_ids"]
        response = out.tokens[-out.response_length :]
        assert [
            t for t, m in zip(response, out.loss_mask or [], strict=True) if m
        ] == engine_sampled(trajectory, segment["calls"])
        assert out.rollout_id == 7
        assert out.status is Sample.Status.TRUNCATED
    assert [s.metadata["agentinfra_break_reason"] for s in samples] == [None, "template_rerender"]
    assert [s.metadata["agentinfra_segment"] for s in samples] == [0, 1]
    assert samples[0].non_generation_time == 0.0
    assert samples[1].non_generation_time > 0.0
    assert sum(s.reward for s in samples) == trajectory["reward"]  # type: ignore[misc]


def test_a_reward_is_split_over_segments_or_repeated(slime_types: type[Sample]) -> None:
    trajectory = copy.deepcopy(
        next(t for t in load("desktop_rerender.jsonl") if len(t["segments"]) == 2)
    )
    trajectory["reward"] = (
        1.0  # the recorded SmolLM2 episode earned 0; the split is what is checked
    )
    for call, version in zip(trajectory["calls"], ["v1", "v1", "v2"], strict=True):
        call["policy_version"] = version
    divided = adapter.samples_of(trajectory, slime_sample(), slime_types)
    assert [s.reward for s in divided] == [0.5, 0.5]
    assert [s.weight_versions for s in divided] == [["v1"], ["v1", "v2"]]
    repeated = adapter.samples_of(trajectory, slime_sample(), slime_types, reward_split="repeat")
    assert [s.reward for s in repeated] == [1.0, 1.0]


def test_infra_failures_are_masked_placeholders_aborted_or_failed(
    slime_types: type[Sample],
) -> None:
    by_kind = {
        t["infra_failure"]["kind"]: t for t in load("service_failures.jsonl") if t["infra_failure"]
    }
    cancelled = adapter.samples_of(by_kind["cancelled"], slime_sample(), slime_types)
    failed = adapter.samples_of(by_kind["model_error"], slime_sample(), slime_types)
    for (out,), status, kind in ((cancelled, Sample.Status.ABORTED, "cancelled"),
                                 (failed, Sample.Status.FAILED, "model_error")):  # fmt: skip
        check_sample(out)
        assert out.status is status
        assert out.remove_sample is True
        assert out.loss_mask == [0]
        assert out.reward == 0.0
        assert out.rollout_log_probs == [0.0]
        assert out.metadata["agentinfra_untrainable"] == f"infra_failure:{kind}"
        assert out.metadata["agentinfra_infra_failure"]["kind"] == kind


def test_a_trajectory_without_engine_ids_is_masked_not_retokenized(
    slime_types: type[Sample],
) -> None:
    trajectory = copy.deepcopy(load("kernels_truncated.jsonl")[0])
    trajectory.update(tokens="unavailable", segments=[])
    (out,) = adapter.samples_of(trajectory, slime_sample(), slime_types)
    assert out.status is Sample.Status.FAILED
    assert out.remove_sample is True
    assert out.metadata["agentinfra_untrainable"] == "tokens_unavailable"


def test_a_corrupt_segment_is_refused_with_its_run_id(slime_types: type[Sample]) -> None:
    trajectory = copy.deepcopy(load("kernels_truncated.jsonl")[0])
    trajectory["segments"][0]["logprobs"].pop()
    with pytest.raises(RolloutError, match=trajectory["run_id"]):
        adapter.samples_of(trajectory, slime_sample(), slime_types)


def test_the_group_filter_drops_groups_holding_a_masked_rollout(slime_types: type[Sample]) -> None:
    failures = load("service_failures.jsonl")
    group = [
        adapter.samples_of(t, slime_sample(index=i), slime_types) for i, t in enumerate(failures)
    ]
    dropped = adapter.drop_groups_with_infra_failures(None, group)
    assert isinstance(dropped, DynamicFilterOutput)
    assert dropped.keep is False
    assert dropped.reason is not None
    assert "infra_failure" in dropped.reason
    clean = [adapter.samples_of(t, slime_sample(index=i), slime_types)[0]
             for i, t in enumerate(load("kernels_truncated.jsonl"))]  # fmt: skip
    assert adapter.drop_groups_with_infra_failures(None, clean) == DynamicFilterOutput(keep=True)


# --- generate(): the function slime calls, against a fake of the service's client ---------------


class FakeService:
    """`AsyncRolloutClient`'s interface over recorded trajectories (one group per submission)."""

    def __init__(self, trajectories: list[dict[str, Any]], *, hold: bool = False) -> None:
        self.trajectories = trajectories
        self.hold = hold
        self.submitted: list[dict[str, Any]] = []
        self.cancelled: list[str] = []
        self.clients = 0

    def client(self, settings: adapter.SlimeSettings) -> FakeService:
        self.settings = settings
        self.clients += 1
        return self

    async def __aenter__(self) -> FakeService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def submit_group(
        self, request: dict[str, Any], *, retry_for_s: float = 0.0
    ) -> dict[str, Any]:
        await asyncio.sleep(0)
        self.submitted.append(request)
        gid = f"g{len(self.submitted)}"
        return {
            "group_id": gid,
            "rollout_ids": [f"{gid}-{i}" for i in range(request["group_size"])],
        }

    async def rollout(self, rollout_id: str, *, wait_s: float = 0.0) -> dict[str, Any]:
        if self.hold:
            await asyncio.sleep(wait_s)
            return {"rollout_id": rollout_id, "state": "running", "trajectory": None}
        position = int(rollout_id.rsplit("-", 1)[1])
        trajectory = dict(self.trajectories[position], run_id=rollout_id)
        return {"rollout_id": rollout_id, "state": "finished", "trajectory": trajectory}

    async def cancel(self, rollout_id: str, reason: str = "stale policy") -> dict[str, Any]:
        self.cancelled.append(rollout_id)
        return {"rollout_id": rollout_id, "state": "finished"}


def slime_args(**extra: Any) -> types.SimpleNamespace:
    values: dict[str, Any] = {
        "n_samples_per_prompt": 2, "agentinfra_url": "http://127.0.0.1:7490",
        "agentinfra_base_url": "http://127.0.0.1:8000/v1", "agentinfra_model": "smol",
        "agentinfra_request": {"max_turns": 5},
    }  # fmt: skip
    return types.SimpleNamespace(**{**values, **extra})


def test_generate_runs_a_slime_group_as_one_agentinfra_group(slime_types: type[Sample]) -> None:
    service = FakeService(load("kernels_truncated.jsonl"))
    group = [slime_sample(index=10), slime_sample(index=11)]

    async def main() -> list[list[Sample]]:
        return await asyncio.gather(*(
            adapter.generate(slime_args(), s, {"max_new_tokens": 48, "temperature": 1.0},
                             client_factory=service.client) for s in group))  # fmt: skip

    outs = asyncio.run(main())
    assert len(service.submitted) == 1
    assert service.submitted[0] == {
        "environment": "kernels", "task": "/tasks/t.py", "group_size": 2, "model": "smol",
        "base_url": "http://127.0.0.1:8000/v1", "max_turns": 5, "max_output_tokens": 48,
    }  # fmt: skip
    assert [o[0].metadata["agentinfra_run_id"] for o in outs] == ["g1-0", "g1-1"]
    assert [o[0].rollout_id for o in outs] == [10, 11]
    for (out,), trajectory in zip(outs, service.trajectories, strict=True):
        check_sample(out)
        assert out.tokens == trajectory["segments"][0]["token_ids"]
    # a later run of the same group_index (slime re-queues aborted samples) is a new group
    asyncio.run(
        adapter.generate(slime_args(), slime_sample(index=10), {}, client_factory=service.client)
    )
    assert len(service.submitted) == 2


def test_a_cancelled_generate_cancels_its_rollout(slime_types: type[Sample]) -> None:
    service = FakeService([], hold=True)

    async def main() -> None:
        task = asyncio.ensure_future(
            adapter.generate(
                slime_args(), slime_sample(group_index=None), {}, client_factory=service.client
            )
        )  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert service.submitted[0]["group_size"] == 1
    assert service.cancelled == ["g1-0"]


class _ClosingClient:
    """One client of `FakeService` that, as `AsyncRolloutClient`, fails a request in flight when closed."""

    def __init__(self, service: FakeService, gate: asyncio.Event) -> None:
        self.service, self.gate, self.closed = service, gate, False

    async def __aenter__(self) -> _ClosingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.closed = True

    async def submit_group(
        self, request: dict[str, Any], *, retry_for_s: float = 0.0
    ) -> dict[str, Any]:
        await self.gate.wait()
        if self.closed:
            raise RolloutError("the client's session was closed while submitting")
        return await self.service.submit_group(request, retry_for_s=retry_for_s)

    async def rollout(self, rollout_id: str, *, wait_s: float = 0.0) -> dict[str, Any]:
        return await self.service.rollout(rollout_id, wait_s=wait_s)

    async def cancel(self, rollout_id: str, reason: str = "stale policy") -> dict[str, Any]:
        return await self.service.cancel(rollout_id, reason)


def test_a_group_outlives_the_cancelled_sample_that_submitted_it(slime_types: type[Sample]) -> None:
    """slime cancels samples (aborts); the group's submission, which the others wait on, is not
    tied to the client of the sample that started it."""
    service = FakeService(load("kernels_truncated.jsonl"))

    async def main() -> list[Any]:
        gate = asyncio.Event()

        def factory(settings: adapter.SlimeSettings) -> _ClosingClient:
            return _ClosingClient(service, gate)

        first = asyncio.ensure_future(adapter.generate(slime_args(), slime_sample(index=10), {},
                                                       client_factory=factory))  # fmt: skip
        second = asyncio.ensure_future(adapter.generate(slime_args(), slime_sample(index=11), {},
                                                        client_factory=factory))  # fmt: skip
        for _ in range(5):
            await asyncio.sleep(0)  # both claimed; the submission waits at the gate
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        gate.set()
        samples: list[Any] = await second
        return samples

    samples = asyncio.run(main())
    assert len(service.submitted) == 1
    assert samples[0].metadata["agentinfra_run_id"] == "g1-1"


def test_a_rollout_past_the_timeout_is_cancelled_and_reported(slime_types: type[Sample]) -> None:
    service = FakeService([], hold=True)
    with pytest.raises(RolloutError, match="agentinfra_timeout_s"):
        asyncio.run(adapter.generate(slime_args(agentinfra_timeout_s=0.05), slime_sample(), {},
                                     client_factory=service.client))  # fmt: skip
    assert service.cancelled == ["g1-0"]


def test_settings_errors_name_the_knob(slime_types: type[Sample], tmp_path: Path) -> None:
    args = slime_args()
    del args.agentinfra_url
    with pytest.raises(ConfigError, match=r"agentinfra_url.*--custom-config-path"):
        asyncio.run(adapter.generate(args, slime_sample(), {}))
    with pytest.raises(ConfigError, match=r"metadata\[.task.\]"):
        asyncio.run(adapter.generate(slime_args(), Sample(index=3), {}))
    with pytest.raises(ConfigError, match="agentinfra_reward_split='half'"):
        adapter.SlimeSettings.from_args(slime_args(agentinfra_reward_split="half"))
    with pytest.raises(ConfigError, match=r"\[.task.\].*sets itself"):
        adapter.SlimeSettings.from_args(slime_args(agentinfra_request={"task": "x"}))
    for knob, value in [("agentinfra_timeout_s", "ten"), ("agentinfra_submit_retry_s", [1]),
                        ("agentinfra_timeout_s", "nan"), ("agentinfra_request", "max_turns=3")]:  # fmt: skip
        with pytest.raises(
            ConfigError, match=rf"{knob}={re.escape(repr(value))} must be .*--custom-config-path"
        ):
            adapter.SlimeSettings.from_args(slime_args(**{knob: value}))
    assert adapter.SlimeSettings.from_args(slime_args(agentinfra_timeout_s="90")).timeout_s == 90.0
    token = tmp_path / "token"
    token.write_text("trainer s3cret\n")
    settings = adapter.SlimeSettings.from_args(slime_args(agentinfra_token_file=str(token)))
    assert settings.token() == "s3cret"


def test_without_slime_the_error_says_where_to_run_it() -> None:
    assert "slime" not in sys.modules
    with pytest.raises(
        ConfigError, match=r"slime is not importable.*--custom-generate-function-path"
    ):
        asyncio.run(adapter.generate(slime_args(), slime_sample(), {}))


def test_a_cancelled_rollout_with_exact_ids_is_still_masked_not_trained(
    slime_types: type[Sample],
) -> None:
    cancelled, sibling = load("service_cancelled_segments.jsonl")
    assert cancelled["tokens"] == "exact"
    assert len(cancelled["segments"]) == 3
    (out,) = adapter.samples_of(cancelled, slime_sample(), slime_types)
    assert out.status is Sample.Status.ABORTED
    assert out.remove_sample is True
    assert out.loss_mask == [0]
    (kept,) = adapter.samples_of(sibling, slime_sample(index=5), slime_types)
    check_sample(kept)
    assert kept.tokens == sibling["segments"][0]["token_ids"]


def test_each_segment_gets_the_status_of_its_last_call(slime_types: type[Sample]) -> None:
    trajectory = copy.deepcopy(load("service_cancelled_segments.jsonl")[0])
    trajectory["infra_failure"] = None  # as if it had not been cancelled: three real segments
    samples = adapter.samples_of(trajectory, slime_sample(index=9), slime_types)
    assert [s.status for s in samples] == [
        Sample.Status.TRUNCATED, Sample.Status.TRUNCATED, Sample.Status.COMPLETED]  # fmt: skip
    assert {s.rollout_id for s in samples} == {9}
    for out, segment in zip(samples, trajectory["segments"], strict=True):
        check_sample(out)
        assert out.tokens == segment["token_ids"]
        response = out.tokens[-out.response_length :]
        assert [
            t for t, m in zip(response, out.loss_mask or [], strict=True) if m
        ] == engine_sampled(trajectory, segment["calls"])


def test_group_advantages_count_each_rollout_once_and_skip_masked_ones(
    slime_types: type[Sample],
) -> None:
    desktop = [copy.deepcopy(t) for t in load("desktop_rerender.jsonl")]
    multi = next(i for i, t in enumerate(desktop) if len(t["segments"]) == 2)
    desktop[multi]["reward"], desktop[1 - multi]["reward"] = 1.0, 0.0  # SmolLM2 earned 0 in both
    samples: list[Sample] = []
    for i, t in enumerate(desktop):
        samples += adapter.samples_of(t, slime_sample(index=i, group_index=0), slime_types)
    for i, t in enumerate(load("service_failures.jsonl")):
        samples += adapter.samples_of(t, slime_sample(index=10 + i, group_index=1), slime_types)
    raw, advantages = adapter.group_advantages(
        types.SimpleNamespace(grpo_std_normalization=True), samples
    )
    assert len(raw) == len(advantages) == len(samples) == 6
    spread = (0.5**2 * 2) ** 0.5  # the sample standard deviation of [1.0, 0.0]
    expected = {multi: 0.5 / (spread + 1e-6), 1 - multi: -0.5 / (spread + 1e-6)}
    for sample, advantage in zip(samples[:3], advantages[:3], strict=True):
        assert advantage == pytest.approx(
            expected[sample.index]
        )  # both segments of a rollout alike
    assert [s.reward for s in samples[:3]].count(
        0.5
    ) == 2  # the raw reward stays split over segments
    assert raw[:3] == [s.reward for s in samples[:3]]
    masked = [s.metadata.get("agentinfra_untrainable") is not None for s in samples[3:]]
    assert masked == [True, False, True]
    assert advantages[3:] == [
        0.0,
        0.0,
        0.0,
    ]  # the lone graded rollout of group 1 has nothing to beat
    _, centred = adapter.group_advantages(
        types.SimpleNamespace(grpo_std_normalization=False), samples
    )
    assert sorted(set(centred[:3])) == [-0.5, 0.5]

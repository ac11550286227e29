"""`agentinfra.trainers.skyrl`: recorded trajectories in, a SkyRL ``GeneratorOutput`` out, every field checked.

SkyRL 0.4.0 on PyPI needs Python >= 3.12 (agentinfra runs 3.11), so its types are mirrored
here field for field from ``skyrl/train/generators/base.py`` of the PyPI wheel
``skyrl-0.4.0-py3-none-any.whl`` (sha256 7f95dad6...c6ee9; the file's sha256 7c28ca7a...f2e5),
which is NovaSky-AI/SkyRL commit a9564572eb8e91076be43c1bd5e4615e3de17265 plus
``rollout_sample_support``; `test_the_mirror_is_the_published_wheels_types` compares the
mirror with that file in the wheel (``make skyrl-wheel`` downloads it; it is parsed, never
imported), and `check_output` also runs SkyRL's own ``validate_generator_output`` from
that wheel on every output. The invariants checked are those SkyRL's trainer asserts in
``validate_generator_output`` and ``_validate_step_wise_fields``
(``skyrl/train/utils/trainer_utils.py``): one row per prompt unless step-wise, every list
field as long as ``response_ids``, per-row lengths that agree, rewards all floats or all
lists, and, step-wise, contiguous trajectories with ``is_last_step`` at each boundary.

The trajectories are real (tests/fixtures/trajectories/README.md).
"""

from __future__ import annotations

import ast
import asyncio
import copy
import functools
import json
import logging
import re
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, TypedDict, Union, get_type_hints

import numpy
import pytest

from agentinfra.errors import ConfigError, RolloutError
from agentinfra.trainers.skyrl import AgentinfraGenerator, SkyRLSettings

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "trajectories"


def load(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line]


# --- the mirror of SkyRL's types (skyrl 0.4.0, skyrl/train/generators/base.py) ------------------

ConversationType = list[dict[str, str]]
RoutedExpertIndices = Any  # numpy.ndarray in SkyRL
SampleSupport = Any  # numpy.ndarray in SkyRL
Tensor = Any  # torch.Tensor in SkyRL


@dataclass
class TrajectoryID:
    instance_id: str
    repetition_id: int

    def to_string(self) -> str:
        return f"{self.instance_id}_{self.repetition_id}"


@dataclass
class BatchMetadata:
    global_step: int
    training_phase: Literal["train", "eval"]


class GeneratorInput(TypedDict):
    prompts: list[ConversationType]
    env_classes: list[str]
    env_extras: Optional[list[dict[str, Any]]]  # noqa: UP045 (SkyRL's spelling)
    sampling_params: Optional[dict[str, Any]]  # noqa: UP045
    trajectory_ids: Optional[list[TrajectoryID]]  # noqa: UP045
    batch_metadata: Optional[BatchMetadata]  # noqa: UP045


class GeneratorOutput(TypedDict):
    prompt_token_ids: list[list[int]]
    response_ids: list[list[int]]
    rewards: Union[list[float], list[list[float]]]  # noqa: UP007
    loss_masks: list[list[int]]
    stop_reasons: Optional[list[str]]  # noqa: UP045
    rollout_metrics: Optional[dict[str, Any]]  # noqa: UP045
    rollout_logprobs: Optional[list[list[float]]]  # noqa: UP045
    trajectory_ids: Optional[list[TrajectoryID]]  # noqa: UP045
    trajectory_generation_times: Optional[list[float]]  # noqa: UP045
    trajectory_time_splits: Optional[dict[str, list[float]]]  # noqa: UP045
    rollout_expert_indices: Optional[list[RoutedExpertIndices]]  # noqa: UP045
    rollout_sample_support: Optional[list[SampleSupport]]  # noqa: UP045
    is_last_step: Optional[list[bool]]  # noqa: UP045
    env_metrics: Optional[list[dict[str, Any]]]  # noqa: UP045
    pixel_values: Optional[list[Tensor]]  # noqa: UP045
    image_grid_thw: Optional[list[Tensor]]  # noqa: UP045


GENERATOR_OUTPUT_FIELDS = [
    "prompt_token_ids", "response_ids", "rewards", "loss_masks", "stop_reasons",
    "rollout_metrics", "rollout_logprobs", "trajectory_ids", "trajectory_generation_times",
    "trajectory_time_splits", "rollout_expert_indices", "rollout_sample_support",
    "is_last_step", "env_metrics", "pixel_values", "image_grid_thw",
]  # fmt: skip
"""``GeneratorOutput``'s keys in declaration order, read off the 0.4.0 wheel."""


WHEEL_DIR = Path(sys.prefix) / "skyrl"
"""Where ``make skyrl-wheel`` puts skyrl 0.4.0's wheel (downloaded, not installed)."""


def published_classes() -> dict[str, dict[str, str]]:
    """Each class of the wheel's ``skyrl/train/generators/base.py``: field -> annotation text (parsed, not run)."""
    wheels = sorted(WHEEL_DIR.glob("skyrl-0.4.0-*.whl"))
    if not wheels:
        pytest.skip(f"no skyrl 0.4.0 wheel in {WHEEL_DIR}: run `make skyrl-wheel`")
    with zipfile.ZipFile(wheels[0]) as wheel:
        tree = ast.parse(wheel.read("skyrl/train/generators/base.py").decode())
    return {
        node.name: {item.target.id: ast.unparse(item.annotation) for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
        for node in tree.body if isinstance(node, ast.ClassDef)
    }  # fmt: skip


def spelled_as_skyrl(annotation: str) -> str:
    return (
        annotation.replace("list[", "List[")
        .replace("dict[", "Dict[")
        .replace("Tensor", "torch.Tensor")
    )


@functools.cache
def skyrl_validator() -> Callable[..., None] | None:
    """SkyRL's own ``validate_generator_output`` (with the two helpers it calls), taken from
    the wheel's ``skyrl/train/utils/trainer_utils.py`` and run here; None without the wheel.

    The module itself imports ray, torch and loguru, so only those three functions are
    compiled, with numpy and a logger as their globals.
    """
    wheels = sorted(WHEEL_DIR.glob("skyrl-0.4.0-*.whl"))
    if not wheels:
        return None
    with zipfile.ZipFile(wheels[0]) as wheel:
        source = wheel.read("skyrl/train/utils/trainer_utils.py").decode()
        support = wheel.read("skyrl/backends/skyrl_train/utils/sample_support.py").decode()
    wanted = {
        "validate_generator_output",
        "_validate_step_wise_fields",
        "_validate_per_token_side_channels",
    }
    functions = [
        n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name in wanted
    ]
    assert {f.name for f in functions} == wanted
    field = re.search(r'^SAMPLE_SUPPORT_FIELD = "(\w+)"', support, re.MULTILINE)
    assert field is not None
    namespace: dict[str, Any] = {"np": numpy, "logger": logging.getLogger("skyrl"),
                                 "GeneratorOutput": dict, "SAMPLE_SUPPORT_FIELD": field.group(1)}  # fmt: skip
    exec(
        compile(
            ast.Module(body=functions, type_ignores=[]), "skyrl-0.4.0/trainer_utils.py", "exec"
        ),
        namespace,
    )
    validator: Callable[..., None] = namespace["validate_generator_output"]
    return validator


def test_the_mirror_is_the_published_wheels_types() -> None:
    published = published_classes()
    for mirror in (GeneratorInput, GeneratorOutput, TrajectoryID, BatchMetadata):
        ours = {name: spelled_as_skyrl(getattr(text, "__forward_arg__", str(text)))
                for name, text in mirror.__annotations__.items()}  # fmt: skip
        ours = {n: t.replace("Literal['train', 'eval']", "TrainingPhase") for n, t in ours.items()}
        assert ours == published[mirror.__name__], mirror.__name__
    assert list(published["GeneratorOutput"]) == GENERATOR_OUTPUT_FIELDS


def test_the_mirror_has_skyrls_fields_in_order() -> None:
    assert list(get_type_hints(GeneratorOutput)) == GENERATOR_OUTPUT_FIELDS
    assert list(get_type_hints(GeneratorInput)) == [
        "prompts", "env_classes", "env_extras", "sampling_params", "trajectory_ids", "batch_metadata"]  # fmt: skip


def check_output(output: dict[str, Any], *, num_prompts: int, step_wise: bool) -> None:
    """SkyRL's invariants on a ``GeneratorOutput`` (SkyRL's own validator too, when the wheel is
    there), and each field's type."""
    validator = skyrl_validator()
    if validator is not None:
        validator(num_prompts, output, step_wise=step_wise)
    assert list(output) == GENERATOR_OUTPUT_FIELDS
    rows = len(output["response_ids"])
    assert rows > 0
    assert len(output["prompt_token_ids"]) == rows
    if not step_wise:
        assert rows == num_prompts
    for key in ("loss_masks", "rewards", "rollout_logprobs", "stop_reasons", "trajectory_ids",
                "trajectory_generation_times", "env_metrics"):  # fmt: skip
        assert len(output[key]) == rows, key
    for name, times in output["trajectory_time_splits"].items():
        assert len(times) == rows, name
    for i in range(rows):
        assert all(
            type(t) is int for t in output["prompt_token_ids"][i] + output["response_ids"][i]
        )
        assert len(output["loss_masks"][i]) == len(output["response_ids"][i]) > 0
        assert set(output["loss_masks"][i]) <= {0, 1}
        assert len(output["rollout_logprobs"][i]) == len(output["response_ids"][i])
        assert all(type(lp) is float for lp in output["rollout_logprobs"][i])
        assert isinstance(output["stop_reasons"][i], str)
        assert isinstance(output["trajectory_ids"][i], TrajectoryID)
    assert all(type(r) is float for r in output["rewards"])  # per trajectory, never per token
    assert isinstance(output["rollout_metrics"], dict)
    assert output["rollout_expert_indices"] is None
    assert output["rollout_sample_support"] is None
    assert output["pixel_values"] is None
    assert output["image_grid_thw"] is None
    if not step_wise:
        assert output["is_last_step"] is None
        return
    last, ids = output["is_last_step"], output["trajectory_ids"]
    assert len(last) == rows
    assert last[-1] is True
    seen: set[str] = set()
    for i, tid in enumerate(ids):
        if i == 0 or ids[i - 1].to_string() != tid.to_string():
            assert tid.to_string() not in seen  # contiguous
            seen.add(tid.to_string())
        if i + 1 < rows and ids[i + 1].to_string() != tid.to_string():
            assert last[i] is True  # a boundary is a last step


class FakeService:
    """`AsyncRolloutClient`'s interface over recorded groups, one per submission in order."""

    def __init__(self, groups: list[list[dict[str, Any]]]) -> None:
        self.groups = groups
        self.submitted: list[dict[str, Any]] = []
        self.finished: dict[str, dict[str, Any]] = {}

    def client(self, settings: SkyRLSettings) -> FakeService:
        return self

    async def __aenter__(self) -> FakeService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def submit_group(
        self, request: dict[str, Any], *, retry_for_s: float = 0.0
    ) -> dict[str, Any]:
        group = self.groups[len(self.submitted)]
        assert request["group_size"] == len(group)
        self.submitted.append(request)
        for trajectory in group:
            self.finished[trajectory["run_id"]] = trajectory
        return {"group_id": group[0]["group_id"], "rollout_ids": [t["run_id"] for t in group]}

    async def rollout(self, rollout_id: str, *, wait_s: float = 0.0) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {
            "rollout_id": rollout_id,
            "state": "finished",
            "trajectory": self.finished[rollout_id],
        }

    async def cancel(self, rollout_id: str, reason: str = "stale policy") -> dict[str, Any]:
        raise AssertionError("nothing is cancelled here")


def batch(
    groups: list[list[dict[str, Any]]], *, step: int = 3, sampling: dict[str, Any] | None = None
) -> GeneratorInput:
    prompts, envs, extras, ids = [], [], [], []
    for n, group in enumerate(groups):
        for repetition, trajectory in enumerate(group):
            prompts.append([{"role": "user", "content": f"task {n}"}])
            envs.append(trajectory["environment"])
            extras.append({"task": f"/tasks/{trajectory['task']}"})
            ids.append(TrajectoryID(instance_id=f"p{n}", repetition_id=repetition))
    return GeneratorInput(prompts=prompts, env_classes=envs, env_extras=extras, sampling_params=sampling,
                          trajectory_ids=ids, batch_metadata=BatchMetadata(step, "train"))  # fmt: skip


def generate(
    groups: list[list[dict[str, Any]]], *, step_wise: bool, sampling: dict[str, Any] | None = None
) -> tuple[dict[str, Any], FakeService]:
    service = FakeService(groups)
    settings = SkyRLSettings(url="http://127.0.0.1:7490", base_url="http://127.0.0.1:8000/v1",
                             model="smol", step_wise=step_wise, request={"max_turns": 5})  # fmt: skip
    generator = AgentinfraGenerator(settings, client_factory=service.client)
    output = asyncio.run(generator.generate(dict(batch(groups, sampling=sampling))))
    return output, service


def segment_rows_match(
    row: int, output: dict[str, Any], trajectory: dict[str, Any], index: int
) -> None:
    """Row ``row`` is segment ``index`` of ``trajectory``: the engine's ids, mask and logprobs."""
    segment = trajectory["segments"][index]
    start = segment["loss_mask"].index(1)
    assert output["prompt_token_ids"][row] == segment["token_ids"][:start]
    assert output["response_ids"][row] == segment["token_ids"][start:]
    assert output["loss_masks"][row] == segment["loss_mask"][start:]
    sampled = [
        t for t, m in zip(output["response_ids"][row], output["loss_masks"][row], strict=True) if m
    ]
    assert sampled == [
        t for c in segment["calls"] for t in trajectory["calls"][c]["completion_ids"]
    ]
    logprobs = [
        lp
        for lp, m in zip(output["rollout_logprobs"][row], output["loss_masks"][row], strict=True)
        if m
    ]
    assert logprobs == [
        lp for c in segment["calls"] for lp in trajectory["calls"][c]["completion_logprobs"]
    ]
    assert output["stop_reasons"][row] == trajectory["calls"][segment["calls"][-1]]["finish_reason"]
    assert output["env_metrics"][row]["agentinfra_run_id"] == trajectory["run_id"]
    assert output["env_metrics"][row]["agentinfra_segment"] == index


def test_one_row_per_trajectory_with_the_engines_tokens_and_rewards() -> None:
    kernels, desktop = load("kernels_truncated.jsonl"), load("desktop_rerender.jsonl")
    output, service = generate([kernels, desktop], step_wise=False, sampling={"max_tokens": 48})
    check_output(output, num_prompts=4, step_wise=False)
    assert [r["group_size"] for r in service.submitted] == [2, 2]
    assert service.submitted[0] == {
        "environment": "kernels", "task": f"/tasks/{kernels[0]['task']}", "group_size": 2,
        "model": "smol", "base_url": "http://127.0.0.1:8000/v1", "policy_version": "step-3",
        "max_turns": 5, "max_output_tokens": 48,
    }  # fmt: skip
    for row, trajectory in enumerate(kernels + desktop):
        segment_rows_match(row, output, trajectory, len(trajectory["segments"]) - 1)
        assert output["rewards"][row] == trajectory["reward"]
        assert output["trajectory_generation_times"][row] == trajectory["time"]["wall_s"]
        assert output["trajectory_time_splits"]["llm"][row] == trajectory["time"]["model_s"]
        assert output["trajectory_time_splits"]["env"][row] == (
            trajectory["time"]["tools_s"] + trajectory["time"]["grading_s"]
        )
    assert [t.to_string() for t in output["trajectory_ids"]] == ["p0_0", "p0_1", "p1_0", "p1_1"]
    assert (
        output["rollout_metrics"]["agentinfra/dropped_segments"] == 1
    )  # the rerendered one's first
    assert output["rollout_metrics"]["agentinfra/masked_trajectories"] == 0


def test_step_wise_rows_are_segments_with_the_reward_on_the_last() -> None:
    desktop = [copy.deepcopy(t) for t in load("desktop_rerender.jsonl")]
    for trajectory in desktop:
        trajectory["reward"] = 1.0  # SmolLM2 earned 0; where the reward lands is what is checked
    output, _ = generate([load("kernels_truncated.jsonl"), desktop], step_wise=True)
    check_output(output, num_prompts=4, step_wise=True)
    multi = next(i for i, t in enumerate(desktop) if len(t["segments"]) == 2)
    assert len(output["response_ids"]) == 5
    rows = [2, 3] if multi == 0 else [3, 4]
    segment_rows_match(rows[0], output, desktop[multi], 0)
    segment_rows_match(rows[1], output, desktop[multi], 1)
    assert [output["is_last_step"][r] for r in rows] == [False, True]
    assert [output["rewards"][r] for r in rows] == [0.0, 1.0]
    assert output["rewards"][:2] == [0.0, 0.0]
    assert output["rollout_metrics"]["agentinfra/dropped_segments"] == 0


def test_an_infra_failure_masks_its_whole_prompt_as_skyrl_does() -> None:
    failures = load("service_failures.jsonl")
    cancelled_group = [t for t in failures if t["group_id"] == failures[0]["group_id"]]
    model_error = [t for t in failures if t["group_id"] != failures[0]["group_id"]]
    kernels = load("kernels_truncated.jsonl")
    for step_wise in (False, True):
        output, _ = generate([cancelled_group, kernels, model_error], step_wise=step_wise)
        check_output(output, num_prompts=len(failures) + 2, step_wise=step_wise)
        masked = [0, 1, 4]
        for row in masked:
            assert output["response_ids"][row] == [0]
            assert output["prompt_token_ids"][row] == [0]
            assert output["loss_masks"][row] == [0]
            assert output["rewards"][row] == 0.0
            assert output["stop_reasons"][row] == "error"
            assert output["env_metrics"][row]["agentinfra_untrainable"]
        reasons = [output["env_metrics"][r]["agentinfra_untrainable"] for r in masked]
        assert reasons == [
            "infra_failure:cancelled",
            "group_member_infra_failure:cancelled",  # its own rollout ran out, with exact ids
            "infra_failure:model_error",
        ]
        assert cancelled_group[1]["tokens"] == "exact"
        assert cancelled_group[1]["segments"]
        for row in (2, 3):
            segment_rows_match(row, output, kernels[row - 2], 0)
        metrics = output["rollout_metrics"]
        assert metrics["agentinfra/infra_failures"] == sum(
            1 for t in failures if t["infra_failure"]
        )
        assert metrics["agentinfra/masked_prompts"] == 2
        assert metrics["agentinfra/masked_trajectories"] == 3


def test_a_row_without_a_task_is_refused_by_name() -> None:
    kernels = load("kernels_truncated.jsonl")
    inputs = dict(batch([kernels]))
    inputs["env_extras"] = [{"task": "/t.py"}, {}]
    settings = SkyRLSettings(url="http://x", base_url="http://y/v1", model="m")
    generator = AgentinfraGenerator(settings, client_factory=FakeService([kernels]).client)
    with pytest.raises(ConfigError, match=r"row 1 has no env_extras\['task'\]"):
        asyncio.run(generator.generate(inputs))


def test_settings_refuse_what_the_generator_sets() -> None:
    with pytest.raises(ConfigError, match=r"\['group_size'\].*sets itself"):
        SkyRLSettings(url="http://x", base_url="http://y/v1", model="m", request={"group_size": 4})
    with pytest.raises(ConfigError, match="timeout_s=0"):
        SkyRLSettings(url="http://x", base_url="http://y/v1", model="m", timeout_s=0)


class RefusingService(FakeService):
    """Runs the first group forever and refuses the second (a 429 that outlasted the retries)."""

    def __init__(self, groups: list[list[dict[str, Any]]]) -> None:
        super().__init__(groups)
        self.cancelled: list[str] = []

    async def submit_group(
        self, request: dict[str, Any], *, retry_for_s: float = 0.0
    ) -> dict[str, Any]:
        if self.submitted:
            await asyncio.sleep(0.05)
            raise RolloutError("429: the queue is full", status=429, retry_after_s=30.0)
        return await super().submit_group(request, retry_for_s=retry_for_s)

    async def rollout(self, rollout_id: str, *, wait_s: float = 0.0) -> dict[str, Any]:
        await asyncio.sleep(wait_s)
        return {"rollout_id": rollout_id, "state": "running", "trajectory": None}

    async def cancel(self, rollout_id: str, reason: str = "stale policy") -> dict[str, Any]:
        self.cancelled.append(rollout_id)
        return {"rollout_id": rollout_id, "state": "finished"}


def test_a_refused_group_cancels_the_batchs_rollouts_in_flight() -> None:
    kernels, desktop = load("kernels_truncated.jsonl"), load("desktop_rerender.jsonl")
    service = RefusingService([kernels, desktop])
    settings = SkyRLSettings(url="http://x", base_url="http://y/v1", model="m")
    generator = AgentinfraGenerator(settings, client_factory=service.client)

    async def main() -> list[str]:
        with pytest.raises(RolloutError, match="429"):
            await generator.generate(dict(batch([kernels, desktop])))
        return list(service.cancelled)  # before the loop's shutdown would cancel leftovers

    assert sorted(asyncio.run(main())) == sorted(t["run_id"] for t in kernels)


def test_step_wise_rows_of_a_three_segment_kernels_rollout() -> None:
    cancelled, sibling = (copy.deepcopy(t) for t in load("service_cancelled_segments.jsonl"))
    masked, _ = generate([[cancelled, sibling]], step_wise=True)
    check_output(masked, num_prompts=2, step_wise=True)
    assert masked["loss_masks"] == [[0], [0]]  # the cancel masks the whole prompt
    cancelled["infra_failure"] = None  # as if it had not been cancelled: three real segments
    output, _ = generate([[cancelled, sibling]], step_wise=True)
    check_output(output, num_prompts=2, step_wise=True)
    assert output["is_last_step"] == [False, False, True, True]
    for row in range(3):
        segment_rows_match(row, output, cancelled, row)
    segment_rows_match(3, output, sibling, 0)
    assert output["stop_reasons"][:3] == ["length", "length", "stop"]


def test_skyrls_own_validator_runs_and_refuses_a_bad_row() -> None:
    validator = skyrl_validator()
    if validator is None:
        pytest.skip(f"no skyrl 0.4.0 wheel in {WHEEL_DIR}: run `make skyrl-wheel`")
    output, _ = generate([load("kernels_truncated.jsonl")], step_wise=False)
    validator(2, output, step_wise=False)
    output["loss_masks"][1] = output["loss_masks"][1][:-1]
    with pytest.raises(
        AssertionError, match="Response ids and loss masks must have the same length"
    ):
        validator(2, output, step_wise=False)

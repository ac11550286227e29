"""Both adapters against a real rollout service (``agentinfra rollouts serve``) over loopback HTTP.

The model is `ScriptedModelServer` (real HTTP; it returns no token ids, so every trajectory
is ``tokens: "unavailable"`` and must come back masked, never re-tokenized); the
environment is kernels with a script that lists files and stops (no grading). What is
checked is the glue: one agentinfra group per slime group and per SkyRL prompt, each
sample or row given its own rollout, and a cancelled caller cancelling its rollout at
the service.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentinfra.agent import Reply, ScriptedModelServer
from agentinfra.rollouts import RolloutClient
from agentinfra.trainers import skyrl, slime

ROOT = Path(__file__).resolve().parents[3]
PROBLEM = ROOT / "examples/kernels/problems/10_slow_rowwise_softmax.py"
MODEL = "scripted-policy"


def lister(delay_s: float) -> Any:
    def script(body: dict[str, Any]) -> Reply:
        if sum(1 for m in body["messages"] if m["role"] == "assistant") < 2:
            return Reply(tool_calls=[("list_files", "{}")], delay_s=delay_s)
        return Reply(content="done", delay_s=delay_s)

    return script


@pytest.fixture(scope="module")
def service_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``agentinfra rollouts serve`` on a free loopback port; yields its URL and state directory."""
    tmp_path = tmp_path_factory.mktemp("service")
    log_path = tmp_path / "serve.log"
    env = {**os.environ, "OPENAI_API_KEY": "test-key", "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "agentinfra", "rollouts", "serve", "--port", "0",
             "--state-dir", str(tmp_path / "state"), "--concurrency", "4"],
            stdout=log, stderr=log, env=env, cwd=ROOT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while (found := re.search(r"serving rollouts on (http://127\.0\.0\.1:\d+)",
                                  log_path.read_text(errors="replace"))) is None:  # fmt: skip
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        yield found.group(1), tmp_path / "state"
    finally:
        process.terminate()
        process.wait(60)


def slime_modules(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The mirror of slime's `Sample` (test_slime_generate.py) installed as ``slime.utils.types``."""
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        import test_slime_generate as mirror
    finally:
        sys.path.pop(0)
    for name in ("slime", "slime.utils", "slime.utils.types"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["slime.utils.types"].Sample = mirror.Sample  # type: ignore[attr-defined]
    return mirror.Sample


@pytest.mark.slow
def test_slime_and_skyrl_run_groups_through_the_service(
    service_state: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    service = service_state[0]
    sample_class = slime_modules(monkeypatch)
    with ScriptedModelServer(lister(0.0), models=[MODEL]) as model:
        args = types.SimpleNamespace(
            n_samples_per_prompt=2, agentinfra_url=service, agentinfra_base_url=model.base_url,
            agentinfra_model=MODEL, agentinfra_request={"max_turns": 4},
        )  # fmt: skip
        group = [
            sample_class(group_index=0, index=i, metadata={"task": str(PROBLEM)}) for i in (0, 1)
        ]

        async def run_slime() -> list[Any]:
            return await asyncio.gather(*(slime.generate(args, s, {}) for s in group))

        slime_out = asyncio.run(run_slime())
        settings = skyrl.SkyRLSettings(url=service, base_url=model.base_url, model=MODEL,
                                       request={"max_turns": 4})  # fmt: skip
        rows = {"prompts": [[{"role": "user", "content": "x"}]] * 3,
                "env_classes": ["kernels"] * 3, "env_extras": [{"task": str(PROBLEM)}] * 3,
                "sampling_params": None, "trajectory_ids": None, "batch_metadata": None}  # fmt: skip
        skyrl_out = asyncio.run(skyrl.AgentinfraGenerator(settings).generate(rows))
    run_ids = [out[0].metadata["agentinfra_run_id"] for out in slime_out]
    assert len(set(run_ids)) == 2
    assert len({r.rsplit("-", 1)[0] for r in run_ids}) == 1  # one group, so one grading seed
    for (out,) in slime_out:
        assert out.metadata["agentinfra_untrainable"] == "tokens_unavailable"
        assert out.status is sample_class.Status.FAILED
        assert out.remove_sample is True
    client = RolloutClient(service)
    assert client.group(run_ids[0].rsplit("-", 1)[0])["rollouts"][0]["state"] == "finished"
    # without trajectory ids each SkyRL row is its own prompt: three groups of one
    groups = {m["agentinfra_group_id"] for m in skyrl_out["env_metrics"]}
    assert len(groups) == 3
    assert skyrl_out["loss_masks"] == [[0]] * 3
    assert skyrl_out["rollout_metrics"]["agentinfra/masked_prompts"] == 3


@pytest.mark.slow
def test_a_cancelled_slime_sample_cancels_its_rollout_at_the_service(
    service_state: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    service, state = service_state
    trajectories = state / "trajectories"
    before = set(trajectories.glob("*.json"))
    sample_class = slime_modules(monkeypatch)
    with ScriptedModelServer(lister(30.0), models=[MODEL]) as model:
        args = types.SimpleNamespace(
            n_samples_per_prompt=1, agentinfra_url=service, agentinfra_base_url=model.base_url,
            agentinfra_model=MODEL,
        )  # fmt: skip
        sample = sample_class(index=0, metadata={"task": str(PROBLEM)})

        async def cancel_mid_run() -> None:
            task = asyncio.ensure_future(slime.generate(args, sample, {}))
            deadline = time.monotonic() + 60
            while not model.requests and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cancel_mid_run())
    deadline = time.monotonic() + 60
    while not set(trajectories.glob("*.json")) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    (path,) = set(trajectories.glob("*.json")) - before
    trajectory = json.loads(path.read_text())
    assert trajectory["infra_failure"]["kind"] == "cancelled"
    assert trajectory["infra_failure"]["message"] == "the trainer cancelled it"

"""TRL's `GRPOTrainer` takes real optimisation steps on agentinfra rollouts, on CPU, and trains on vLLM's own ids.

SmolLM2-135M-Instruct is served by vLLM (the session's ``smollm2_vllm``) behind the recording
proxy of ``test_rollout_tokens.py``; an in-process `RolloutService` runs kernels episodes
against the proxy; TRL 1.16's `GRPOTrainer` (``use_vllm=False``: TRL's vLLM weight sync needs
CUDA, decision 0018) trains the same checkpoint with `agentinfra.trainers.trl.rollout_func`.

What the trainer's loss saw (``_compute_loss``'s inputs) is checked against what vLLM sent:
every run of loss-mask 1 in a trained row is, token for token, the completion vLLM returned
for exactly the row's ids before it (parsed from the proxy's raw bytes), and its sampling
logprobs are vLLM's; every trained row with its mask is a trajectory's last segment with
agentinfra's ``loss_mask``; and the weights moved.

SmolLM2 never solves a kernels task, so agentinfra's reward is 0 for every rollout and every
GRPO advantage would be 0 (no gradient): a second reward function, the number of
distinct token ids in the completion / 100 (None for an infra failure, as agentinfra's), gives
the steps a signal.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentinfra.engines import SMOLLM2_NAME, smollm2_dir
from agentinfra.rollouts import RolloutClient, ServiceConfig, ServiceThread

pytest.importorskip("trl", reason="TRL is in the dev extra (trl==1.16.0)")

from test_rollout_tokens import RecordingProxy  # tests/integration is on sys.path

ROOT = Path(__file__).resolve().parents[2]
TASKS = [
    str(ROOT / "examples/kernels/problems/13_relu_scale.py"),
    str(ROOT / "examples/kernels/problems/07_gelu_bias_scale.py"),
]
G = 2
STEPS = 2
"""One group (one task, G rollouts) per step: on 2 cores a step's forward and backward over
G sequences of ~1,000 tokens is most of the test's time and memory."""


@pytest.fixture
def rollout_service(tmp_path: Path) -> Iterator[str]:
    from agentinfra._settings import load_settings

    config = ServiceConfig(state_dir=tmp_path / "service", port=0, concurrency=4, max_pending=16)
    with ServiceThread(
        config, load_settings(), api_key_of=lambda _: "unused", timeout_s=120
    ) as url:
        yield url


def distinct_tokens(
    completion_ids: list[list[int]], infra_failure: list[str | None], **_: Any
) -> list[float | None]:
    """A signal that differs between rollouts (every completion here is cut at the same length)."""
    return [
        None if failed else len(set(ids)) / 100
        for ids, failed in zip(completion_ids, infra_failure, strict=True)
    ]


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of 1s."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


@pytest.mark.slow
@pytest.mark.vllm
# TRL 1.16 still calls transformers 5's deprecated gradient-checkpointing names itself
@pytest.mark.filterwarnings(r"ignore:`(is_)?gradient_checkpointing\w*` is deprecated:FutureWarning")
def test_grpo_steps_train_on_vllms_ids_with_agentinfras_masks(
    smollm2_vllm: str, rollout_service: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from agentinfra.trainers.trl import agentinfra_reward, rollout_func

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=torch.float32)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    seen: list[dict[str, Any]] = []
    produced: list[dict[str, list[Any]]] = []
    step_s: list[float] = []

    class Recording(GRPOTrainer):  # type: ignore[misc]
        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            seen.append(
                {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in inputs.items()}
            )
            return super()._compute_loss(model, inputs)

    with RecordingProxy(smollm2_vllm) as proxy:
        generate = rollout_func(
            rollout_service, model=SMOLLM2_NAME, base_url=proxy.base_url,
            request={"max_turns": 2, "max_output_tokens": 24, "context_tokens": 8192, "nudges": 4},
        )  # fmt: skip

        def recorded(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
            started = time.monotonic()
            produced.append(generate(prompts, trainer))
            step_s.append(time.monotonic() - started)
            return produced[-1]

        config = GRPOConfig(
            output_dir=str(tmp_path / "out"), use_cpu=True, per_device_train_batch_size=G,
            num_generations=G, max_steps=STEPS, learning_rate=1e-5, beta=0.0, logging_steps=1,
            report_to="none", save_strategy="no", seed=0, dataloader_num_workers=0, bf16=False,
        )  # fmt: skip
        trainer = Recording(
            model=model, args=config, processing_class=AutoTokenizer.from_pretrained(smollm2_dir()),
            reward_funcs=[agentinfra_reward, distinct_tokens], rollout_func=recorded,
            train_dataset=Dataset.from_dict({"prompt": TASKS}),
        )  # fmt: skip
        started = time.monotonic()
        trainer.train()
        train_s = time.monotonic() - started
        prompts = {r["messages"][1]["content"] for _, r, _ in proxy.exchanges if r.get("tools")}
        engine = [call for p in prompts for call in proxy.engine_calls(p)]

    assert len(seen) == len(produced) == STEPS
    assert trainer.state.global_step == STEPS
    # each row the loss saw is a trajectory's last segment with agentinfra's loss mask
    client = RolloutClient(rollout_service)
    run_ids = [rid for out in produced for rid in out["run_id"]]
    assert len(run_ids) == len(set(run_ids)) == STEPS * G
    trajectories = {rid: client.rollout(rid)["trajectory"] for rid in run_ids}
    expected = sorted(
        (tuple(t["segments"][-1]["token_ids"]), tuple(t["segments"][-1]["loss_mask"]))
        for t in trajectories.values() if t["infra_failure"] is None
    )  # fmt: skip
    trained = []
    for batch in seen:
        for row in range(batch["prompt_ids"].shape[0]):
            prompt = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()
            kept = batch["completion_mask"][row].bool()
            completion = batch["completion_ids"][row][kept].tolist()
            mask = (batch["completion_mask"][row] * batch["tool_mask"][row])[kept].tolist()
            logprobs = batch["sampling_per_token_logps"][row][kept].tolist()
            trained.append(
                (prompt + completion, [0] * len(prompt) + mask, [0.0] * len(prompt) + logprobs)
            )
    failures = [t for t in trajectories.values() if t["infra_failure"] is not None]
    assert sorted((tuple(s), tuple(m)) for s, m, _ in trained if any(m)) == expected
    assert sum(not any(m) for _, m, _ in trained) == len(failures)
    # and every sampled run in it is what vLLM returned for exactly the ids before it
    compared = sampled = 0
    for sequence, mask, logprobs in trained:
        runs = _runs(mask)
        if not runs:
            continue
        assert runs[-1][1] == len(sequence)  # a row ends with the model's last completion
        for start, end in runs:
            matches = [
                c
                for c in engine
                if c["prompt_ids"] == sequence[:start]
                and c["completion_ids"] == sequence[start:end]
            ]
            assert matches, f"tokens {start}:{end} of a trained row are no completion vLLM sent"
            # G samples of one prompt can come back with the same ids from different batches,
            # whose logprobs differ in the fifth decimal on CPU: the row's are one call's exactly
            assert any(
                logprobs[start:end] == pytest.approx(c["logprobs"], abs=1e-5) for c in matches
            ), f"logprobs of tokens {start}:{end} are no call's that sent them"
            sampled += end - start
        compared += len(sequence)
    assert sampled > 0
    # multi-turn rows: the environment's tokens between two calls are in the completion, masked out
    assert any(0 in m[m.index(1) :] for _, m, _ in trained if 1 in m)
    # no weight sync on CPU: every call was made at policy version "0" (decision 0018)
    assert {c["policy_version"] for t in trajectories.values() for c in t["calls"]} == {"0"}
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "no parameter moved in two GRPO steps"
    print(
        f"TRL GRPO on CPU: {STEPS} steps of 1 task x G={G} in {train_s:.1f} s "
        f"(rollouts {sum(step_s):.1f} s: {[round(s, 1) for s in step_s]}); token check: "
        f"{compared} trained tokens ({sampled} sampled) equal to vLLM's in "
        f"{sum(bool(_runs(m)) for _, m, _ in trained)} rows, {len(failures)} infra failures; "
        f"{len(changed)} of {len(before)} parameter tensors changed; "
        f"rewards {[r for out in produced for r in out['reward']]}"
    )

"""TRL's GRPOTrainer on agentinfra rollouts on a GPU, with vLLM's NCCL weight sync after every step.

    python benchmarks/rollouts/trl_gpu.py [--model HuggingFaceTB/SmolLM2-135M-Instruct]
        [--tasks 'examples/kernels/problems/*.py'] [--tasks-per-step 2] [--group-size 4] [--steps 10]
        [--vllm-url http://127.0.0.1:8000] [--service-url http://127.0.0.1:7490] [--out trl_gpu.jsonl]

The CPU run of the same thing is ``tests/integration/test_trl_training.py`` (no weight sync
there: decision 0018). Here TRL runs in vLLM *server* mode (``use_vllm=True``,
``vllm_mode="server"``): the server both answers the agents' chat completions (through the
rollout service) and takes the policy's weights over NCCL, which TRL pushes
(``VLLMClient.update_named_params``) before it calls the rollout function at each new global
step; `agentinfra.trainers.trl.rollout_func` then asks for the group with
``policy_version`` = that step, and each call in the trajectories carries it.

Needs one CUDA machine with a venv holding ``vllm`` (CUDA build), ``trl==1.16.0`` and this
checkout (``pip install vllm trl==1.16.0 -e .``); the trainer's process imports vLLM for the
NCCL group. With no ``--vllm-url`` it starts
``VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --weight-transfer-config
'{"backend": "nccl"}' --enable-auto-tool-choice --tool-call-parser hermes ...`` itself on the same
GPU (``--vllm-gpu-memory`` of it); with no ``--service-url`` it runs a `RolloutService` in this
process. Not run on agentinfra's CI machines (no GPU); ``--help`` works anywhere.

Prints one JSON line per step (rollout seconds, rewards, infra failures, the policy
versions the model calls recorded against the step that asked) and a summary line with the
git revision, Python, torch and the GPU.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                        help="HF id or checkpoint directory, trained and served")  # fmt: skip
    parser.add_argument(
        "--served-name", default=None, help="the name vLLM serves it as (default: --model)"
    )
    parser.add_argument(
        "--tasks", default=str(ROOT / "examples/kernels/problems/*.py"), help="glob of task files"
    )
    parser.add_argument("--environment", default="kernels")
    parser.add_argument(
        "--tasks-per-step", type=int, default=2, help="groups per optimisation step"
    )
    parser.add_argument("--group-size", type=int, default=4, help="G: TRL's num_generations")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-output-tokens", type=int, default=512)
    parser.add_argument(
        "--context-tokens", type=int, default=8192, help="agent budget and vLLM --max-model-len"
    )
    parser.add_argument(
        "--tool-parser", default="hermes", help="vLLM's --tool-call-parser for the model"
    )
    parser.add_argument("--vllm-url", default=None,
                        help="a running vLLM server started with --weight-transfer-config (no /v1)")  # fmt: skip
    parser.add_argument("--vllm-gpu-memory", type=float, default=0.3,
                        help="--gpu-memory-utilization of the vLLM this script starts")  # fmt: skip
    parser.add_argument("--service-url", default=None, help="a running `agentinfra rollouts serve`")
    parser.add_argument(
        "--concurrency", type=int, default=16, help="rollouts at once (in-process service)"
    )
    parser.add_argument("--out", type=Path, default=None, help="also append the JSON lines here")
    return parser.parse_args(argv)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_vllm(
    args: argparse.Namespace, name: str, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """`vllm serve` with NCCL weight transfer and tool calls, on loopback; returns it and its root URL."""
    from agentinfra.engines import hermes_chat_template

    port = _free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
               "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
               "--weight-transfer-config", json.dumps({"backend": "nccl"}),
               "--gpu-memory-utilization", str(args.vllm_gpu_memory), "--max-model-len", str(args.context_tokens),
               "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
               "--enable-auto-tool-choice", "--tool-call-parser", args.tool_parser]  # fmt: skip
    if args.tool_parser == "hermes":
        command += ["--chat-template", str(hermes_chat_template())]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=sink,
                                   env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"})  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"vLLM exited with {process.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return process, url
        except OSError:
            time.sleep(2)
    process.kill()
    raise SystemExit(f"vLLM did not answer /health in 900 s; see {log}")


def in_process_service(state_dir: Path, concurrency: int) -> Any:
    """An in-process `RolloutService` (`ServiceThread`: TRL's loop is synchronous)."""
    from agentinfra._settings import load_settings
    from agentinfra.rollouts import ServiceConfig, ServiceThread

    config = ServiceConfig(state_dir=state_dir, port=0, concurrency=concurrency,
                           max_pending=max(64, 4 * concurrency))  # fmt: skip
    return ServiceThread(config, load_settings(), api_key_of=lambda _: "unused")


def emit(record: dict[str, Any], out: Path | None) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if out is not None:
        with out.open("a") as sink:
            sink.write(line + "\n")


def train(args: argparse.Namespace, vllm_url: str, service_url: str, name: str) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from agentinfra.rollouts import RolloutClient
    from agentinfra.trainers.trl import agentinfra_reward, rollout_func

    tasks = sorted(glob.glob(args.tasks))
    if not tasks:
        raise SystemExit(f"--tasks {args.tasks!r} matches no file")
    client = RolloutClient(service_url)
    generate = rollout_func(
        service_url, model=name, base_url=vllm_url + "/v1", environment=args.environment,
        request={"max_turns": args.max_turns, "max_output_tokens": args.max_output_tokens,
                 "context_tokens": args.context_tokens},
    )  # fmt: skip
    steps: list[dict[str, Any]] = []

    def recorded(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        step, started = trainer.state.global_step, time.monotonic()
        out = generate(prompts, trainer)
        versions = [
            call["policy_version"]
            for rid in out["run_id"]
            for call in (client.rollout(rid)["trajectory"] or {}).get("calls", [])
        ]
        rewards = [r for r in out["reward"] if r is not None]
        record = {"step": step, "rollouts": len(out["run_id"]), "rollout_s": round(time.monotonic() - started, 2),
                  "reward_mean": sum(rewards) / len(rewards) if rewards else None,
                  "infra_failures": sum(f is not None for f in out["infra_failure"]),
                  "calls": len(versions), "calls_at_this_policy": sum(v == str(step) for v in versions),
                  "sampled_tokens": sum(sum(m) for m in out["env_mask"])}  # fmt: skip
        steps.append(record)
        emit(record, args.out)
        return out

    config = GRPOConfig(
        output_dir=str(Path(os.environ.get("TMPDIR", "/tmp")) / "agentinfra-trl-gpu"), use_vllm=True,
        vllm_mode="server", vllm_server_base_url=vllm_url, num_generations=args.group_size,
        per_device_train_batch_size=args.tasks_per_step * args.group_size, max_steps=args.steps,
        learning_rate=args.learning_rate, beta=0.0, bf16=True, logging_steps=1, report_to="none",
        save_strategy="no", seed=0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16),
        args=config, processing_class=AutoTokenizer.from_pretrained(args.model),
        reward_funcs=[agentinfra_reward], rollout_func=recorded,
        train_dataset=Dataset.from_dict({"prompt": tasks}),
    )  # fmt: skip
    started = time.monotonic()
    trainer.train()
    wall_s = time.monotonic() - started
    return {"steps": trainer.state.global_step, "train_s": round(wall_s, 1),
            "s_per_step": round(wall_s / max(1, trainer.state.global_step), 2),
            "rollout_s": round(sum(s["rollout_s"] for s in steps), 1),
            "calls_at_their_step_policy": sum(s["calls_at_this_policy"] for s in steps),
            "calls": sum(s["calls"] for s in steps)}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: TRL's weight sync to vLLM needs one (the CPU run is "
                         "tests/integration/test_trl_training.py)")  # fmt: skip
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    name = args.served_name or args.model
    state = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentinfra-trl-gpu-{os.getpid()}"
    state.mkdir(parents=True, exist_ok=True)
    vllm = None
    vllm_url = args.vllm_url
    if vllm_url is None:
        vllm, vllm_url = start_vllm(args, name, state / "vllm.log")
    try:
        if args.service_url is not None:
            summary = train(args, vllm_url.rstrip("/"), args.service_url, name)
        else:
            with in_process_service(state / "service", args.concurrency) as url:
                summary = train(args, vllm_url.rstrip("/"), url, name)
    finally:
        if vllm is not None:
            vllm.terminate()
            vllm.wait(60)
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=ROOT, check=False).stdout.strip()  # fmt: skip
    emit({"summary": summary, "model": args.model, "group_size": args.group_size,
          "tasks_per_step": args.tasks_per_step, "git": revision, "python": platform.python_version(),
          "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}, args.out)  # fmt: skip


if __name__ == "__main__":
    main()

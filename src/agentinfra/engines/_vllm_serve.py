"""vLLM's OpenAI-compatible server as a child process, with agentinfra's connector under it.

Runs in agentinfra's own interpreter; the server runs with vLLM's (``.venv/vllm``,
`vllm_python`). Used by `make demo-vllm`, the real-model tests and the benchmarks::

    with VllmServer(smollm2_dir(), kv_url="127.0.0.1:7480", log=Path("vllm.log")) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused")

The server binds to loopback. ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache on a CPU)
defaults to 1 here unless set.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any

from agentinfra._settings import vllm_python_path
from agentinfra.errors import ConfigError

__all__ = [
    "SMOLLM2_NAME",
    "VllmServer",
    "hermes_chat_template",
    "smollm2_dir",
    "timed_chat",
    "vllm_python",
]

SMOLLM2_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The name the prepared SmolLM2 checkpoint is served under (`smollm2_dir`)."""


def _vllm_python_path() -> Path:
    return vllm_python_path() or Path(sys.prefix) / "vllm" / "bin" / "python"


def vllm_python() -> Path:
    """vLLM's interpreter: ``AGENTINFRA_VLLM_PYTHON``, else the ``vllm`` venv inside this one (`make vllm-venv`).

    Raises:
        ConfigError: there is none.
    """
    path = _vllm_python_path()
    if not path.exists():
        raise ConfigError(
            f"no vLLM interpreter at {path}: run `make vllm-venv`, or set AGENTINFRA_VLLM_PYTHON"
        )
    return path


def smollm2_dir(*, check: bool = True) -> Path:
    """The SmolLM2-135M-Instruct checkpoint `make smollm2` prepares beside vLLM's venv.

    Raises:
        ConfigError: ``check`` and it is not there.
    """
    path = _vllm_python_path().parent.parent / "models" / "smollm2-135m-instruct"
    if check and not (path / "agentinfra-model.json").is_file():
        raise ConfigError(f"no prepared SmolLM2 at {path}: run `make smollm2`")
    return path


def hermes_chat_template() -> Path:
    """ChatML with Hermes-style tools (``<tool_call>`` JSON), for SmolLM2 and other small ChatML models."""
    return Path(
        str(resources.files("agentinfra.engines") / "templates" / "chatml_hermes_tools.jinja")
    )


def timed_chat(
    client: Any, model: str, messages: list[dict[str, Any]], max_tokens: int, **extra: Any
) -> dict[str, Any]:
    """One greedy, streamed chat completion through an ``openai.OpenAI`` client, timed by the caller's clock.

    Returns the answer, the time to the first streamed token and in all, and the server's
    prompt, completion and cached token counts (vLLM reports cached tokens with
    ``--enable-prompt-tokens-details``). ``extra`` goes in the request body (``ignore_eos``).
    """
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    usage = None
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0.0, stream=True,
        stream_options={"include_usage": True}, extra_body=extra or None,
    ):  # fmt: skip
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.perf_counter() - started
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    details = getattr(usage, "prompt_tokens_details", None)
    return {
        "answer": "".join(parts).strip(), "ttft_s": first, "total_s": time.perf_counter() - started,
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "completion_tokens": usage.completion_tokens if usage else None,
        "cached_tokens": int(getattr(details, "cached_tokens", 0) or 0),
    }  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` on loopback, started and stopped with the object.

    Args:
        model: a checkpoint directory.
        log: vLLM's output goes here (appended).
        kv_url: ``HOST:PORT`` of a kv server: the `AgentinfraConnector` is loaded (None: no connector).
        served_name: the model name clients send (default: the directory's name).
        tools: ``"hermes"`` (with `hermes_chat_template`), ``"minimax_m2"`` (parsers only), or None.
        prefix_caching: vLLM's own prefix cache (off: every prefix hit comes from the connector).
        extra_args: more command-line arguments for vLLM.
        startup_timeout_s: how long to wait for ``/v1/models``.

    Raises:
        ConfigError: the server exited or did not answer in time (its log's tail in the message).
    """

    def __init__(
        self,
        model: Path,
        *,
        log: Path,
        kv_url: str | None = None,
        served_name: str | None = None,
        tools: str | None = "hermes",
        prefix_caching: bool = True,
        block_size: int = 32,
        max_model_len: int = 8192,
        max_num_batched_tokens: int = 4096,
        extra_args: tuple[str, ...] = (),
        startup_timeout_s: float = 300.0,
    ) -> None:
        if tools not in (None, "hermes", "minimax_m2"):
            raise ConfigError(f"tools={tools!r} must be 'hermes', 'minimax_m2' or None")
        self.model = model
        self.name = served_name or model.name
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = log
        args = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                "--served-model-name", self.name, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", "float32", "--max-model-len", str(max_model_len), "--block-size", str(block_size),
                "--enforce-eager", "--max-num-batched-tokens", str(max_num_batched_tokens)]  # fmt: skip
        if not prefix_caching:
            args.append("--no-enable-prefix-caching")
        if tools == "hermes":
            args += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                     "--chat-template", str(hermes_chat_template())]  # fmt: skip
        elif tools == "minimax_m2":
            args += ["--reasoning-parser", "minimax_m2", "--tool-call-parser", "minimax_m2",
                     "--enable-auto-tool-choice"]  # fmt: skip
        if kv_url is not None:
            transfer = {"kv_connector": "AgentinfraConnector", "kv_connector_module_path": "agentinfra.engines.vllm",
                        "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                        "kv_connector_extra_config": {"url": kv_url}}  # fmt: skip
            args += ["--kv-transfer-config", json.dumps(transfer)]
        args += list(extra_args)
        self._log = log.open("ab")
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        }
        self.process = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait(startup_timeout_s)
        except BaseException:
            self.close()
            raise

    def _wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ConfigError(
                    f"vLLM's server exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise ConfigError(
            f"vLLM's server did not answer within {timeout_s:.0f} s:\n{self.log_tail()}"
        )

    def log_tail(self, chars: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def metric(self, name: str) -> float:
        """The sum of a Prometheus counter or gauge of ``/metrics`` over its labels."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith((name + "{", name + " "))
        )

    def close(self) -> None:
        """Stops the server (SIGTERM, then SIGKILL after 30 s)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

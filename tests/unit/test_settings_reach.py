"""Every ``AGENTINFRA_*`` variable in the README's table reaches the code it names.

One case per variable: the variable is set, the command or function that the
README says it configures runs, and the effect is checked where it lands.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentinfra._settings import _KNOWN, load_settings
from agentinfra.agent import Reply, ScriptedModelServer
from agentinfra.cli import app
from agentinfra.cli._kv_server import build_store
from agentinfra.cli._runs import start_spec
from agentinfra.environments.kernels import GradeOptions, KernelSettings
from agentinfra.errors import ConfigError
from agentinfra.harness import RunDirectory, RunLayout, open_environment
from agentinfra.kvcache import MemoryTier, ServerConfig, ServerThread, TieredStore

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "examples" / "kernels" / "problems" / "11_slow_cumsum.py"
MODEL = "scripted-model"
COVERED = {
    "AGENTINFRA_LOG_LEVEL": "test_log_level",
    "AGENTINFRA_KV_MEMORY": "test_kv_memory_disk_dir_and_disk",
    "AGENTINFRA_KV_DISK_DIR": "test_kv_memory_disk_dir_and_disk",
    "AGENTINFRA_KV_DISK": "test_kv_memory_disk_dir_and_disk",
    "AGENTINFRA_KV_BLOCK_SIZE_TOKENS": "test_kv_block_size_reaches_explain",
    "AGENTINFRA_GRADER_TIMEOUT_S": "test_grader_variables_reach_grading_options",
    "AGENTINFRA_GRADER_MEMORY": "test_grader_variables_reach_grading_options",
    "AGENTINFRA_GRADER_MAX_PROCESSES": "test_grader_variables_reach_grading_options",
    "AGENTINFRA_GRADER_THREADS": "test_grader_variables_reach_grading_options",
    "AGENTINFRA_GRADER_DEVICE": "test_grader_variables_reach_grading_options",
    "AGENTINFRA_GRADER_FORK_SERVER": "test_grader_variables_reach_grading_options",
    "AGENTINFRA_RUNS_DIR": "test_runs_dir_and_agent_settings_reach_run",
    "AGENTINFRA_AGENT_CONCURRENCY": "test_runs_dir_and_agent_settings_reach_run",
    "AGENTINFRA_AGENT_REQUEST_TIMEOUT_S": "test_runs_dir_and_agent_settings_reach_run",
    "AGENTINFRA_EVAL_WORKERS": "test_eval_workers_reach_the_live_run",
    "AGENTINFRA_DESKTOP_MIRROR": "test_desktop_mirror_reaches_the_run_and_its_environment",
    "AGENTINFRA_DESKTOP_PYTHON": "test_interpreters_reach_their_launchers",
    "AGENTINFRA_VLLM_PYTHON": "test_interpreters_reach_their_launchers",
}
"""Which test below sets each variable and checks where it lands."""


def readme_variables() -> set[str]:
    table = ROOT.joinpath("README.md").read_text().split("| variable |", 1)[1].split("\n\n", 1)[0]
    return {
        m
        for row in table.splitlines()[2:]
        for m in re.findall(r"^\| `(AGENTINFRA_[A-Z_]+)` \|", row)
    }


def test_readme_table_lists_exactly_the_known_variables() -> None:
    assert readme_variables() == set(_KNOWN)


def test_log_level(monkeypatch: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(app, ["info", "--json"], env={"AGENTINFRA_LOG_LEVEL": "DEBUG"})
    assert result.exit_code == 0, result.output
    assert logging.getLogger().level == logging.DEBUG
    logging.getLogger().setLevel(logging.WARNING)


def test_kv_memory_disk_dir_and_disk(tmp_path: Path) -> None:
    env = {
        "AGENTINFRA_KV_MEMORY": "3MiB",
        "AGENTINFRA_KV_DISK_DIR": str(tmp_path / "d"),
        "AGENTINFRA_KV_DISK": "5MiB",
    }
    store = build_store(
        load_settings(env).kvcache
    )  # what `kv serve` builds without --memory/--disk
    try:
        stats = {tier.name: tier.capacity_bytes for tier in store.stats().tiers}
        assert stats["memory"] == 3 << 20
        assert stats["disk"] == 5 << 20
        assert (tmp_path / "d").is_dir()
    finally:
        store.close()
    override = build_store(load_settings(env).kvcache, memory="1MiB", disk_dir=tmp_path / "e")
    try:
        stats = {tier.name: tier.capacity_bytes for tier in override.stats().tiers}
        assert stats["memory"] == 1 << 20  # the option wins over the variable
        assert (tmp_path / "e").is_dir()
    finally:
        override.close()


def test_kv_block_size_reaches_explain(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(" ".join(str(i) for i in range(64)))
    server = ServerThread(TieredStore(MemoryTier(1 << 20)), ServerConfig(port=0))
    try:
        args = ["kv", "explain", str(tokens), "--model-id", "m", "--port", str(server.port)]
        result = CliRunner().invoke(app, args, env={"AGENTINFRA_KV_BLOCK_SIZE_TOKENS": "16"})
    finally:
        server.close()
    assert result.exit_code == 0, result.output
    assert "0/4 blocks hit" in result.output  # 64 tokens in blocks of 16


def test_grader_variables_reach_grading_options(tmp_path: Path) -> None:
    env = {"AGENTINFRA_GRADER_TIMEOUT_S": "33", "AGENTINFRA_GRADER_MEMORY": "1GiB",
           "AGENTINFRA_GRADER_MAX_PROCESSES": "17", "AGENTINFRA_GRADER_THREADS": "2",
           "AGENTINFRA_GRADER_DEVICE": "cuda", "AGENTINFRA_GRADER_FORK_SERVER": "off"}  # fmt: skip
    spec = start_spec("r", "kernels", PROBLEM, 1.0, load_settings(env))  # what `start` stores
    stored = KernelSettings.model_validate(json.loads(spec.model_dump_json())["settings"])
    options = GradeOptions.from_settings(stored, seed=None)  # what each of the run's gradings uses
    assert (options.timeout_s, options.memory_limit_bytes, options.max_processes, options.threads,
            options.device, options.fork_server) == (33.0, 1 << 30, 17, 2, "cuda", False)  # fmt: skip


def test_runs_dir_and_agent_settings_reach_run(tmp_path: Path) -> None:
    env = {"AGENTINFRA_RUNS_DIR": str(tmp_path / "runs"), "AGENTINFRA_AGENT_CONCURRENCY": "3",
           "AGENTINFRA_AGENT_REQUEST_TIMEOUT_S": "7", "TEST_KEY": "test-key"}  # fmt: skip
    with ScriptedModelServer(lambda body: Reply(content="nothing to do"), models=[MODEL]) as server:
        args = ["run", "--tasks", str(PROBLEM), "--model", MODEL, "--base-url", server.base_url,
                "--api-key-env", "TEST_KEY", "--max-turns", "1", "--no-stream"]  # fmt: skip
        result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    assert "concurrency 3" in " ".join(result.output.split())
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.name != "summaries"]
    (summary,) = (tmp_path / "runs").glob("summaries/*/summary.html")  # written when the runs end
    assert run.name in summary.read_text()
    loop = json.loads((run / "run.json").read_text())["spec"]["agent"]["loop"]
    assert loop["request_timeout_s"] == 7.0


def test_eval_workers_reach_the_live_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import agentinfra.cli._runs as runs

    seen: list[Any] = []
    original = runs.RunHarness

    def capture(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("eval_workers"))
        return original(*args, **kwargs)

    monkeypatch.setattr(runs, "RunHarness", capture)
    run = tmp_path / "run"
    RunDirectory.create(run, start_spec("r", "kernels", PROBLEM, 1.0, load_settings({})),
                        grader_version="x").close()  # fmt: skip
    RunLayout(run).request_finish()
    result = CliRunner().invoke(app, ["resume", str(run)], env={"AGENTINFRA_EVAL_WORKERS": "5"})
    assert result.exit_code == 0, result.output
    assert seen == [5]


def test_desktop_mirror_reaches_the_run_and_its_environment(tmp_path: Path) -> None:
    task = ROOT / "examples" / "desktop" / "tasks" / "os-mkdir.json"
    mirror = tmp_path / "mirror"
    spec = start_spec(
        "r", "desktop", task, 1.0, load_settings({"AGENTINFRA_DESKTOP_MIRROR": str(mirror)})
    )
    assert json.loads(spec.model_dump_json())["settings"] == {
        "mirror": str(mirror)
    }  # what `start` stores
    environment = open_environment(spec)  # what resume, regrade and a Ray worker open
    assert environment.mirror == mirror  # type: ignore[attr-defined]


def test_interpreters_reach_their_launchers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentinfra.engines import vllm_python
    from agentinfra.environments.desktop._session import desktop_python

    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setenv("AGENTINFRA_DESKTOP_PYTHON", str(python))
    monkeypatch.setenv("AGENTINFRA_VLLM_PYTHON", str(python))
    assert desktop_python() == python  # the desktop session starts this interpreter
    assert vllm_python() == python  # VllmServer starts vLLM with this one
    monkeypatch.setenv("AGENTINFRA_VLLM_PYTHON", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"no vLLM interpreter at .*missing"):
        vllm_python()


def test_every_variable_has_a_case() -> None:
    assert set(COVERED) == set(_KNOWN), f"no case for {sorted(set(_KNOWN) - set(COVERED))}"
    assert all(callable(globals().get(name)) for name in COVERED.values())

from __future__ import annotations

import json
import subprocess
import sys

import typer
from typer.testing import CliRunner

import agentinfra
from agentinfra.cli import app

runner = CliRunner()


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"agentinfra {agentinfra.__version__}"


COMMANDS = ["info", "grade", "start", "resume", "submit", "finish", "regrade", "report", "replay-run",
            "run", "export", "summary", "kv", "desktop", "rollouts", "model"]  # fmt: skip
SUBCOMMANDS = {
    "kv": ["compare", "demo", "explain", "gen-trace", "replay", "serve", "stats"],
    "desktop": ["audit", "run", "tasks"],
    "rollouts": ["run", "serve"],
    "model": ["serve"],
}


def test_help_lists_every_command_in_order_with_its_summary() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    assert list(commands) == COMMANDS
    text = " ".join(result.stdout.split())
    for name, command in commands.items():
        summary = " ".join((command.help or "").split("\n\n")[0].split())
        assert summary, f"{name} has no help"
        assert f"{name} {summary[:40]}" in text.replace("│ ", "").replace(" │", ""), name
    assert "--log-level" in result.stdout
    for group, names in SUBCOMMANDS.items():
        assert sorted(commands[group].commands) == names  # type: ignore[attr-defined]


def test_info_json() -> None:
    result = runner.invoke(app, ["info", "--json"])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.stdout)
    assert facts["agentinfra"] == agentinfra.__version__
    assert facts["kv_block_size_tokens"] == 256


def test_bad_log_level_is_a_usage_error() -> None:
    result = runner.invoke(app, ["--log-level", "LOUD", "info"])
    assert result.exit_code == 2


def test_python_dash_m_and_bad_setting_exit_2() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "agentinfra", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0
    assert ok.stdout.strip() == f"agentinfra {agentinfra.__version__}"
    bad = subprocess.run(
        [sys.executable, "-m", "agentinfra", "info"],
        capture_output=True,
        text=True,
        check=False,
        env={"AGENTINFRA_EVAL_WORKERS": "0", "PATH": "/usr/bin:/bin"},
    )
    assert bad.returncode == 2
    assert "eval_workers=0" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_unknown_environment_lists_the_registered_ones(tmp_path: object) -> None:
    task = __file__
    for args in (["start", f"{tmp_path}/run", "--task", task, "--env", "nope"],
                 ["run", "--env", "nope", "--tasks", task, "--model", "m", "--base-url", "http://127.0.0.1:9"]):  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-m", "agentinfra", *args], capture_output=True, text=True
        )
        assert out.returncode == 2, out.stderr
        assert "unknown environment 'nope'; available: desktop, kernels (--env)" in out.stderr

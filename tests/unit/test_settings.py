from __future__ import annotations

import ast
import dataclasses
import logging
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentinfra._settings import (
    _KNOWN,
    DesktopHostConfig,
    EnginesConfig,
    GraderConfig,
    HarnessConfig,
    KVCacheConfig,
    desktop_python_path,
    load_settings,
    parse_bool,
    parse_size,
    vllm_python_path,
)
from agentinfra.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("4GiB", 4 * 1024**3),
        ("4gib", 4 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("1.5GB", 1_500_000_000),
        (" 2 KiB ", 2048),
        ("10k", 10_000),
        ("0", 0),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-1", "4 GiBs", "four", "1e3"])
def test_parse_size_rejects_with_knob(text: str) -> None:
    with pytest.raises(ConfigError, match="AGENTINFRA_KV_MEMORY"):
        parse_size(text, knob="AGENTINFRA_KV_MEMORY")


@given(st.integers(min_value=0, max_value=10**15))
def test_parse_size_round_trips_integers(n: int) -> None:
    assert parse_size(str(n)) == n
    assert parse_size(f"{n}B") == n


@pytest.mark.parametrize(
    ("text", "expected"), [("1", True), ("TRUE", True), ("on", True), ("no", False), ("0", False)]
)
def test_parse_bool(text: str, expected: bool) -> None:
    assert parse_bool(text) is expected


def test_parse_bool_rejects() -> None:
    with pytest.raises(ConfigError, match="'maybe'"):
        parse_bool("maybe", knob="X")


def test_configs_are_frozen_and_validated() -> None:
    config = KVCacheConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.block_size_tokens = 1  # type: ignore[misc]
    with pytest.raises(ConfigError, match="block_size_tokens=0"):
        KVCacheConfig(block_size_tokens=0)
    with pytest.raises(ConfigError, match="AGENTINFRA_GRADER_TIMEOUT_S"):
        GraderConfig(timeout_s=0)
    with pytest.raises(ConfigError, match="eval_workers=0"):
        HarnessConfig(eval_workers=0)


def test_load_settings_from_mapping() -> None:
    settings = load_settings(
        {
            "AGENTINFRA_KV_MEMORY": "1GiB",
            "AGENTINFRA_KV_DISK_DIR": "/tmp/kv",
            "AGENTINFRA_EVAL_WORKERS": "4",
            "AGENTINFRA_GRADER_TIMEOUT_S": "2.5",
            "AGENTINFRA_LOG_LEVEL": "info",
            "PATH": "/bin",
        }
    )
    assert settings.kvcache.memory_capacity_bytes == 1024**3
    assert settings.kvcache.disk_dir == Path("/tmp/kv")
    assert settings.harness.eval_workers == 4
    assert settings.grader.timeout_s == 2.5
    assert settings.log_level == "INFO"


def test_load_settings_defaults() -> None:
    settings = load_settings({})
    assert settings.kvcache == KVCacheConfig()
    assert settings.log_level == "WARNING"


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"AGENTINFRA_EVAL_WORKERS": "many"}, "AGENTINFRA_EVAL_WORKERS='many'"),
        ({"AGENTINFRA_KV_MEMORY": "lots"}, "AGENTINFRA_KV_MEMORY"),
        ({"AGENTINFRA_LOG_LEVEL": "LOUD"}, "LOUD"),
        ({"AGENTINFRA_KV_BLOCK_SIZE_TOKENS": "0"}, "AGENTINFRA_KV_BLOCK_SIZE_TOKENS"),
    ],
)
def test_load_settings_errors_name_the_variable(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_settings(env)


def test_unknown_variable_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        load_settings({"AGENTINFRA_KV_MEMROY": "1GiB"})
    assert "AGENTINFRA_KV_MEMROY" in caplog.text


def test_machine_paths_are_settings_and_not_warned(caplog: pytest.LogCaptureFixture) -> None:
    env = {"AGENTINFRA_DESKTOP_PYTHON": "/opt/d/python", "AGENTINFRA_DESKTOP_MIRROR": "/srv/mirror",
           "AGENTINFRA_VLLM_PYTHON": "/opt/v/python"}  # fmt: skip
    with caplog.at_level(logging.WARNING):
        settings = load_settings(env)
    assert caplog.text == ""
    assert settings.desktop == DesktopHostConfig(
        python=Path("/opt/d/python"), mirror=Path("/srv/mirror")
    )
    assert settings.engines == EnginesConfig(vllm_python=Path("/opt/v/python"))
    assert desktop_python_path(env) == Path("/opt/d/python")
    assert vllm_python_path(env) == Path("/opt/v/python")
    assert (desktop_python_path({}), vllm_python_path({"AGENTINFRA_VLLM_PYTHON": ""})) == (
        None,
        None,
    )
    assert load_settings({}).desktop == DesktopHostConfig()


SRC = Path(__file__).resolve().parents[2] / "src" / "agentinfra"
_VARIABLE = re.compile(r"AGENTINFRA_[A-Z0-9_]*[A-Z0-9]")
_NOT_VARIABLES = {("kvcache/_disk_tier.py", "AGENTINFRA_KV_STORE")}
"""Names with the prefix that are not environment variables: the disk tier's marker file."""


def _reads(path: Path, root: Path = SRC) -> list[str]:
    """Lines where ``path`` names an ``AGENTINFRA_*`` variable in code, not prose: a string constant
    that is exactly a variable's name (``os.environ.get("AGENTINFRA_X")``, ``NAME = "AGENTINFRA_X"``),
    or an ``environ``/``getenv`` access on a line that has the prefix."""
    rel = path.relative_to(root).as_posix()
    text = path.read_text()
    tree = ast.parse(text)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }  # fmt: skip
    lines = {
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        and _VARIABLE.fullmatch(node.value) and (rel, node.value) not in _NOT_VARIABLES
    }  # fmt: skip
    lines |= {
        number
        for number, line in enumerate(text.splitlines(), 1)
        if "AGENTINFRA_" in line and re.search(r"\benviron\b|\bgetenv\b", line)
    }
    return [f"{rel}:{n} {text.splitlines()[n - 1].strip()}" for n in sorted(lines)]


def test_no_agentinfra_variable_is_read_outside_settings() -> None:
    reads = [
        r
        for path in sorted(SRC.rglob("*.py"))
        if path != SRC / "_settings.py"
        for r in _reads(path)
    ]
    assert reads == [], "AGENTINFRA_* read outside _settings.py (add it there):\n" + "\n".join(
        reads
    )


def test_every_variable_named_in_src_is_a_known_setting() -> None:
    texts = [path.read_text() for path in SRC.rglob("*.py")]
    named = {
        m.group()
        for text in texts
        for m in re.finditer(r"AGENTINFRA_[A-Z0-9_]+", text)
        if text[m.end() : m.end() + 1] != "*"  # a family (``AGENTINFRA_GRADER_*``), not one name
    }
    unknown = named - set(_KNOWN) - {name for _, name in _NOT_VARIABLES} - {"AGENTINFRA_PROBE"}
    assert unknown == set(), f"named in src/ but not read by _settings.py: {sorted(unknown)}"


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ('import os\nx = os.environ.get("AGENTINFRA_SECRET_KNOB")\n', [2]),
        ('import os\nNAME = "AGENTINFRA_OTHER"\ny = os.environ[NAME]\n', [2]),
        ('import os\nz = os.getenv(f"AGENTINFRA_{1}")\n', [2]),
        ('"""Set ``AGENTINFRA_DOC`` to change it."""\nhelp = "see AGENTINFRA_GRADER_DEVICE"\n', []),
    ],
)
def test_the_read_finder_finds_reads(tmp_path: Path, source: str, lines: list[int]) -> None:
    module = tmp_path / "_probe.py"
    module.write_text(source)
    assert [int(r.split(" ")[0].split(":")[1]) for r in _reads(module, tmp_path)] == lines

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentinfra._settings import (
    GraderConfig,
    HarnessConfig,
    KVCacheConfig,
    load_settings,
    parse_bool,
    parse_size,
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

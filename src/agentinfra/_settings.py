"""Settings: the only module that reads ``AGENTINFRA_*`` environment variables.

Each component has one frozen config dataclass whose field names carry their units
and whose ``__post_init__`` validates every field, raising `ConfigError` with the
offending value and the knob that sets it. `load_settings` builds all of them from
an environment mapping; library code receives configs and never reads
``os.environ`` itself.

Sizes are parsed by `parse_size` (``"4GiB"``, ``"512MB"``, ``"1048576"``) and booleans
by `parse_bool` (``1/0``, ``true/false``, ``yes/no``, ``on/off``); nothing else parses
either.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agentinfra.errors import ConfigError

__all__ = [
    "AgentConfig",
    "DesktopHostConfig",
    "ENV_PREFIX",
    "EnginesConfig",
    "GraderConfig",
    "HarnessConfig",
    "KVCacheConfig",
    "LogLevel",
    "Settings",
    "desktop_python_path",
    "format_size",
    "load_settings",
    "parse_bool",
    "parse_size",
    "vllm_python_path",
]

logger = logging.getLogger(__name__)

ENV_PREFIX = "AGENTINFRA_"

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]

_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def format_size(count: float) -> str:
    """``count`` bytes for people: ``512 B``, ``1.5 KiB``, ``4.0 GiB`` (the units `parse_size` reads)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return str(count)


def parse_size(text: str, *, knob: str = "size") -> int:
    """Parses a byte size such as ``"4GiB"``, ``"1.5 GB"`` or ``"4096"`` into bytes.

    Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (KB, MB, GB,
    TB, and the bare K, M, G, T) powers of 1000; units are case-insensitive.

    Raises:
        ConfigError: the text is not a non-negative size; the message names ``knob``.
    """
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise ConfigError(
            f"{knob}: cannot parse size {text!r}; use a number with an optional unit "
            "such as 4096, 512MiB, 4GiB or 1.5GB"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_bool(text: str, *, knob: str = "flag") -> bool:
    """Parses ``1/0``, ``true/false``, ``yes/no`` or ``on/off`` (any case).

    Raises:
        ConfigError: any other text; the message names ``knob``.
    """
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(
        f"{knob}: cannot parse boolean {text!r}; use 1/0, true/false, yes/no or on/off"
    )


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True, slots=True, kw_only=True)
class KVCacheConfig:
    """The KV-cache store's settings."""

    block_size_tokens: int = 256
    """Tokens per block; part of every block key (AGENTINFRA_KV_BLOCK_SIZE_TOKENS)."""
    memory_capacity_bytes: int = 4 * 1024**3
    """Bytes the in-process memory tier may hold (AGENTINFRA_KV_MEMORY)."""
    disk_dir: Path | None = None
    """Directory of the disk tier; None disables it (AGENTINFRA_KV_DISK_DIR)."""
    disk_capacity_bytes: int = 64 * 1024**3
    """Bytes the disk tier may hold (AGENTINFRA_KV_DISK)."""

    def __post_init__(self) -> None:
        _require(
            0 < self.block_size_tokens <= 1 << 20,
            f"block_size_tokens={self.block_size_tokens} must be in 1..1048576 "
            "(AGENTINFRA_KV_BLOCK_SIZE_TOKENS)",
        )
        _require(
            self.memory_capacity_bytes >= 0,
            f"memory_capacity_bytes={self.memory_capacity_bytes} must be >= 0 (AGENTINFRA_KV_MEMORY)",
        )
        _require(
            self.disk_capacity_bytes >= 0,
            f"disk_capacity_bytes={self.disk_capacity_bytes} must be >= 0 (AGENTINFRA_KV_DISK)",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class GraderConfig:
    """The kernel grader's sandbox and timing settings."""

    timeout_s: float = 120.0
    """Wall-clock limit for one candidate process (AGENTINFRA_GRADER_TIMEOUT_S)."""
    memory_limit_bytes: int | None = None
    """A cap on the candidate's memory limit (AGENTINFRA_GRADER_MEMORY). The limit itself is sized per
    problem from the reference's measured peak; None: no cap beyond what the machine can give."""
    max_processes: int = 64
    """Processes and threads the candidate may start (AGENTINFRA_GRADER_MAX_PROCESSES)."""
    threads: int = 1
    """Torch intra-op threads for both sides when timing on CPU (AGENTINFRA_GRADER_THREADS)."""
    device: str = "cpu"
    """Where runs grade kernels: cpu or cuda (AGENTINFRA_GRADER_DEVICE); a cuda run's machine samples come from NVML."""
    fork_server: bool = True
    """Fork CPU grading workers from a zygote with torch imported (AGENTINFRA_GRADER_FORK_SERVER)."""

    def __post_init__(self) -> None:
        _require(
            self.device in ("cpu", "cuda"),
            f"device={self.device!r} must be 'cpu' or 'cuda' (AGENTINFRA_GRADER_DEVICE)",
        )
        _require(
            self.timeout_s > 0,
            f"timeout_s={self.timeout_s} must be > 0 (AGENTINFRA_GRADER_TIMEOUT_S)",
        )
        _require(
            self.memory_limit_bytes is None or self.memory_limit_bytes >= 64 * 1024**2,
            f"memory_limit_bytes={self.memory_limit_bytes} must be >= 64MiB (AGENTINFRA_GRADER_MEMORY)",
        )
        _require(
            self.max_processes >= 1,
            f"max_processes={self.max_processes} must be >= 1 (AGENTINFRA_GRADER_MAX_PROCESSES)",
        )
        _require(
            self.threads >= 1, f"threads={self.threads} must be >= 1 (AGENTINFRA_GRADER_THREADS)"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class HarnessConfig:
    """The run harness's settings."""

    runs_dir: Path = Path("runs")
    """Where run directories are created (AGENTINFRA_RUNS_DIR)."""
    eval_workers: int = 2
    """Submissions graded at once (AGENTINFRA_EVAL_WORKERS)."""

    def __post_init__(self) -> None:
        _require(
            self.eval_workers >= 1,
            f"eval_workers={self.eval_workers} must be >= 1 (AGENTINFRA_EVAL_WORKERS)",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    """The agent loop's settings."""

    concurrency: int = 8
    """Runs driven at once on one event loop (AGENTINFRA_AGENT_CONCURRENCY)."""
    request_timeout_s: float = 600.0
    """Limit for one model call (AGENTINFRA_AGENT_REQUEST_TIMEOUT_S)."""

    def __post_init__(self) -> None:
        _require(
            self.concurrency >= 1,
            f"concurrency={self.concurrency} must be >= 1 (AGENTINFRA_AGENT_CONCURRENCY)",
        )
        _require(
            self.request_timeout_s > 0,
            f"request_timeout_s={self.request_timeout_s} must be > 0 "
            "(AGENTINFRA_AGENT_REQUEST_TIMEOUT_S)",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DesktopHostConfig:
    """Where this machine keeps what the desktop environment needs."""

    python: Path | None = None
    """The desktop's interpreter; None: ``<venv>/desktop/bin/python`` (AGENTINFRA_DESKTOP_PYTHON)."""
    mirror: Path | None = None
    """The OSWorld file mirror new desktop runs grade against; None: a ``mirror/`` folder
    beside the task's folder, if there is one (AGENTINFRA_DESKTOP_MIRROR)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EnginesConfig:
    """Where this machine keeps the inference engines agentinfra starts."""

    vllm_python: Path | None = None
    """vLLM's interpreter; None: the ``vllm`` venv inside this one (AGENTINFRA_VLLM_PYTHON)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every component's config, as built from the environment."""

    log_level: LogLevel = "WARNING"
    kvcache: KVCacheConfig = field(default_factory=KVCacheConfig)
    grader: GraderConfig = field(default_factory=GraderConfig)
    harness: HarnessConfig = field(default_factory=HarnessConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    desktop: DesktopHostConfig = field(default_factory=DesktopHostConfig)
    engines: EnginesConfig = field(default_factory=EnginesConfig)


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(ENV_PREFIX + name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}{name}={text!r} is not an integer") from None


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(ENV_PREFIX + name)
    if text is None:
        return default
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}{name}={text!r} is not a number") from None


def _size(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(ENV_PREFIX + name)
    return default if text is None else parse_size(text, knob=ENV_PREFIX + name)


def _optional_size(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(ENV_PREFIX + name)
    return None if not text else parse_size(text, knob=ENV_PREFIX + name)


def _path(env: Mapping[str, str], name: str) -> Path | None:
    text = env.get(ENV_PREFIX + name)
    return Path(text) if text else None


_KNOWN = frozenset(
    ENV_PREFIX + n
    for n in (
        "LOG_LEVEL",
        "KV_BLOCK_SIZE_TOKENS",
        "KV_MEMORY",
        "KV_DISK_DIR",
        "KV_DISK",
        "GRADER_TIMEOUT_S",
        "GRADER_MEMORY",
        "GRADER_MAX_PROCESSES",
        "GRADER_THREADS",
        "GRADER_DEVICE",
        "GRADER_FORK_SERVER",
        "RUNS_DIR",
        "EVAL_WORKERS",
        "AGENT_CONCURRENCY",
        "AGENT_REQUEST_TIMEOUT_S",
        "DESKTOP_PYTHON",
        "DESKTOP_MIRROR",
        "VLLM_PYTHON",
    )
)


def desktop_python_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """``AGENTINFRA_DESKTOP_PYTHON`` of ``environ`` (the process environment when None); None when unset.

    For the desktop session, which starts its interpreter wherever it runs; `load_settings`
    reads the same variable through here.
    """
    return _path(os.environ if environ is None else environ, "DESKTOP_PYTHON")


def vllm_python_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """``AGENTINFRA_VLLM_PYTHON`` of ``environ`` (the process environment when None); None when unset.

    For the vLLM launcher, which starts vLLM wherever it runs; `load_settings` reads the
    same variable through here.
    """
    return _path(os.environ if environ is None else environ, "VLLM_PYTHON")


def _log_level(env: Mapping[str, str]) -> LogLevel:
    text = env.get(ENV_PREFIX + "LOG_LEVEL", "WARNING").upper()
    if text not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(
            f"{ENV_PREFIX}LOG_LEVEL={text!r} is not one of DEBUG, INFO, WARNING, ERROR"
        )
    return text  # type: ignore[return-value]


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Builds `Settings` from ``environ`` (the process environment when None).

    Unknown ``AGENTINFRA_*`` names are logged as warnings: they are usually typos.

    Raises:
        ConfigError: a variable has a value that cannot be parsed or is out of range.
    """
    env = os.environ if environ is None else environ
    for name in sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in _KNOWN):
        logger.warning("ignoring unknown environment variable %s", name)
    defaults = Settings()
    return Settings(
        log_level=_log_level(env),
        kvcache=KVCacheConfig(
            block_size_tokens=_int(env, "KV_BLOCK_SIZE_TOKENS", defaults.kvcache.block_size_tokens),
            memory_capacity_bytes=_size(env, "KV_MEMORY", defaults.kvcache.memory_capacity_bytes),
            disk_dir=_path(env, "KV_DISK_DIR"),
            disk_capacity_bytes=_size(env, "KV_DISK", defaults.kvcache.disk_capacity_bytes),
        ),
        grader=GraderConfig(
            timeout_s=_float(env, "GRADER_TIMEOUT_S", defaults.grader.timeout_s),
            memory_limit_bytes=_optional_size(env, "GRADER_MEMORY"),
            max_processes=_int(env, "GRADER_MAX_PROCESSES", defaults.grader.max_processes),
            threads=_int(env, "GRADER_THREADS", defaults.grader.threads),
            device=env.get(ENV_PREFIX + "GRADER_DEVICE", defaults.grader.device),
            fork_server=parse_bool(
                env.get(ENV_PREFIX + "GRADER_FORK_SERVER", "1"),
                knob=ENV_PREFIX + "GRADER_FORK_SERVER",
            ),
        ),
        harness=HarnessConfig(
            runs_dir=_path(env, "RUNS_DIR") or defaults.harness.runs_dir,
            eval_workers=_int(env, "EVAL_WORKERS", defaults.harness.eval_workers),
        ),
        agent=AgentConfig(
            concurrency=_int(env, "AGENT_CONCURRENCY", defaults.agent.concurrency),
            request_timeout_s=_float(
                env, "AGENT_REQUEST_TIMEOUT_S", defaults.agent.request_timeout_s
            ),
        ),
        desktop=DesktopHostConfig(
            python=desktop_python_path(env), mirror=_path(env, "DESKTOP_MIRROR")
        ),
        engines=EnginesConfig(vllm_python=vllm_python_path(env)),
    )

"""The desktop environment's own settings (`DesktopSettings`) and its agent's options (`DesktopAgentOptions`).

Both are what the desktop's `EnvironmentDefinition` declares: the settings are
stored in a run's ``run.json`` (``spec.settings``), the options in its
``agent.options`` (``--env-option KEY=VALUE``, or the ``run`` command's
``--action-space``, ``--track``, ``--observation``, ``--screenshot-width`` and
``--desktops``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from agentinfra._settings import Settings
from agentinfra.environments.desktop._actions import ACTION_SPACES, TRACKS
from agentinfra.environments.desktop._coordinates import convention_for
from agentinfra.errors import ConfigError

__all__ = ["OBSERVATIONS", "DesktopAgentOptions", "DesktopSettings", "desktop_settings"]

OBSERVATIONS = ("screenshot", "a11y", "both")


class DesktopSettings(BaseModel):
    """How a desktop run grades; stored in ``run.json`` (``spec.settings``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mirror: str | None = None
    """The OSWorld file mirror the run grades against (AGENTINFRA_DESKTOP_MIRROR when the run
    was created); None: a ``mirror/`` folder beside the task's folder, if there is one."""


def desktop_settings(settings: Settings) -> DesktopSettings:
    """A new desktop run's settings: the mirror of ``AGENTINFRA_DESKTOP_MIRROR``."""
    mirror = settings.desktop.mirror
    return DesktopSettings(mirror=None if mirror is None else str(mirror))


class DesktopAgentOptions(BaseModel):
    """A desktop run's agent options (``run.json``: ``agent.options``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action_space: str = "computer_use"
    track: str = "gui-only"
    observation: str = "both"
    screenshot_width: int = 1280
    coordinates: str = "screenshot"
    """The computer tool's coordinate convention, or the model family whose it is (`_coordinates`)."""
    a11y_tokens: int = 4_000
    desktops: int = 2
    width: int = 1920
    height: int = 1080

    @model_validator(mode="after")
    def _check(self) -> DesktopAgentOptions:
        if self.action_space not in ACTION_SPACES:
            raise ConfigError(
                f"unknown action space {self.action_space!r}; use one of {', '.join(ACTION_SPACES)} (--action-space)"
            )
        if self.track not in TRACKS:
            raise ConfigError(
                f"unknown track {self.track!r}; use one of {', '.join(TRACKS)} (--track)"
            )
        if self.observation not in OBSERVATIONS:
            raise ConfigError(
                f"unknown observation {self.observation!r}; use one of {', '.join(OBSERVATIONS)} (--observation)"
            )
        if not 160 <= self.screenshot_width <= self.width:
            raise ConfigError(
                f"screenshot width {self.screenshot_width} must be in 160..{self.width} (--screenshot-width)"
            )
        try:
            convention_for(self.coordinates)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.coordinates != "screenshot" and self.action_space != "computer_use":
            raise ConfigError(
                f"coordinates={self.coordinates!r} applies to the computer_use action space, not "
                f"{self.action_space!r}, whose coordinates are the screen's (--env-option coordinates)"
            )
        if self.desktops < 1:
            raise ConfigError(f"--desktops must be at least 1, got {self.desktops}")
        return self

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> DesktopAgentOptions:
        """The options of ``options`` (a run's ``agent.options``).

        Raises:
            ConfigError: an unknown option, or a value out of range (the message names the flag).
        """
        known = set(cls.model_fields)
        unknown = set(options) - known
        if unknown:
            raise ConfigError(
                f"unknown desktop agent option(s) {sorted(unknown)}; known: {sorted(known)}"
            )
        try:
            return cls.model_validate(options)
        except ValidationError as exc:
            error = exc.errors()[0]
            cause = (error.get("ctx") or {}).get("error")
            if isinstance(cause, ConfigError):
                raise cause from None
            key = ".".join(str(p) for p in error["loc"])
            raise ConfigError(
                f"desktop agent option {key}={options.get(key)!r}: {error['msg']}"
            ) from None

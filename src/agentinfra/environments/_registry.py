"""The environment registry: names to `EnvironmentDefinition`\\ s.

Built-in environments are listed here by import path (imported only when
asked for); a third-party package adds one through an entry point in the
``agentinfra.environments`` group whose object is an `EnvironmentDefinition`::

    [project.entry-points."agentinfra.environments"]
    myenv = "mypackage.env:DEFINITION"

`register_environment` adds one at run time (tests, notebooks) and
`unregister_environment` takes it away again.
"""

from __future__ import annotations

import importlib
import threading
from importlib.metadata import entry_points
from typing import Any

from agentinfra.environments._types import EnvironmentDefinition
from agentinfra.errors import ConfigError

__all__ = [
    "ENTRY_POINT_GROUP",
    "environment_definition",
    "environment_names",
    "register_environment",
    "unregister_environment",
]

ENTRY_POINT_GROUP = "agentinfra.environments"
_BUILTIN = {
    "kernels": "agentinfra.environments.kernels:ENVIRONMENT",
    "desktop": "agentinfra.environments.desktop:ENVIRONMENT",
}
_registered: dict[str, EnvironmentDefinition[Any]] = {}
_lock = threading.Lock()


def register_environment(definition: EnvironmentDefinition[Any], *, replace: bool = False) -> None:
    """Adds ``definition`` under its name.

    Raises:
        ConfigError: the name is taken and ``replace`` is False.
    """
    with _lock:
        if definition.name in _registered and not replace:
            raise ConfigError(f"environment {definition.name!r} is already registered")
        _registered[definition.name] = definition


def unregister_environment(name: str) -> None:
    """Forgets the definition registered (or loaded) as ``name``; a built-in or an entry point
    is loaded again when next asked for. Nothing happens when there is none."""
    with _lock:
        _registered.pop(name, None)


def _sources() -> dict[str, str]:
    """Import paths of every known environment: built-ins, then entry points."""
    found = dict(_BUILTIN)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(point.name, point.value)
    return found


def environment_names() -> list[str]:
    """Every environment that can be asked for, sorted."""
    return sorted(set(_sources()) | set(_registered))


def environment_definition(name: str) -> EnvironmentDefinition[Any]:
    """The definition registered as ``name`` (loaded on first use).

    Raises:
        ConfigError: no such environment (the message lists those that exist), or
            its entry point does not load to an `EnvironmentDefinition`.
    """
    with _lock:
        if name in _registered:
            return _registered[name]
    target = _sources().get(name)
    if target is None:
        raise ConfigError(
            f"unknown environment {name!r}; available: {', '.join(environment_names())} (--env)"
        )
    module_name, _, attribute = target.partition(":")
    try:
        definition = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"environment {name!r} ({target}) cannot be loaded: {exc}") from None
    if not isinstance(definition, EnvironmentDefinition) or definition.name != name:
        raise ConfigError(
            f"environment {name!r} ({target}) is not an EnvironmentDefinition named {name!r}"
        )
    with _lock:
        return _registered.setdefault(name, definition)

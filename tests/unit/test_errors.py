from __future__ import annotations

import importlib
import inspect
import pkgutil

import agentinfra
from agentinfra import errors


def _exported_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class in the ``__all__`` of `agentinfra.errors` and of every agentinfra package."""
    modules = [errors] + [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(agentinfra.__path__, "agentinfra.")
        if info.ispkg
    ]
    found: dict[str, type[BaseException]] = {}
    for module in modules:
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            if inspect.isclass(value) and issubclass(value, BaseException):
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_error_descends_from_the_root() -> None:
    classes = [getattr(errors, name) for name in errors.__all__]
    for cls in classes:
        assert issubclass(cls, errors.AgentInfraError)


def test_every_exported_exception_of_every_package_descends_from_the_root() -> None:
    exported = _exported_exceptions()
    assert errors.ForkServerError in exported.values()
    assert len({name.rsplit(".", 1)[0] for name in exported}) > 1, (
        "the walk found only agentinfra.errors"
    )
    outside = sorted(
        n for n, cls in exported.items() if not issubclass(cls, errors.AgentInfraError)
    )
    assert outside == [], f"exported exceptions outside the tree: {outside}"


def test_docstring_draws_every_class() -> None:
    doc = inspect.getdoc(errors) or ""
    for name in errors.__all__:
        assert name in doc, f"{name} is missing from the tree in errors' docstring"


def test_component_bases() -> None:
    assert issubclass(errors.StoreLockedError, errors.KVCacheError)
    assert issubclass(errors.TraceFormatError, errors.KVCacheError)
    assert issubclass(errors.ConfigError, ValueError)
    assert not issubclass(errors.HarnessError, errors.KVCacheError)


def test_sandbox_errors_sit_under_sandbox_error() -> None:
    assert issubclass(errors.ForkServerError, errors.SandboxError)
    assert issubclass(errors.UidExhaustedError, errors.SandboxError)
    assert issubclass(errors.UidExhaustedError, RuntimeError)  # what it was before the tree held it
    assert not issubclass(errors.SandboxError, errors.TaskEnvironmentError)

from __future__ import annotations

import inspect

from agentinfra import errors


def test_every_error_descends_from_the_root() -> None:
    classes = [getattr(errors, name) for name in errors.__all__]
    for cls in classes:
        assert issubclass(cls, errors.AgentInfraError)


def test_docstring_draws_every_class() -> None:
    doc = inspect.getdoc(errors) or ""
    for name in errors.__all__:
        assert name in doc, f"{name} is missing from the tree in errors' docstring"


def test_component_bases() -> None:
    assert issubclass(errors.StoreLockedError, errors.KVCacheError)
    assert issubclass(errors.TraceFormatError, errors.KVCacheError)
    assert issubclass(errors.ConfigError, ValueError)
    assert not issubclass(errors.HarnessError, errors.KVCacheError)

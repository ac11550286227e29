"""`agentinfra._pyast.parse`: threads parsing at once, the race CPython 3.11 has without it."""

from __future__ import annotations

import ast
import gc
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agentinfra import _pyast

SRC = Path(__file__).resolve().parents[2] / "src" / "agentinfra"
SOURCE = (SRC / "environments" / "kernels" / "_grader.py").read_text()


class _Cycle:
    """Garbage whose finaliser runs bytecode, so a collection mid-parse can switch threads."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        sum(range(50))


def _errors_from_threads(parse: Callable[[str], ast.Module]) -> list[BaseException]:
    errors: list[BaseException] = []

    def work() -> None:
        for _ in range(30):
            junk = [_Cycle() for _ in range(200)]
            del junk
            try:
                parse(SOURCE)
            except SystemError as exc:
                errors.append(exc)

    threshold = gc.get_threshold()
    gc.set_threshold(50)
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.set_threshold(*threshold)
    return errors


def test_four_threads_parsing_at_once_never_fail() -> None:
    assert _errors_from_threads(_pyast.parse) == []


def test_a_syntax_error_is_still_a_syntax_error() -> None:
    with pytest.raises(SyntaxError):
        _pyast.parse("def (:", filename="bad.py")


def test_no_module_calls_ast_parse_itself() -> None:
    callers = [
        path.relative_to(SRC).as_posix()
        for path in SRC.rglob("*.py")
        if path.name != "_pyast.py"
        and "ast.parse(" in path.read_text().replace("_pyast.parse(", "")
    ]
    assert callers == []

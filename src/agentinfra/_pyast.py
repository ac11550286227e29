"""``ast.parse`` for threaded callers.

CPython 3.11 keeps the AST constructor's recursion depth in interpreter-wide state, so two
threads parsing at once can fail with ``SystemError: AST constructor recursion depth
mismatch`` (python/cpython#106905). Gradings run on worker threads (`grade_async`), and each
parses its problem and submission, so every parse in agentinfra goes through one lock.
"""

from __future__ import annotations

import ast
import threading

__all__ = ["parse"]

_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)``, one thread at a time.

    Raises:
        SyntaxError: as ``ast.parse``.
    """
    with _LOCK:
        return ast.parse(source, filename=filename)

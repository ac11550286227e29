"""Problem files: KernelBench format plus an optional ``AGENTINFRA = {...}`` dict.

The supervisor never imports a problem: it reads the metadata dict with
``ast.literal_eval`` (no code runs) and hands the file to the reference worker.
Everything has a default when the dict is absent, so KernelBench problems load
unchanged.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentinfra import _pyast
from agentinfra.errors import TaskEnvironmentError

__all__ = ["ProblemMeta", "load_problem_meta", "parse_problem_meta"]

_KNOWN_KEYS = frozenset(
    {"atol", "rtol", "variants", "shape_variants", "flops", "bytes", "description"}
)
_DEFAULT_VARIANTS = ("base", "scaled", "shifted", "sign_flipped")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProblemMeta:
    """A problem's metadata, read without executing it."""

    path: Path
    sha256: str
    atol: float = 1e-4
    rtol: float = 1e-4
    variants: tuple[str, ...] = _DEFAULT_VARIANTS
    shape_variants: tuple[dict[str, int], ...] = ()
    flops: float | None = None
    bytes: float | None = None
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _names_defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
    return names


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}


def _constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level ``NAME = <number>`` assignments (evaluated without running code)."""
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets[0]
            values = node.value
            pairs = (
                zip(targets.elts, values.elts, strict=False)
                if isinstance(targets, ast.Tuple) and isinstance(values, ast.Tuple)
                else [(targets, values)]
            )
            for target, value in pairs:
                if isinstance(target, ast.Name):
                    with contextlib.suppress(ValueError, TypeError, KeyError, ZeroDivisionError):
                        found[target.id] = _evaluate(value, found)
    return found


def _evaluate(node: ast.expr, names: dict[str, Any]) -> Any:
    """Literals plus arithmetic on numbers and earlier module constants; nothing else runs."""
    if isinstance(node, ast.Name):
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left, names), _evaluate(node.right, names)
        if not all(isinstance(v, int | float) for v in (left, right)) or (
            isinstance(node.op, ast.Pow) and abs(right) > 64
        ):
            raise ValueError("only numbers")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, names)
    if isinstance(node, ast.Dict):
        return {
            _evaluate(k, names): _evaluate(v, names)
            for k, v in zip(node.keys, node.values, strict=True)
            if k is not None
        }
    if isinstance(node, ast.List | ast.Tuple):
        return [_evaluate(item, names) for item in node.elts]
    return ast.literal_eval(node)


def load_problem_meta(path: Path) -> ProblemMeta:
    """Parses ``path`` (without running it) and returns its metadata.

    Raises:
        TaskEnvironmentError: unreadable, not Python, missing ``Model``/``get_inputs``/
            ``get_init_inputs``, or an ``AGENTINFRA`` dict that is not a literal.
    """
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise TaskEnvironmentError(f"cannot read problem {path}: {exc.strerror}") from None
    return parse_problem_meta(source, path)


def parse_problem_meta(source: bytes, path: Path) -> ProblemMeta:
    """The metadata of a problem's ``source`` (never run); ``path`` names it in messages.

    Raises:
        TaskEnvironmentError: as `load_problem_meta`, bar reading.
    """
    try:
        tree = _pyast.parse(source, filename=str(path))
    except SyntaxError as exc:
        raise TaskEnvironmentError(
            f"problem {path} is not valid Python: line {exc.lineno}: {exc.msg}"
        ) from None
    missing = {"Model", "get_inputs", "get_init_inputs"} - _names_defined(tree)
    if missing:
        raise TaskEnvironmentError(
            f"problem {path} lacks {', '.join(sorted(missing))} (KernelBench format)"
        )
    meta: dict[str, Any] = {}
    constants = _constants(tree)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "AGENTINFRA" for t in node.targets
        ):
            try:
                meta = _evaluate(node.value, constants)
            except (ValueError, TypeError, KeyError, ZeroDivisionError):
                raise TaskEnvironmentError(
                    f"problem {path}: AGENTINFRA must be a dict of literals and arithmetic on module constants"
                ) from None
    if not isinstance(meta, dict):
        raise TaskEnvironmentError(f"problem {path}: AGENTINFRA must be a dict")
    unknown = set(meta) - _KNOWN_KEYS
    variants = tuple(meta.get("variants", _DEFAULT_VARIANTS))
    bad = [v for v in variants if v not in _DEFAULT_VARIANTS]
    if bad:
        raise TaskEnvironmentError(
            f"problem {path}: unknown variants {bad}; choose from {list(_DEFAULT_VARIANTS)}"
        )
    return ProblemMeta(
        path=path,
        sha256=hashlib.sha256(source).hexdigest(),
        atol=float(meta.get("atol", 1e-4)),
        rtol=float(meta.get("rtol", 1e-4)),
        variants=variants or ("base",),
        shape_variants=tuple(dict(v) for v in meta.get("shape_variants", ())),
        flops=float(meta["flops"]) if "flops" in meta else None,
        bytes=float(meta["bytes"]) if "bytes" in meta else None,
        description=str(meta.get("description", "")),
        extra={k: meta[k] for k in unknown},
    )

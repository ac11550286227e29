"""Output comparison: a candidate's output bytes against the reference's, within the problem's tolerance.

Pure: numpy over bytes copied out of the workers, no I/O, nothing from either
side executed. The rule (module docstring of `_grader`): exact dtype and shape;
integer and bool outputs equal; floating outputs finite where the reference is,
the same non-finite values, and within ``atol * scale + rtol * |reference|``
elementwise, ``scale`` being the reference's largest finite magnitude. NaN never passes.

Both outputs are read in place, a run of `CHUNK_ELEMENTS` at a time widened to
float64: the supervisor's memory for a comparison is `COMPARE_BYTES` whatever the
output's size (it once widened both outputs whole, about ten times a float32 output).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentinfra.environments.kernels._problem import ProblemMeta
from agentinfra.environments.kernels._wire import DTYPE_BYTES, TensorBytes

__all__ = ["COMPARE_BYTES", "CHUNK_ELEMENTS", "Comparison", "compare"]

CHUNK_ELEMENTS = 1 << 19
"""Elements of each output widened at a time."""
COMPARE_BYTES = 12 * 8 * CHUNK_ELEMENTS
"""The most a comparison holds: a dozen float64 arrays of one chunk (both sides, masks, errors)."""

_NUMPY = {
    "float64": "<f8", "float32": "<f4", "float16": "<f2", "int64": "<i8", "int32": "<i4",
    "int16": "<i2", "int8": "i1", "uint8": "u1", "bool": "u1",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Comparison:
    """Whether an output matched, and why not (empty when it did)."""

    ok: bool
    message: str


def _chunks(item: TensorBytes, chunk: int) -> Iterator[np.ndarray[Any, Any]]:
    """``item``'s elements in runs of ``chunk`` (`_values`)."""
    for start in range(0, item.numel, chunk):
        yield _values(item, start, min(chunk, item.numel - start))


def _values(item: TensorBytes, start: int, count: int) -> np.ndarray[Any, Any]:
    """``count`` elements of ``item`` from ``start``: floating dtypes widened to float64, bool as
    bool, integers as they are (views of the bytes). Widening a signalling NaN, as uninitialised
    memory can hold, is no warning: it is a NaN like any other here."""
    offset = start * DTYPE_BYTES[item.dtype]
    with np.errstate(invalid="ignore"):
        if item.dtype == "bfloat16":  # the top half of a float32: widened exactly
            raw = np.frombuffer(item.data, "<u2", count, offset).astype("<u4") << 16
            return raw.view("<f4").astype(np.float64)
        values = np.frombuffer(item.data, _NUMPY[item.dtype], count, offset)
        if item.dtype == "bool":
            truth: np.ndarray[Any, Any] = values != 0
            return truth
        return values.astype(np.float64) if values.dtype.kind == "f" else values


def compare(
    got: TensorBytes, want: TensorBytes, meta: ProblemMeta, *, chunk: int = CHUNK_ELEMENTS
) -> Comparison:
    """``got`` (the candidate's) against ``want`` (the reference's) under ``meta``'s tolerance."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return Comparison(
            False, f"output {got.dtype}{list(got.shape)} != expected {want.dtype}{list(want.shape)}"
        )
    if not (got.dtype.startswith("float") or got.dtype == "bfloat16"):  # integers and bool
        equal = all(
            np.array_equal(a, b)
            for a, b in zip(_chunks(got, chunk), _chunks(want, chunk), strict=True)
        )
        return Comparison(equal, "" if equal else "integer/bool output differs")
    # first pass: NaN, where each side is finite, and the reference's scale
    nan_got = 0
    nan_want = nonfinite_differ = False
    scale = 0.0
    for a, b in zip(_chunks(got, chunk), _chunks(want, chunk), strict=True):
        finite = np.isfinite(b)
        nan_got += int(np.isnan(a).sum())
        nan_want = nan_want or bool(np.isnan(b).any())
        if not nonfinite_differ:
            nonfinite_differ = not np.array_equal(np.isfinite(a), finite) or not np.array_equal(
                a[~finite], b[~finite]
            )
        if finite.any():
            scale = max(scale, float(np.abs(b[finite]).max()))
    if nan_got and not nan_want:
        return Comparison(False, f"output has {nan_got} NaN values where the reference has none")
    if nonfinite_differ:
        return Comparison(False, "non-finite values differ from the reference")
    # second pass: the tolerance, element by element
    bad = elements = 0
    worst = 0.0
    floor = meta.atol * max(scale, 1e-6)
    for a, b in zip(_chunks(got, chunk), _chunks(want, chunk), strict=True):
        finite = np.isfinite(b)
        expected = b[finite]
        error = np.abs(a[finite] - expected)
        bad += int((error > floor + meta.rtol * np.abs(expected)).sum())
        elements += error.size
        if error.size:
            worst = max(worst, float(error.max()))
    if bad:
        return Comparison(
            False,
            f"{bad} of {elements} elements out of tolerance (max abs error {worst:.3g}, output scale {scale:.3g})",
        )
    return Comparison(True, "")

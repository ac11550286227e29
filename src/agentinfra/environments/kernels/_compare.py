"""Output comparison: a candidate's output bytes against the reference's, within the problem's tolerance.

Pure: numpy over bytes copied out of the workers, no I/O, nothing from either
side executed. The rule (module docstring of `_grader`): exact dtype and shape;
integer and bool outputs equal; floating outputs finite where the reference is,
the same non-finite values, and within ``atol * scale + rtol * |reference|``
elementwise, ``scale`` being the reference's largest finite magnitude. NaN never passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from agentinfra.environments.kernels._problem import ProblemMeta
from agentinfra.environments.kernels._wire import TensorBytes

__all__ = ["Comparison", "compare", "to_array"]


@dataclass(frozen=True, slots=True)
class Comparison:
    """Whether an output matched, and why not (empty when it did)."""

    ok: bool
    message: str


def to_array(item: TensorBytes) -> np.ndarray[Any, Any]:
    """``item`` as a numpy array; floating dtypes widened to float64, bool kept."""
    import torch

    flat = (
        torch.frombuffer(bytearray(item.data), dtype=torch.uint8)
        if item.data
        else torch.empty(0, dtype=torch.uint8)
    )
    if item.dtype == "bool":
        return flat.numpy().astype(bool).reshape(item.shape)
    tensor = flat.view(getattr(torch, item.dtype)).reshape(item.shape)
    if tensor.is_floating_point():
        tensor = tensor.double()
    return tensor.numpy()


def compare(got: TensorBytes, want: TensorBytes, meta: ProblemMeta) -> Comparison:
    """``got`` (the candidate's) against ``want`` (the reference's) under ``meta``'s tolerance."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return Comparison(
            False, f"output {got.dtype}{list(got.shape)} != expected {want.dtype}{list(want.shape)}"
        )
    a, b = to_array(got), to_array(want)
    if a.dtype == bool or not np.issubdtype(b.dtype, np.floating):
        equal = bool(np.array_equal(a, b))
        return Comparison(equal, "" if equal else "integer/bool output differs")
    finite = np.isfinite(b)
    if np.isnan(a).any() and not np.isnan(b).any():
        return Comparison(
            False, f"output has {int(np.isnan(a).sum())} NaN values where the reference has none"
        )
    if not np.array_equal(np.isfinite(a), finite) or not np.array_equal(a[~finite], b[~finite]):
        return Comparison(False, "non-finite values differ from the reference")
    scale = float(np.abs(b[finite]).max()) if finite.any() else 0.0
    error = np.abs(a[finite] - b[finite])
    limit = meta.atol * max(scale, 1e-6) + meta.rtol * np.abs(b[finite])
    bad = int((error > limit).sum())
    if bad:
        worst = float(error.max())
        return Comparison(
            False,
            f"{bad} of {error.size} elements out of tolerance (max abs error {worst:.3g}, output scale {scale:.3g})",
        )
    return Comparison(True, "")

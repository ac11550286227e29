"""The roofline position reported with every timed verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentinfra.environments.kernels._judgements import utilisation
from agentinfra.environments.kernels._problem import ProblemMeta
from agentinfra.environments.kernels._verdict import ERROR_LIMIT, capped_error

PEAKS = {"flops_per_s": 100e9, "bytes_per_s": 10e9}  # ridge point: 10 FLOP per byte


def meta(flops: float | None = None, bytes_: float | None = None) -> ProblemMeta:
    return ProblemMeta(path=Path("p.py"), sha256="0" * 64, flops=flops, bytes=bytes_)


def test_a_compute_bound_kernel_is_measured_against_the_flop_roof() -> None:
    use = utilisation(meta(flops=50e9, bytes_=1e9), PEAKS, 1.0, io_bytes=123)
    assert use is not None
    assert use.bound == "compute"
    assert use.arithmetic_intensity == pytest.approx(50)
    assert use.flops_fraction == pytest.approx(0.5)
    assert use.roofline_fraction == pytest.approx(0.5)
    assert use.bytes_source == "problem"


def test_a_memory_bound_kernel_is_measured_against_the_bandwidth_roof() -> None:
    use = utilisation(meta(flops=2e9, bytes_=1e9), PEAKS, 0.5, io_bytes=123)
    assert use is not None
    assert use.bound == "memory"
    assert use.bytes_per_s == pytest.approx(2e9)
    # roof at intensity 2 is 20 GFLOP/s; 4 GFLOP/s achieved
    assert use.roofline_fraction == pytest.approx(0.2)


def test_without_metadata_bytes_are_estimated_from_inputs_and_output() -> None:
    use = utilisation(meta(), PEAKS, 0.001, io_bytes=5_000_000)
    assert use is not None
    assert use.bytes_source == "estimate: inputs + output"
    assert use.flops_per_s is None
    assert use.flops_fraction is None
    assert use.bound == "memory"
    assert use.roofline_fraction == pytest.approx(0.5)


def test_no_peaks_no_utilisation() -> None:
    assert utilisation(meta(flops=1.0), {}, 1.0, io_bytes=1) is None


def test_a_long_error_keeps_its_head_and_tail_within_the_limit() -> None:
    error = "head " + "x" * 10_000 + " tail"
    capped = capped_error(error)
    assert len(capped) <= ERROR_LIMIT
    assert capped.startswith("head ")
    assert capped.endswith(" tail")
    assert "characters cut" in capped
    assert capped_error("short") == "short"

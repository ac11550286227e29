"""Where a run's time went, from journalled timestamps; the machine sampler's two sources."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agentinfra._journal import Event
from agentinfra.harness._walltime import MachineSampler, wall_time_breakdown


def ev(seq: int, at: float, type_: str, **data: Any) -> Event:
    return Event(seq, at, at, type_, data)


def test_the_breakdown_partitions_the_agent_and_measures_the_pool() -> None:
    journal = [
        ev(0, 100.0, "submission_received", sha256="a"),
        ev(1, 101.0, "grading_started", sha256="a", workers=2),
        ev(2, 104.0, "submission_received", sha256="b"),
        ev(3, 104.0, "grading_started", sha256="b", workers=2),
        ev(4, 106.0, "graded", sha256="a"),
        ev(5, 110.0, "graded", sha256="b"),
        ev(6, 110.0, "machine_sample", source="proc", cpu_busy=0.5),
        ev(7, 115.0, "machine_sample", source="proc", cpu_busy=0.7),
    ]
    transcript = [
        ev(0, 100.0, "loop_started"),
        ev(1, 103.0, "model_response", latency_s=3.0),
        ev(2, 103.0, "tool_started", call_id="c1"),
        ev(3, 105.0, "tool_result", call_id="c1"),
        ev(4, 108.0, "model_response", latency_s=2.0),
        ev(5, 120.0, "stopped"),
    ]
    out = wall_time_breakdown(journal, transcript)
    assert out["span_s"] == 20.0
    assert out["agent"] == {"span_s": 20.0, "model_s": 5.0, "tools_s": 2.0, "idle_s": 13.0,
                            "model_calls": 2, "tool_calls": 1}  # fmt: skip
    grading = out["grading"]
    assert (grading["workers"], grading["gradings"], grading["grading_s"], grading["queue_s"]) == (
        2,
        2,
        11.0,
        1.0,
    )
    assert grading["busy_fraction"] == round(11.0 / (20.0 * 2), 4)
    assert grading["timeline"] == [(1.0, 1), (4.0, 2), (6.0, 1), (10.0, 0)]
    assert out["lanes"]["model"] == [(0.0, 3.0), (6.0, 8.0)]
    assert out["machine"]["source"] == "proc"
    assert out["machine"]["mean"] == 0.6


def test_an_empty_run_and_a_run_without_an_agent() -> None:
    assert wall_time_breakdown([]) == {"span_s": 0.0}
    out = wall_time_breakdown(
        [ev(0, 0.0, "grading_started", sha256="a"), ev(1, 4.0, "graded", sha256="a")]
    )
    assert out["agent"]["span_s"] == 0.0
    assert out["grading"]["busy_fraction"] == 1.0
    assert out["machine"] == {"source": "none", "samples": 0}


def test_the_cpu_sampler_reads_proc_stat_deltas(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    sampler = MachineSampler("cpu", proc_stat=stat)
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")
    assert sampler.sample() is None  # a rate needs two readings
    stat.write_text("cpu  150 0 150 900 0 0 0 0 0 0\n")  # 100 busy of 200
    assert sampler.sample() == {"source": "proc", "cpu_busy": 0.5}


def test_nvml_on_a_cuda_device_and_the_fallback_says_why(tmp_path: Path) -> None:
    fake = SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda index: "gpu0",
        nvmlDeviceGetUtilizationRates=lambda handle: SimpleNamespace(gpu=87, memory=40),
        nvmlDeviceGetPowerUsage=lambda handle: 612_000,
    )
    assert MachineSampler("cuda", nvml=fake).sample() == {
        "source": "nvml", "sm_activity": 0.87, "memory_activity": 0.4, "power_w": 612.0,
    }  # fmt: skip

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    stat = tmp_path / "stat"
    stat.write_text("cpu  1 0 1 8 0\n")
    broken = MachineSampler("cuda", nvml=SimpleNamespace(nvmlInit=no_driver), proc_stat=stat)
    broken.sample()
    stat.write_text("cpu  2 0 2 16 0\n")
    data = broken.sample()
    assert data is not None
    assert data["source"] == "proc"
    assert "NVML unavailable (RuntimeError: NVML Shared Library Not Found)" in data["note"]

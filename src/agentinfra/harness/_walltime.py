"""Where a run's wall time went, and how busy the machine was: pure functions plus a sampler.

Wall time only: a kernel's position under its roofline is `kernels.Utilisation`,
which the report shows per submission.

The breakdown comes from timestamps the run already journals (nothing is estimated):

- **model**: each model call's latency (the agent transcript's ``model_response``);
- **tools**: each tool call from ``tool_started`` to ``tool_result``;
- **idle** (agent): the agent's span minus model and tool time (its own bookkeeping,
  retries' back-off, waiting for a desktop slot);
- **queue**: each submission from ``submission_received`` to ``grading_started``;
- **grading**: each grading from ``grading_started`` to ``graded``.

Model, tools and idle partition the agent's time; queue and grading are the
grading pool's, which overlaps the agent (grading runs while the agent works).
The eval workers' busy fraction is grading time over (span x workers), with a
timeline of how many gradings ran at once.

`MachineSampler` journals ``machine_sample`` events while a run serves: on a CUDA
grading device with ``nvidia-ml-py`` importable, NVML's SM and memory activity and
power (``source: "nvml"``); otherwise the machine's CPU busy fraction from
``/proc/stat`` (``source: "proc"``). Each sample says which it used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentinfra._journal import Event as _Event

__all__ = ["MachineSampler", "wall_time_breakdown"]


def _intervals(
    events: Sequence[_Event], start: str, end: str, key: str
) -> list[tuple[float, float]]:
    opened: dict[str, float] = {}
    spans: list[tuple[float, float]] = []
    for event in events:
        name = str(event.data.get(key))
        if event.type == start:
            opened.setdefault(name, event.wall_s)
        elif event.type == end and name in opened:
            spans.append((opened.pop(name), event.wall_s))
    return spans


def _busy_timeline(spans: list[tuple[float, float]], origin: float) -> list[tuple[float, int]]:
    """(seconds since ``origin``, gradings running from then on): the pool's occupancy as steps."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running, steps = 0, []
    for at, change in edges:
        running += change
        steps.append((round(at - origin, 3), running))
    return steps


def wall_time_breakdown(
    journal: Sequence[_Event], transcript: Sequence[_Event] = ()
) -> dict[str, Any]:
    """The run's wall time by activity (module docstring); seconds, fractions of the span, timelines."""
    every = [*journal, *transcript]
    if not every:
        return {"span_s": 0.0}
    origin = min(e.wall_s for e in every)
    span = max(e.wall_s for e in every) - origin
    model = [
        (e.wall_s - float(e.data.get("latency_s", 0.0)), e.wall_s)
        for e in transcript
        if e.type == "model_response"
    ]
    tools = _intervals(transcript, "tool_started", "tool_result", "call_id")
    queue = _intervals(journal, "submission_received", "grading_started", "sha256")
    grading = _intervals(journal, "grading_started", "graded", "sha256")
    workers = max(
        [int(e.data.get("workers", 0)) for e in journal if e.type == "grading_started"]
        + [max((n for _, n in _busy_timeline(grading, origin)), default=0), 1]
    )
    agent_span = (
        max(e.wall_s for e in transcript) - min(e.wall_s for e in transcript) if transcript else 0.0
    )

    def total(spans: list[tuple[float, float]]) -> float:
        return round(sum(e - s for s, e in spans), 3)

    model_s, tools_s, grading_s = total(model), total(tools), total(grading)
    out: dict[str, Any] = {
        "span_s": round(span, 3),
        "agent": {
            "span_s": round(agent_span, 3), "model_s": model_s, "tools_s": tools_s,
            "idle_s": round(max(agent_span - model_s - tools_s, 0.0), 3),
            "model_calls": len(model), "tool_calls": len(tools),
        },
        "grading": {
            "workers": workers, "gradings": len(grading), "grading_s": grading_s, "queue_s": total(queue),
            "busy_fraction": round(grading_s / (span * workers), 4) if span > 0 else 0.0,
            "timeline": _busy_timeline(grading, origin),
        },
        "lanes": {
            "model": [(round(s - origin, 3), round(e - origin, 3)) for s, e in model],
            "tools": [(round(s - origin, 3), round(e - origin, 3)) for s, e in tools],
            "grading": [(round(s - origin, 3), round(e - origin, 3)) for s, e in grading],
        },
    }  # fmt: skip
    samples = [e for e in journal if e.type == "machine_sample"]
    if samples:
        sources = sorted({str(e.data.get("source")) for e in samples})
        key = "sm_activity" if sources == ["nvml"] else "cpu_busy"
        values = [float(e.data[key]) for e in samples if isinstance(e.data.get(key), int | float)]
        out["machine"] = {
            "source": ", ".join(sources), "metric": key, "samples": len(samples),
            "mean": round(sum(values) / len(values), 4) if values else None,
            "timeline": [(round(e.wall_s - origin, 3), e.data.get(key)) for e in samples],
        }  # fmt: skip
    else:
        out["machine"] = {"source": "none", "samples": 0}
    return out


class MachineSampler:
    """One ``machine_sample`` per call of `sample`: NVML on a CUDA grading device where it loads, else /proc.

    Args:
        device: the grading device (``cpu`` or ``cuda``).
        proc_stat: where the CPU counters are read (tests point it elsewhere).
        nvml: an ``pynvml``-like module (tests pass a fake); None: imported when ``device`` is cuda.
    """

    def __init__(
        self, device: str = "cpu", *, proc_stat: Path = Path("/proc/stat"), nvml: Any = None
    ) -> None:
        self.proc_stat = proc_stat
        self._previous: tuple[int, int] | None = None
        self._handle: Any = None
        self._nvml = nvml
        self.note = ""
        if device == "cuda":
            try:
                if self._nvml is None:
                    import pynvml  # type: ignore[import-not-found]

                    self._nvml = pynvml
                self._nvml.nvmlInit()
                self._handle = self._nvml.nvmlDeviceGetHandleByIndex(0)
            except Exception as exc:  # no driver, no package: the CPU, and say why
                self._handle = None
                self.note = (
                    f"NVML unavailable ({type(exc).__name__}: {str(exc)[:120]}); CPU from /proc"
                )

    def _cpu(self) -> tuple[int, int] | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = [int(v) for v in self.proc_stat.read_text().splitlines()[0].split()[1:]]
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
            return sum(fields), idle
        return None

    def sample(self) -> dict[str, Any] | None:
        """This interval's figures, or None for the first CPU sample (a rate needs two readings)."""
        if self._handle is not None:
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            data: dict[str, Any] = {"source": "nvml", "sm_activity": rates.gpu / 100.0,
                                    "memory_activity": rates.memory / 100.0}  # fmt: skip
            with contextlib.suppress(Exception):
                data["power_w"] = self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
            return data
        now = self._cpu()
        before, self._previous = self._previous, now
        if now is None or before is None or now[0] <= before[0]:
            return None
        total, idle = now[0] - before[0], now[1] - before[1]
        data = {"source": "proc", "cpu_busy": round(1.0 - idle / total, 4)}
        if self.note:
            data["note"] = self.note
        return data

    def journal_to(self, append: Callable[[str, dict[str, Any]], Any]) -> None:
        """Takes one sample and journals it (nothing for the first CPU reading)."""
        data = self.sample()
        if data is not None:
            append("machine_sample", data)

"""Runs end to end through the CLI: kill -9 mid-grading and resume; replay, report, regrade; the report in Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "examples" / "kernels" / "problems" / "01_matmul_relu.py"
HONEST = ROOT / "examples" / "kernels" / "submissions" / "01_matmul_relu_addmm.py"
CHEATS = ROOT / "tests" / "fixtures" / "kernels" / "cheats"
CLI = [sys.executable, "-m", "agentinfra"]
ENV = {**os.environ, "AGENTINFRA_GRADER_TIMEOUT_S": "60"}


def journal(run: Path) -> list[dict[str, object]]:
    lines = (run / "journal.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def wait_for(predicate: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def freeze_mid_grading(
    server: subprocess.Popen[bytes], run: Path, timeout_s: float, received: int
) -> list[dict[str, object]]:
    """Stops the server's process group (SIGSTOP) once its journal shows a grading started and
    ``received`` submissions taken from the inbox (it polls the inbox, so a file dropped after the
    first grading started may not be in yet); that journal.

    Each look is taken while the server is stopped, so the journal returned is the
    state that a kill sent before any SIGCONT meets (nothing can be graded in between)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        os.killpg(server.pid, signal.SIGSTOP)
        lines = (run / "journal.jsonl").read_text().split("\n")[:-1]  # whole lines only
        events = [json.loads(line) for line in lines if line.strip()]
        types = [e["type"] for e in events]
        if "grading_started" in types and types.count("submission_received") >= received:
            return events
        os.killpg(server.pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"no grading started within {timeout_s} s")


@pytest.mark.slow
def test_kill_minus_nine_mid_grading_then_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    files = [HONEST, CHEATS / "timer_patch.py", CHEATS / "zeros.py"]
    server = subprocess.Popen([*CLI, "start", str(run), "--task", str(PROBLEM), "--eval-workers", "1", "--hours", "1"],
                              env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: (run / "journal.jsonl").exists(), 30)
        for number, path in enumerate(files):
            subprocess.run(
                [*CLI, "submit", str(run), str(path), "--turn", str(number)],
                check=True,
                env=ENV,
                capture_output=True,
            )
        frozen = freeze_mid_grading(server, run, 60, received=len(files))
        assert [e["type"] for e in frozen].count("grading_started") == 1
        assert not any(e["type"] == "graded" for e in frozen)
        # Stopped since the look above: the kill meets exactly that state, mid-grading.
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert sum(e["type"] == "submission_received" for e in journal(run)) == 3
    subprocess.run([*CLI, "finish", str(run)], check=True, env=ENV, capture_output=True)
    resumed = subprocess.run(
        [*CLI, "resume", str(run), "--eval-workers", "1"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    events = journal(run)
    received = [e["data"]["sha256"] for e in events if e["type"] == "submission_received"]  # type: ignore[index]
    graded = [e["data"]["sha256"] for e in events if e["type"] == "graded"]  # type: ignore[index]
    assert sorted(graded) == sorted(received), "every submission has exactly one verdict"
    for sha in received:
        verdicts = [p for p in (run / "evaluations" / str(sha)).glob("*.json") if "@" not in p.name]
        assert len(verdicts) == 1
    outcomes = {e["data"]["sha256"]: e["data"]["outcome"] for e in events if e["type"] == "graded"}  # type: ignore[index]
    assert sorted(outcomes.values()) == ["hack_flagged", "invalid", "passed"]
    assert any(e["type"] == "run_resumed" for e in events)
    # The live lock is released: a second resume with nothing to do finishes at once.
    subprocess.run([*CLI, "finish", str(run)], check=True, env=ENV, capture_output=True)
    again = subprocess.run(
        [*CLI, "resume", str(run)], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0
    assert sum(e["type"] == "graded" for e in journal(run)) == 3


def test_submit_refuses_bad_input(tmp_path: Path) -> None:
    not_a_run = subprocess.run(
        [*CLI, "submit", str(tmp_path), str(HONEST)], capture_output=True, text=True, env=ENV
    )
    assert not_a_run.returncode == 2
    assert "not a run directory" in not_a_run.stderr
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text('{"schema_version": 9}')
    newer = subprocess.run([*CLI, "report", str(run)], capture_output=True, text=True, env=ENV)
    assert newer.returncode == 2
    assert "schema version 9" in newer.stderr
    assert sorted(p.name for p in run.iterdir()) == ["run.json"]


def _chromium() -> str | None:
    return (
        shutil.which("chromium")
        or shutil.which("chromium-browser")
        or shutil.which("google-chrome")
    )


@pytest.mark.slow
def test_replay_report_regrade_and_the_chart_renders_in_chromium(tmp_path: Path) -> None:
    recording = tmp_path / "rec"
    (recording / "s").mkdir(parents=True)
    shutil.copy(HONEST, recording / "s" / "a.py")
    shutil.copy(CHEATS / "timer_patch.py", recording / "s" / "b.py")
    shutil.copy(CHEATS / "zeros.py", recording / "s" / "c.py")
    (recording / "recording.json").write_text(json.dumps({
        "schema_version": 1, "run_id": "mini", "task": str(PROBLEM), "hours": 3,
        "submissions": [{"t_hours": 0.5, "turn": 1, "file": "s/a.py"}, {"t_hours": 1.5, "turn": 2, "file": "s/b.py"},
                        {"t_hours": 2.5, "turn": 3, "file": "s/c.py"}],
    }))  # fmt: skip
    run = tmp_path / "run"
    out = subprocess.run([*CLI, "replay-run", str(recording), "--out", str(run), "--quick", "--eval-workers", "1"],
                         capture_output=True, text=True, env=ENV, timeout=400)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads((run / "report.json").read_text())
    assert report["schema_version"] == 3
    # where the time went: three gradings on one worker, each submission's roofline position
    grading = report["utilisation"]["grading"]
    assert (grading["gradings"], grading["workers"]) == (3, 1)
    assert 0 < grading["busy_fraction"] <= 1
    assert report["submissions"][0]["utilisation"]["roofline_fraction"] > 0
    page = (run / "report.html").read_text()
    assert "Where the time went" in page
    assert "of the roof" in page
    assert report["score_unit"] == "speedup"
    assert report["run_id"] == "mini"
    # progress: one plain line per finished grading (stderr is not a terminal here)
    assert "replay: grading 3 submission(s)" in out.stderr
    assert "replay: 3/3 graded" in out.stderr
    assert [s["seq"] for s in report["submissions"]] == [1, 2, 3]
    assert [s["outcome"] for s in report["submissions"]] == ["passed", "hack_flagged", "invalid"]
    assert {"submitted_at_s", "sha256", "correct", "score", "findings"} <= set(
        report["submissions"][0]
    )
    assert report["best"]["seq"] == 1
    assert report["metrics"]["filtered"]["best"]["remeasured_score"] is not None
    assert any(
        a["kind"] == "first_suspicious_construct" and a["seq"] == 2 for a in report["anomalies"]
    )

    regraded = subprocess.run(
        [*CLI, "regrade", str(run), "--json", "--eval-workers", "1"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=400,
    )
    assert regraded.returncode == 0, regraded.stderr[-2000:]
    changes = json.loads(regraded.stdout)
    assert [c["new_outcome"] for c in changes] == ["passed", "hack_flagged", "invalid"]
    assert not any(c["changed"] for c in changes)
    assert len(list((run / "evaluations").glob("*/*@regrade-1.json"))) == 3
    assert "regrade: 3/3 graded" in regraded.stderr

    browser = _chromium()
    if browser is None:
        pytest.skip("Chromium is not installed (make test installs it: scripts/system-deps.sh)")
    html = run / "report.html"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]  # fmt: skip
    dom = subprocess.run(
        [browser, *flags, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    assert 'id="timeline"' in dom
    assert len(re.findall(r'class="submission', dom)) == 3
    assert 'class="best-filtered"' in dom
    shot = ROOT / "benchmarks" / "harness" / "results" / "report_mini.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [browser, *flags, "--window-size=1100,900", f"--screenshot={shot}", html.as_uri()],
        capture_output=True,
        timeout=120,
    )
    assert shot.stat().st_size > 10_000
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    red = (pixels[..., 0] > 0.75) & (pixels[..., 1] < 0.3) & (pixels[..., 2] < 0.3)
    green = (pixels[..., 1] > 0.5) & (pixels[..., 0] < 0.3) & (pixels[..., 2] < 0.4)
    assert red.sum() > 20, "hack marker or raw curve drawn"
    assert green.sum() > 20, "passed point or filtered curve drawn"

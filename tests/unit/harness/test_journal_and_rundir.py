from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentinfra.environments import Submission
from agentinfra.errors import HarnessError
from agentinfra.harness import Journal, RunDirectory, RunLayout, RunSpec


def test_append_and_replay(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "j.jsonl")
    journal.append("a", {"x": 1})
    journal.append("b")
    journal.close()
    again = Journal.open(tmp_path / "j.jsonl")
    assert [(e.seq, e.type, e.data) for e in again.events] == [(0, "a", {"x": 1}), (1, "b", {})]
    assert json.loads((tmp_path / "j.jsonl").read_text().splitlines()[0])["v"] == 1


def test_torn_last_line_is_dropped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "j.jsonl"
    journal = Journal.open(path)
    journal.append("a")
    journal.close()
    with open(path, "ab") as handle:
        handle.write(b'{"v": 1, "seq": 1, "wall_s": 1.0, "mo')
    with caplog.at_level(logging.WARNING):
        again = Journal.open(path)
    assert "torn" in caplog.text
    assert len(again.events) == 1
    again.append("b")
    again.close()
    assert [e.type for e in Journal.open(path).events] == ["a", "b"]


def test_corrupt_middle_line_and_newer_schema_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_text(
        '{"v": 1, "seq": 0, "wall_s": 1, "mono_s": 1, "type": "a"}\nnot json\n{"v": 1, "seq": 1, "wall_s": 1, "mono_s": 1, "type": "b"}\n'
    )
    with pytest.raises(HarnessError, match=r"j.jsonl:2: journal line is not JSON"):
        Journal.open(path)
    path.write_text('{"v": 2, "seq": 0, "wall_s": 1, "mono_s": 1, "type": "a"}\n')
    with pytest.raises(HarnessError, match="schema version 2 is newer"):
        Journal.open(path)
    path.write_text('{"v": 1, "seq": 3, "wall_s": 1, "mono_s": 1, "type": "a"}\n')
    with pytest.raises(HarnessError, match="seq 3, expected 0"):
        Journal.open(path)


def test_full_disk_is_reported_and_nothing_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal.open(tmp_path / "j.jsonl")
    journal.append("kept")

    def no_space(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", no_space)
    with pytest.raises(HarnessError, match="No space left on device"):
        journal.append("lost")
    monkeypatch.undo()
    assert [e.type for e in journal.events] == ["kept"]
    journal.append("after")
    journal.close()
    assert [e.type for e in Journal.open(tmp_path / "j.jsonl").events] == ["kept", "after"]


def spec(tmp_path: Path) -> RunSpec:
    task = tmp_path / "task.py"
    task.write_text("x = 1\n")
    return RunSpec(run_id="r1", environment="kernels", task=str(task))


def test_run_directory_round_trip_and_content_addressing(tmp_path: Path) -> None:
    run = RunDirectory.create(tmp_path / "run", spec(tmp_path), grader_version="g-1")
    first = run.store_submission(Submission(b"print(1)\n", name="a.py"), {"turn": 1})
    again = run.store_submission(Submission(b"print(1)\n", name="b.py"), {"turn": 2})
    assert first.is_new
    assert not again.is_new
    assert first.sha256 == again.sha256
    assert first.path.name == "submission.py"
    assert json.loads((first.path.parent / "meta.json").read_text())["turn"] == 1
    run.close()
    reopened = RunDirectory.open(tmp_path / "run")
    assert reopened.spec.run_id == "r1"
    assert reopened.info.versions["grader"] == "g-1"
    assert reopened.info.versions["environment"] == "kernels"
    stored = reopened.read_submission(first.sha256)
    assert (stored.data, stored.name) == (b"print(1)\n", "a.py")
    assert reopened.journal.events[0].type == "run_created"
    reopened.close()


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "not valid JSON"),
        ('{"hello": "world"}', "not an agentinfra run.json"),
        ('{"schema_version": 7}', "schema version 7"),
    ],
)
def test_bad_run_json_is_refused_and_untouched(tmp_path: Path, content: str, match: str) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").write_text(content)
    with pytest.raises(HarnessError, match=match):
        RunDirectory.open(folder)
    assert (folder / "run.json").read_text() == content
    assert sorted(p.name for p in folder.iterdir()) == ["run.json"]


def test_not_a_run_and_existing_directory(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="not a run directory"):
        RunDirectory.open(tmp_path)
    (tmp_path / "stuff").write_text("keep")
    with pytest.raises(HarnessError, match="already exists and is not empty"):
        RunDirectory.create(tmp_path, spec(tmp_path), grader_version="g-1")


def test_a_live_process_holds_the_run(tmp_path: Path) -> None:
    RunDirectory.create(tmp_path / "run", spec(tmp_path), grader_version="g-1").close()
    code = f"from pathlib import Path; from agentinfra.harness import RunDirectory; r = RunDirectory.open(Path({str(tmp_path / 'run')!r})); print('locked', flush=True); import time; time.sleep(30)"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(
            HarnessError, match=f"held by another live process \\(pid {holder.pid}\\)"
        ):
            RunDirectory.open(tmp_path / "run")
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    time.sleep(0.05)
    RunDirectory.open(tmp_path / "run").close()


def test_submission_bytes_changed_on_disk_are_refused(tmp_path: Path) -> None:
    run = RunDirectory.create(tmp_path / "run", spec(tmp_path), grader_version="g-1")
    stored = run.store_submission(Submission(b"x = 1\n", name="s.py"), {})
    stored.path.write_bytes(b"x = 2\n")
    with pytest.raises(HarnessError, match="no longer matches its hash"):
        run.read_submission(stored.sha256)
    run.close()


def test_legacy_seed_in_run_json_is_accepted_and_dropped(tmp_path: Path) -> None:
    data = spec(tmp_path).model_dump() | {"seed": 7}
    assert "seed" not in RunSpec.model_validate(data).model_dump()


def test_layout_names_every_path(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    assert layout.transcript == tmp_path / "agent" / "transcript.jsonl"
    assert layout.finish_marker == tmp_path / "inbox" / "FINISH"
    assert (
        layout.evaluation_path("ab", "1.0.0", "remeasure")
        == tmp_path / "evaluations" / "ab" / "1.0.0@remeasure.json"
    )

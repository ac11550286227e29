"""The mirror's two layouts (OSWorld's cache, folder per task; agentinfra's flat one) and the getters'
``multi``/``gives``, on small tasks in OSWorld's format."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentinfra.environments.desktop._grading import _getter
from agentinfra.environments.desktop._task import (
    getter_files,
    load_desktop_task,
    mirror_file,
    mirror_path,
    support,
)
from agentinfra.errors import TaskEnvironmentError

TASK_ID = "0326d92d-d218-48a8-9ca1-981cd6d064c7"
INITIAL = "https://files.example/calc/SalesRep.xlsx"
GOLD = "https://files.example/calc/SalesRep_gold.xlsx"


def _task(tmp_path: Path, *, path: str = "/home/user/SalesRep.xlsx", dest: Any = "2_SalesRep_gt1.xlsx",
          expected: dict[str, Any] | None = None, task_id: str = TASK_ID) -> Any:  # fmt: skip
    raw = {
        "id": task_id,
        "instruction": "fill the column",
        "config": [{"type": "download", "parameters": {"files": [{"url": INITIAL, "path": path}]}}],
        "evaluator": {
            "func": "compare_table",
            "result": {"type": "vm_file", "path": path, "dest": "SalesRep.xlsx"},
            "expected": expected or {"type": "cloud_file", "path": GOLD, "dest": dest},
        },
    }
    file = tmp_path / "task.json"
    file.write_text(json.dumps(raw))
    return load_desktop_task(file)


def _osworld_cache(tmp_path: Path, *, download_as: str = "SalesRep.xlsx") -> Path:
    """A cache as OSWorld writes it: the download named by the path it goes to, the gold by its dest."""
    cache = tmp_path / "cache"
    (cache / TASK_ID).mkdir(parents=True)
    (cache / TASK_ID / f"{uuid.uuid5(uuid.NAMESPACE_URL, INITIAL)}_{download_as}").write_bytes(
        b"initial"
    )
    (cache / TASK_ID / "2_SalesRep_gt1.xlsx").write_bytes(b"gold")
    return cache


def test_osworlds_cache_layout_is_read_as_it_is(tmp_path: Path) -> None:
    cache = _osworld_cache(tmp_path)
    task = _task(tmp_path)
    assert support(task, cache).reason == ""
    found = mirror_file(cache, INITIAL, task_id=TASK_ID, dest="/home/user/SalesRep.xlsx")
    assert found is not None
    assert found.read_bytes() == b"initial"
    gold = mirror_file(cache, GOLD, task_id=TASK_ID, dest="2_SalesRep_gt1.xlsx", cloud=True)
    assert gold is not None
    assert gold.read_bytes() == b"gold"


def test_a_download_is_named_by_the_path_it_is_written_to_not_the_urls_basename(
    tmp_path: Path,
) -> None:
    cache = _osworld_cache(tmp_path, download_as="Renamed.xlsx")
    assert "is not in the mirror" in support(_task(tmp_path), cache).reason
    assert support(_task(tmp_path, path="/home/user/Renamed.xlsx"), cache).reason == ""


def test_a_download_never_takes_the_gold_by_its_dest_name(tmp_path: Path) -> None:
    """In OSWorld's cache a bare name is a cloud_file's expected file: a download that would go to
    the same name must not bring the gold into the home."""
    cache = tmp_path / "cache"
    (cache / TASK_ID).mkdir(parents=True)
    (cache / TASK_ID / "SalesRep.xlsx").write_bytes(b"gold")
    assert mirror_file(cache, INITIAL, task_id=TASK_ID, dest="/home/user/SalesRep.xlsx") is None
    reason = support(_task(tmp_path, dest="SalesRep.xlsx"), cache).reason
    assert reason.startswith(
        f"file {INITIAL} is not in the mirror ({cache}); add it as MIRROR/{TASK_ID}/"
    )


def test_the_flat_mirror_still_serves_and_the_message_names_both_layouts(tmp_path: Path) -> None:
    mirror = tmp_path / "flat"
    mirror.mkdir()
    task = _task(tmp_path)
    reason = support(task, mirror).reason
    assert (
        f"MIRROR/{TASK_ID}/{uuid.uuid5(uuid.NAMESPACE_URL, INITIAL)}_SalesRep.xlsx or MIRROR/"
        in reason
    )
    mirror_path(mirror, INITIAL).write_bytes(b"initial")
    assert f"expected file {GOLD} is not in the mirror" in support(task, mirror).reason
    mirror_path(mirror, GOLD).write_bytes(b"gold")
    assert support(task, mirror).reason == ""
    assert "needs a mirror (--mirror DIR" in support(task, None).reason


@pytest.mark.parametrize("task_id", ["../elsewhere", "a/b", ".."])
def test_a_task_id_that_is_not_one_name_only_reads_the_flat_layout(
    tmp_path: Path, task_id: str
) -> None:
    cache = tmp_path / "cache"
    (cache / "elsewhere").mkdir(parents=True)
    (cache / "elsewhere" / "2_SalesRep_gt1.xlsx").write_bytes(b"gold")
    assert mirror_file(cache, GOLD, task_id=task_id, dest="2_SalesRep_gt1.xlsx", cloud=True) is None
    assert mirror_file(cache / "elsewhere", GOLD, task_id=TASK_ID, dest="../2_SalesRep_gt1.xlsx",
                       cloud=True) is None  # fmt: skip


def test_multi_gives_picks_files_as_osworlds_getters_do() -> None:
    spec = {
        "type": "cloud_file",
        "multi": True,
        "path": ["u0", "u1", "u2"],
        "dest": ["a", "b", "c"],
    }
    assert getter_files(spec) == (
        [("u0", "a")],
        True,
    )  # gives defaults to [0]: one file, not a list
    assert getter_files({**spec, "gives": [2, 0]}) == ([("u0", "a"), ("u2", "c")], False)
    assert getter_files({"type": "vm_file", "path": "/home/user/x", "dest": "x"}) == (
        [("/home/user/x", "x")], True)  # fmt: skip
    with pytest.raises(TaskEnvironmentError, match=r"gives \[3\], not indices of its 3 files"):
        getter_files({**spec, "gives": [3]})
    with pytest.raises(TaskEnvironmentError, match="lists 3 paths and 2 dests"):
        getter_files({**spec, "dest": ["a", "b"]})


def test_the_grader_copies_the_given_expected_file_from_osworlds_layout(tmp_path: Path) -> None:
    cache = _osworld_cache(tmp_path)
    (cache / TASK_ID / "other.xlsx").write_bytes(b"other")
    expected_dir = tmp_path / "expected"
    expected_dir.mkdir()
    spec = {"type": "cloud_file", "multi": True, "path": [GOLD, "https://files.example/o.xlsx"],
            "dest": ["2_SalesRep_gt1.xlsx", "other.xlsx"], "gives": [1]}  # fmt: skip
    resolved = _getter(spec, expected_dir, cache, None, [], _task(tmp_path))
    assert resolved == {"kind": "file", "path": "/expected/0/other.xlsx"}
    assert (expected_dir / "0" / "other.xlsx").read_bytes() == b"other"
    # every file of the getter is there by its dest, given or not (a metric may read one beside)
    assert (expected_dir / "0" / "2_SalesRep_gt1.xlsx").read_bytes() == b"gold"
    vm = _getter({"type": "vm_file", "multi": True, "path": ["/home/user/a", "/home/user/b"],
                  "dest": ["a", "b"], "gives": [0, 1]}, expected_dir, cache, None, [],
                 _task(tmp_path))  # fmt: skip
    assert vm == {"kind": "file", "path": ["/home/user/a", "/home/user/b"]}


def test_a_task_list_selects_task_files_from_an_osworld_checkout(tmp_path: Path) -> None:
    from agentinfra.environments.desktop._task import selected_task_files
    from agentinfra.errors import ConfigError

    examples = tmp_path / "OSWorld" / "evaluation_examples" / "examples"
    for domain, ids in {"os": ["a", "b"], "libreoffice_calc": ["c"]}.items():
        (examples / domain).mkdir(parents=True)
        for i in ids:
            (examples / domain / f"{i}.json").write_text("{}")
    listing = tmp_path / "test_small.json"
    listing.write_text(json.dumps({"os": ["b"], "libreoffice_calc": ["c"]}))
    expected = [examples / "os" / "b.json", examples / "libreoffice_calc" / "c.json"]
    for root in (tmp_path / "OSWorld", tmp_path / "OSWorld" / "evaluation_examples", examples):
        assert selected_task_files(root, listing) == expected
    listing.write_text(json.dumps({"os": ["b", "zz"]}))
    with pytest.raises(ConfigError, match=r"names 1 task file\(s\) .* lacks, first .*os/zz.json"):
        selected_task_files(tmp_path / "OSWorld", listing)
    listing.write_text(json.dumps(["b"]))
    with pytest.raises(ConfigError, match="must map each domain to a list of task ids"):
        selected_task_files(tmp_path / "OSWorld", listing)
    listing.write_text(json.dumps({"chrome": ["x"]}))
    with pytest.raises(ConfigError, match=r"no examples/<domain>/ folders for \['chrome'\]"):
        selected_task_files(tmp_path / "OSWorld", listing)


def test_checks_combine_as_osworld_combines_them(tmp_path: Path) -> None:
    """``and``: any check at 0 makes the task 0 (OSWorld returns at the first), else the mean; ``or``:
    the best. OSWorld libreoffice_writer/0b17a146 read 0.5 for a do-nothing episode before."""
    from agentinfra.environments.desktop._grading import _combine

    both = _task(tmp_path)
    assert _combine(both, [1.0, 0.0]) == 0.0
    assert _combine(both, [1.0, 0.5]) == 0.75
    both.raw["evaluator"]["conj"] = "or"
    assert _combine(both, [0.0, 0.5]) == 0.5

"""`snapshot_home` and `remove_tree` without a desktop: what the copy keeps, and what it says it left out."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agentinfra.environments.desktop import _episode
from agentinfra.environments.desktop._episode import snapshot_findings, snapshot_home
from agentinfra.environments.desktop._session import remove_tree


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / "Desktop").mkdir(parents=True)
    (home / "Desktop" / "a.txt").write_text("a\n")
    return home


def test_symlinks_are_kept_as_links_never_followed(tmp_path: Path) -> None:
    home = _home(tmp_path)
    outside = tmp_path / "outside"
    outside.write_text("secret\n")
    (home / "copy").mkdir()
    os.symlink("copy", home / "Documents")
    os.symlink(str(outside), home / "out")
    os.symlink("missing", home / "dangling")
    snapshot = snapshot_home(home, tmp_path / "snap")
    assert os.readlink(snapshot.path / "Documents") == "copy"
    assert os.readlink(snapshot.path / "out") == str(outside)
    assert os.path.islink(snapshot.path / "dangling")
    assert snapshot.manifest["symlinks"] == {
        "Documents": "copy",
        "out": str(outside),
        "dangling": "missing",
    }
    assert snapshot_findings(snapshot.manifest) == []


def test_modes_are_in_the_manifest_and_contents_readable(tmp_path: Path) -> None:
    home = _home(tmp_path)
    (home / "locked").mkdir()
    (home / "locked" / "inside.txt").write_text("still copied\n")
    (home / "locked" / "inside.txt").chmod(0o000)
    (home / "locked").chmod(0o000)
    (home / "run.sh").write_text("#!/bin/sh\n")
    (home / "run.sh").chmod(0o4755)
    snapshot = snapshot_home(home, tmp_path / "snap")
    modes = snapshot.manifest["modes"]
    assert modes["locked"] == 0o000
    assert modes["locked/inside.txt"] == 0o000
    assert modes["run.sh"] == 0o4755
    assert modes["Desktop/a.txt"] == 0o644
    assert stat.S_IMODE((snapshot.path / "locked").stat().st_mode) == 0o755
    assert stat.S_IMODE((snapshot.path / "run.sh").stat().st_mode) == 0o644  # never set-id
    assert (snapshot.path / "locked" / "inside.txt").read_text() == "still copied\n"
    assert stat.S_IMODE((snapshot.path / "locked" / "inside.txt").stat().st_mode) == 0o644


def test_sparse_files_stay_sparse(tmp_path: Path) -> None:
    home = _home(tmp_path)
    with open(home / "sparse.img", "wb") as handle:
        handle.seek(512 << 20)
        handle.write(b"end")
        handle.seek(0)
        handle.write(b"start")
    snapshot = snapshot_home(home, tmp_path / "snap")
    copied = snapshot.path / "sparse.img"
    assert copied.stat().st_size == (512 << 20) + 3
    assert copied.stat().st_blocks * 512 < 1 << 20
    with open(copied, "rb") as handle:
        assert handle.read(5) == b"start"
        handle.seek(512 << 20)
        assert handle.read() == b"end"
    assert snapshot.manifest["data_bytes"] < 1 << 20
    assert (
        snapshot.manifest["bytes"] == (512 << 20) + 3 + 2
    )  # apparent sizes count against the budget


def _chain(root: Path, depth: int) -> None:
    """``depth`` nested folders under ``root``, made relative to each other (past PATH_MAX)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d" * 40, dir_fd=fd)
            inner = os.open("d" * 40, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
            f.write("deep\n")
    finally:
        os.close(fd)


def test_a_chain_past_the_depth_bound_is_a_finding(tmp_path: Path) -> None:
    home = _home(tmp_path)
    _chain(home, 1200)
    snapshot = snapshot_home(home, tmp_path / "snap")
    assert snapshot.manifest["too_deep"]
    [finding] = snapshot_findings(snapshot.manifest)
    assert finding.check == "snapshot_too_deep"
    assert finding.severity == "block"
    assert (snapshot.path / "Desktop" / "a.txt").read_text() == "a\n"
    left = snapshot.manifest["left_out"]
    assert len(left) == 1
    assert left[0]["path"].count("/") == _episode.SNAPSHOT_MAX_DEPTH
    remove_tree(tmp_path / "snap")
    assert not (tmp_path / "snap").exists()
    remove_tree(home)  # pytest's own cleanup of old temporary folders recurses


def test_budget_overrun_is_a_finding_naming_what_was_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_episode, "SNAPSHOT_LIMIT_BYTES", 1 << 20)
    home = _home(tmp_path)
    (home / "aaa-filler.bin").write_bytes(os.urandom(1 << 20))
    (home / "zzz-secret.txt").write_text("must not vanish silently\n")
    snapshot = snapshot_home(home, tmp_path / "snap")
    findings = snapshot_findings(snapshot.manifest)
    assert [f.check for f in findings] == ["snapshot_over_budget"]
    assert findings[0].severity == "block"
    left = [e["path"] for e in snapshot.manifest["left_out"]]
    assert left  # one of the two did not fit, and it is named
    assert all(name in findings[0].message for name in left)
    copied = {p.name for p in snapshot.path.iterdir()}
    assert not ({"aaa-filler.bin", "zzz-secret.txt"} <= copied)


def test_file_count_bound_is_a_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_episode, "SNAPSHOT_MAX_ENTRIES", 50)
    home = _home(tmp_path)
    for index in range(100):
        (home / f"f{index:03d}").write_text("x")
    snapshot = snapshot_home(home, tmp_path / "snap")
    assert [f.check for f in snapshot_findings(snapshot.manifest)] == ["snapshot_over_budget"]
    assert snapshot.manifest["entries"] == 50
    # 100 files and the Desktop folder (left out whole, its file unlisted) compete for 50 entries
    assert snapshot.manifest["left_out_total"] == 101 - 50


def test_sockets_and_pipes_are_left_out_with_the_reason(tmp_path: Path) -> None:
    home = _home(tmp_path)
    os.mkfifo(home / "pipe")
    snapshot = snapshot_home(home, tmp_path / "snap")
    assert snapshot.manifest["left_out"] == [{"path": "pipe", "reason": "a pipe: not copied"}]
    assert snapshot_findings(snapshot.manifest) == []


def test_remove_tree_takes_a_1200_deep_chain_and_unreadable_folders(tmp_path: Path) -> None:
    root = tmp_path / "workspace"
    root.mkdir()
    _chain(root, 1200)
    (root / "locked").mkdir()
    (root / "locked" / "f").write_text("x")
    (root / "locked").chmod(0o000)
    os.symlink(str(tmp_path / "keep"), root / "link")
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "k.txt").write_text("k")
    remove_tree(root)
    assert not root.exists()
    assert (tmp_path / "keep" / "k.txt").exists()  # the link was removed, not followed

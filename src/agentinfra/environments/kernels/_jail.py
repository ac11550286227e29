"""Inside the candidate's fresh namespaces, as root: build the jail, then drop to a uid.

Run by the supervisor as ``unshare --pid --fork --kill-child --net --mount
--mount-proc --propagation private python -I -m ..._jail CONFIG_JSON``. Before
any candidate code runs it:

1. reads the submission, then mounts private tmpfs over ``/tmp``, ``/var/tmp`` and
   ``/dev/shm`` (hiding the supervisor's files, including the problem copy, and
   leaving nothing that outlives the grading; where the interpreter or agentinfra
   itself lives under one of them, only those trees are bind-mounted back), and
   writes the submission into a fresh ``/tmp/work`` owned by the sandbox uid; the
   directory holding the original problem file is covered the same way;
2. where the interpreter lives under a directory the sandbox uid cannot enter
   (``/root`` is 0700 on many machines), covers that directory with a tmpfs that
   holds only bind mounts of the interpreter's trees, so nothing else in it is
   visible;
3. sets resource limits (address space, processes, CPU time, file size, open
   files, no core dumps) and the CPU affinity;
4. execs ``setpriv`` to switch to the unprivileged uid with no capabilities and
   ``no_new_privs``, which execs the worker.

Non-root mode (a user namespace) does the same mounts and skips the uid switch.
"""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def _needs_cover(path: Path, uid: int) -> Path | None:
    """The top-most ancestor of ``path`` that ``uid`` cannot traverse, if any."""
    if uid == 0:
        return None
    current = Path("/")
    for part in path.parts[1:]:
        current = current / part
        try:
            mode = current.stat().st_mode
        except OSError:
            return None
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return current
    return None


def _stash_root(needed: list[Path]) -> Path:
    """An existing directory, clear of everything the worker needs, to park bind mounts in."""
    for candidate in (Path("/mnt"), Path("/media"), Path("/srv"), Path("/run")):
        if candidate.is_dir() and not any(p.is_relative_to(candidate) for p in needed):
            _mount("-t", "tmpfs", "-o", "mode=700,size=1m", "tmpfs", str(candidate))
            return candidate
    raise RuntimeError("no directory to stash bind mounts in (/mnt, /media, /srv, /run)")


def _cover(mountpoint: Path, needed: list[Path], stash: Path, options: str) -> None:
    """Mounts a tmpfs over ``mountpoint``, keeping only the ``needed`` paths inside it visible."""
    inside = sorted(
        {p for p in needed if p != mountpoint and p.is_relative_to(mountpoint) and p.exists()}
    )
    keep = [p for p in inside if not any(p != q and p.is_relative_to(q) for q in inside)]
    parked: list[tuple[Path, Path]] = []
    for path in keep:
        target = stash / f"{len(list(stash.iterdir()))}"
        target.mkdir()
        _mount("--bind", str(path), str(target))
        parked.append((path, target))
    _mount("-t", "tmpfs", "-o", options, "tmpfs", str(mountpoint))
    for path, target in parked:
        path.mkdir(parents=True, mode=0o755)
        _mount("--move", str(target), str(path))


def _limits(config: dict[str, int]) -> None:
    memory = config["memory_limit_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_NPROC, (config["max_processes"], config["max_processes"]))
    resource.setrlimit(resource.RLIMIT_CPU, (config["cpu_limit_s"], config["cpu_limit_s"] + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main() -> None:
    config = json.loads(sys.argv[1])
    worker = sys.argv[sys.argv.index("--") + 1 :]
    uid = int(config["uid"])
    source = Path(config["submission"]).read_bytes()
    needed = [Path(p).resolve() for p in config["needed_paths"]]
    blocked = {b for b in (_needs_cover(p, uid) for p in needed) if b is not None}
    stash = _stash_root(needed)
    for mountpoint in ("/tmp", "/var/tmp", "/dev/shm"):
        if Path(mountpoint).is_dir():
            _cover(Path(mountpoint), needed, stash, "mode=1777,size=1g")
    for top in sorted(blocked):
        _cover(top, needed, stash, "mode=755,size=1m")
    for hidden in config.get("hide_paths", []):
        if Path(hidden).is_dir() and Path(hidden) != Path("/"):
            _cover(Path(hidden), needed, stash, "mode=755,size=1m")
    work = Path("/tmp/work")
    work.mkdir(mode=0o700)
    (work / "submission.py").write_bytes(source)
    os.chown(work, uid, uid)
    os.chown(work / "submission.py", uid, uid)
    os.chdir(work)
    os.sched_setaffinity(0, config["cpus"])
    _limits(config)
    if uid:
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--"]  # fmt: skip
    else:
        drop = ["setpriv", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
    os.execvpe(drop[0], [*drop, *worker], config["env"])


if __name__ == "__main__":
    main()

"""Inside the candidate's fresh namespaces, as root: build the jail, then drop to a uid.

Run by the supervisor as ``unshare --pid --fork --kill-child --net --mount
--mount-proc --propagation private python -I -m ..._jail CONFIG_JSON``. Before
any candidate code runs it:

1. reads the submission, then mounts private tmpfs over ``/tmp``, ``/var/tmp`` and
   ``/dev/shm`` (hiding the supervisor's files, including the problem copy, and
   leaving nothing that outlives the grading), and writes the submission into a
   fresh ``/tmp/work`` owned by the sandbox uid;
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


def _cover(blocked: Path, needed: list[Path]) -> None:
    keep = sorted(
        {blocked / p.relative_to(blocked).parts[0] for p in needed if p.is_relative_to(blocked)}
    )
    stash = Path("/tmp/.agentinfra-stash")
    stash.mkdir(mode=0o700, exist_ok=True)
    for index, child in enumerate(keep):
        target = stash / str(index)
        target.mkdir()
        _mount("--bind", str(child), str(target))
    _mount("-t", "tmpfs", "-o", "mode=755,size=1m", "tmpfs", str(blocked))
    for index, child in enumerate(keep):
        child.mkdir()
        _mount("--move", str(stash / str(index)), str(child))


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
    for mountpoint in ("/tmp", "/var/tmp", "/dev/shm"):
        if Path(mountpoint).is_dir():
            _mount("-t", "tmpfs", "-o", "mode=1777,size=1g", "tmpfs", mountpoint)
    for top in sorted(blocked):
        _cover(top, needed)
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

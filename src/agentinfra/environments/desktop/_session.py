"""One live desktop in a jail: its home, its controller, and its end.

`DesktopSession` reserves a uid, makes a fresh home from the pristine template
(owned by that uid), and starts the controller (`_controller.py`) in a jail built
from `agentinfra.sandbox.JailSpec`: the system's ``/usr`` and a few ``/etc``
entries read-only, the home writable at ``/home/user``, a private ``/tmp``,
pid, mount and network namespaces, resource limits. The controller runs on the
sandbox's one channel (`agentinfra.sandbox.JailedProcess`, its stdin and stdout
the channel's pipes, its stderr a file in the workspace). Requests go to it as
JSON lines, one at a time, on the event loop (no thread per request); replies
are size-capped and treated as untrusted.

`close` kills the jail (every process of the pid namespace dies with its pid 1),
sweeps the uid, and releases it; `snapshot_home` copies the home after that,
when nothing of the episode can still write to it.

The freeze (`freeze`, `record_setup`, `kill_after_setup`, `thaw_setup`) works on
the desktop's processes as the host sees them: every process whose real,
effective, saved or filesystem uid is the desktop's, read from host ``/proc``
(``status``, not the owner of ``/proc/PID``, which a process can make root's with
``PR_SET_DUMPABLE``), identified by pid and start time so a recycled pid is
never taken for a setup process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentinfra._settings import desktop_python_path
from agentinfra.errors import (
    ChannelClosedError,
    ChannelTimeoutError,
    TaskEnvironmentError,
    UidExhaustedError,
)
from agentinfra.sandbox import (
    JailedProcess,
    JailLimits,
    JailSpec,
    kill_uid,
    pids_by_uid,
    probe_sandbox_mode,
    reserve_uid,
)

__all__ = [
    "DESKTOP_PACKAGES",
    "DesktopConfig",
    "DesktopSession",
    "ProcessInfo",
    "desktop_python",
    "remove_tree",
    "uid_processes",
]

HOME = "/home/user"
_CONTROLLER = Path(__file__).resolve().parent / "_controller.py"
_MAX_REPLY = 64 << 20
_GRACE_S = 5.0
"""How long the jail's ``unshare`` gets to reap the controller (the jail's pid 1) at `close`."""
_SWEEP_S = 10.0
DESKTOP_PACKAGES = (
    "xvfb", "openbox", "dbus", "at-spi2-core", "python3-pyatspi", "python3-tk", "python3-venv",
    "xdotool", "wmctrl", "libreoffice-calc", "libreoffice-writer", "libreoffice-impress",
    "libreoffice-gtk3", "mousepad", "xterm", "fonts-dejavu-core", "gimp", "vlc", "thunderbird",
    "chromium", "socat", "unzip", "jq", "xsel", "sysstat", "expect",
)  # fmt: skip
"""The Debian packages a desktop needs (scripts/system-deps.sh installs them)."""
_SYSTEM_PATHS = (
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc/fonts", "/etc/X11", "/etc/libreoffice",
    "/etc/dbus-1", "/etc/alternatives", "/etc/ld.so.cache", "/etc/xdg", "/etc/gtk-3.0",
    "/etc/mime.types", "/etc/localtime", "/etc/bash.bashrc", "/etc/profile", "/etc/inputrc",
    "/etc/papersize", "/etc/python3", "/etc/python3.11", "/etc/dconf", "/etc/nsswitch.conf",
    "/etc/terminfo", "/etc/shells", "/var/cache/fontconfig", "/etc/gimp", "/etc/thunderbird", "/etc/chromium", "/etc/chromium.d",
    "/var/lib/dpkg/status",
)  # fmt: skip
"""What the desktop sees of the machine, read-only: programs, libraries, fonts and their settings."""

_LIBREOFFICE_SETTINGS = """<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry" \
xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="ShowTipOfTheDay" oor:op="fuse">\
<value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="FirstRun" oor:op="fuse">\
<value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Save/Document"><prop oor:name="WarnAlienFormat" \
oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Recovery/AutoSave"><prop oor:name="Enabled" oor:op="fuse">\
<value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Recovery/RecoveryInfo"><prop oor:name="Enabled" \
oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Setup/Office"><prop oor:name="ooSetupInstCompleted" oor:op="fuse">\
<value>true</value></prop></item>
</oor:items>
"""
_TEMPLATE = {
    "Desktop/": "",
    "Documents/": "",
    "Downloads/": "",
    ".Xauthority": "",
    ".bashrc": "PS1='user@desktop:\\w\\$ '\n",
    ".config/libreoffice/4/user/registrymodifications.xcu": _LIBREOFFICE_SETTINGS,
    ".config/vlc/vlcrc": "qt-privacy-ask=0\nmetadata-network-access=0\n",
    ".config/google-chrome/Default/Preferences": "{}",
}
"""The pristine home every episode starts from: standard folders, LibreOffice without first-run dialogs
or the "keep current format" question, VLC without its first-run network question (the desktop has no
network), a Chrome profile's Preferences (OSWorld's image holds a used profile: some setups edit its
Preferences before they start the browser), an empty X authority file (pyautogui wants one)."""


def desktop_python() -> Path:
    """The desktop's interpreter: ``$AGENTINFRA_DESKTOP_PYTHON``, else ``<venv>/desktop/bin/python``."""
    return desktop_python_path() or Path(sys.prefix) / "desktop" / "bin" / "python"


@dataclass(frozen=True, slots=True, kw_only=True)
class DesktopConfig:
    """One desktop's shape and limits."""

    width: int = 1920
    height: int = 1080
    memory_limit_bytes: int = 8 << 30
    """Address-space limit per process (LibreOffice maps about 2 GB)."""
    browser_address_space_bytes: int = 128 << 30
    """The hard address-space limit, to which the browser's launcher raises its own: Chromium
    reserves address space for its allocator's pools and V8's cage (measured here: it traps at
    48 GiB, hangs at 64, starts at 96). Any desktop process may raise its limit as far; as the
    sandbox says, nothing limits a jail's total memory, so this is no weaker a bound."""
    max_processes: int = 512
    cpu_limit_s: int = 24 * 3600
    tmp_bytes: int = 512 << 20
    request_timeout_s: float = 60.0
    action_time_limit_s: float = 120.0
    """The longest one action's code may run; past it the action is stopped and the episode ends
    (an ``action_time_limit`` finding), graded as it stands."""

    def __post_init__(self) -> None:
        if not 0 < self.action_time_limit_s <= 3600:
            raise TaskEnvironmentError(
                f"action time limit {self.action_time_limit_s} s is outside (0, 3600]; "
                "set DesktopConfig.action_time_limit_s"
            )
        for name, low, high in (("width", 320, 7680), ("height", 240, 4320)):
            value = getattr(self, name)
            if not low <= value <= high:
                raise TaskEnvironmentError(
                    f"desktop {name} {value} is outside {low}..{high}; set --{name}"
                )


def check_prerequisites() -> None:
    """One line naming what to install when the desktop cannot start here."""
    missing = [p for p in ("Xvfb", "openbox", "dbus-daemon", "xdotool", "wmctrl", "soffice")
               if shutil.which(p) is None]  # fmt: skip
    if missing:
        raise TaskEnvironmentError(
            f"desktop programs missing: {', '.join(missing)}; install them with "
            f"`scripts/system-deps.sh desktop` (apt-get install {' '.join(DESKTOP_PACKAGES)})"
        )
    import importlib.util

    missing_libraries = [m for m in ("openpyxl", "docx", "pptx", "rapidfuzz", "pypdf", "lxml", "PIL")
                         if importlib.util.find_spec(m) is None]  # fmt: skip
    if missing_libraries:
        raise TaskEnvironmentError(
            f"the desktop grader's libraries are missing ({', '.join(missing_libraries)}); "
            "install them with: pip install 'agentinfra[desktop]'"
        )
    python = desktop_python()
    if not python.exists():
        raise TaskEnvironmentError(
            f"desktop interpreter {python} not found; create it with `make desktop-venv` "
            "or set AGENTINFRA_DESKTOP_PYTHON"
        )
    if os.geteuid() != 0 or probe_sandbox_mode() != "namespaces+uid":
        raise TaskEnvironmentError(
            "the desktop needs root to build its jail (a separate uid and namespaces); run as root"
        )


class ControllerError(TaskEnvironmentError):
    """The controller did not answer, or answered something that is not a reply."""


class DesktopSession:
    """One desktop: `start`, `request`\\ s, then `close` (also on error, via ``async with``)."""

    def __init__(self, config: DesktopConfig | None = None) -> None:
        self.config = config or DesktopConfig()
        self.workspace = Path(tempfile.mkdtemp(prefix="agentinfra-desktop-"))
        self.home = self.workspace / "home"
        self.uid = -1
        self._lock = -1
        self.channel: JailedProcess | None = None
        self._turn = asyncio.Lock()
        self._cancelled_during: str | None = None
        self.started_s = 0.0
        self.is_started = False
        """`start` completed (a desktop from `DesktopPool` comes started)."""
        self.last_screenshot_s = 0.0
        self.closed = False
        self.setup_set: dict[tuple[int, int], str | None] = {}

    async def __aenter__(self) -> DesktopSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
        self.remove()

    # -- start -----------------------------------------------------------------
    async def start(self) -> None:
        """Starts the desktop: its uid, home and jail (in a worker thread: they touch the disk and
        ``/proc``), then the controller's ``start`` request on the loop."""
        await asyncio.to_thread(check_prerequisites)
        started = time.monotonic()
        launch = asyncio.ensure_future(asyncio.to_thread(self._launch))
        try:
            await asyncio.shield(launch)
        except asyncio.CancelledError:
            # A cancelled wait leaves the thread running: it may still reserve a uid and spawn the jail
            # after `close` looked. Waiting for it (tens of ms) lets `close` find what it made.
            with contextlib.suppress(Exception):
                await launch
            raise
        await self.request(
            "start", width=self.config.width, height=self.config.height, timeout_s=30
        )
        self.started_s = time.monotonic() - started
        self.is_started = True

    def _launch(self) -> None:
        try:
            self.uid, self._lock = reserve_uid()
        except UidExhaustedError as exc:
            raise TaskEnvironmentError(f"{exc}; run fewer desktops at once (--desktops)") from exc
        self._make_home()
        command = self._jail().command("namespaces+uid")

        def spawn(child: tuple[int, int], stderr: int) -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                command, stdin=child[0], stdout=child[1], stderr=stderr, start_new_session=True
            )

        self.channel = JailedProcess.start(
            spawn,
            mode="namespaces+uid",
            uid=self.uid,
            stderr_path=self.workspace / "controller.stderr",
        )

    def _make_home(self) -> None:
        self.workspace.chmod(0o711)
        for relative, text in _TEMPLATE.items():
            target = self.home / relative
            if relative.endswith("/"):
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        for path in [self.home, *self.home.rglob("*")]:
            os.lchown(path, self.uid, self.uid)
        self.home.chmod(0o700)

    def _jail(self) -> JailSpec:
        python = desktop_python()
        venv = python.parent.parent
        env = {
            "HOME": HOME, "USER": "user", "LOGNAME": "user", "SHELL": "/bin/bash",
            "PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin", "DISPLAY": ":0", "LANG": "C.UTF-8",
            "XDG_RUNTIME_DIR": "/tmp/runtime-user", "SAL_USE_VCLPLUGIN": "gtk3",
            "PYTHONDONTWRITEBYTECODE": "1", "NO_AT_BRIDGE": "0", "TERM": "xterm",
        }  # fmt: skip
        machine_id = os.urandom(16).hex()
        return JailSpec(
            argv=(str(python), "-I", "/tmp/work/controller.py"),
            env=env,
            uid=self.uid,
            ro_paths=(*(p for p in _SYSTEM_PATHS if os.path.lexists(p)), str(venv)),
            files=(
                ("/etc/machine-id", machine_id + "\n"),
                ("/etc/hostname", "desktop\n"),
                ("/etc/hosts", "127.0.0.1 localhost desktop\n"),
            ),
            copy_in=((str(_CONTROLLER), "controller.py"),),
            rw_binds=((str(self.home), HOME),),
            user="user",
            home=HOME,
            shell="/bin/bash",
            ptys=True,
            devices=("/dev/tty",),
            tmp_bytes=self.config.tmp_bytes,
            limits=JailLimits(
                memory_limit_bytes=self.config.memory_limit_bytes, max_processes=self.config.max_processes,
                cpu_limit_s=self.config.cpu_limit_s, open_files=4096,
                address_space_ceiling_bytes=max(self.config.browser_address_space_bytes,
                                                self.config.memory_limit_bytes),
            ),
        )  # fmt: skip

    # -- requests --------------------------------------------------------------
    async def request(
        self, op: str, *, timeout_s: float | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Sends one request and returns the reply; `ControllerError` when there is none."""
        channel = self.channel
        if channel is None or self.closed:
            raise ControllerError(f"desktop is not running (request {op!r})")
        timeout = self.config.request_timeout_s if timeout_s is None else timeout_s
        async with self._turn:  # one request on the pipes at a time
            if self._cancelled_during is not None:
                raise ControllerError(
                    f"desktop controller is out of step: a {self._cancelled_during} request was "
                    f"cancelled mid-exchange (request {op!r}); restart the desktop"
                )
            try:
                return await self._exchange(channel, op, timeout, fields)
            except asyncio.CancelledError:
                # Half a request may be in the pipe, or its reply unread: the next
                # request would take that reply for its own, so none is sent.
                self._cancelled_during = op
                raise

    async def _exchange(
        self, channel: JailedProcess, op: str, timeout: float, fields: dict[str, Any]
    ) -> dict[str, Any]:
        try:
            await channel.send_async(
                json.dumps({"op": op, **fields}).encode() + b"\n",
                deadline=time.monotonic() + timeout,
            )
        except ChannelClosedError as exc:
            raise ControllerError(f"desktop controller is gone ({op}): {self._stderr()}") from exc
        except ChannelTimeoutError as exc:
            raise ControllerError(
                f"desktop controller did not answer {op} within {timeout:.0f} s"
            ) from exc
        line = await self._read_line(channel, timeout, op)
        _bound_stderr(channel.stderr_path)
        try:
            reply = json.loads(line)
        except ValueError as exc:
            raise ControllerError(f"desktop controller sent a non-JSON reply to {op}") from exc
        if not isinstance(reply, dict):
            raise ControllerError(f"desktop controller sent a non-object reply to {op}")
        return reply

    async def _read_line(self, channel: JailedProcess, timeout: float, op: str) -> bytes:
        deadline = time.monotonic() + timeout
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                chunk = await channel.read_async(1 << 20, deadline=deadline)
            except ChannelTimeoutError:
                raise ControllerError(
                    f"desktop controller did not answer {op} within {timeout:.0f} s"
                ) from None
            if not chunk:
                raise ControllerError(f"desktop controller ended during {op}: {self._stderr()}")
            newline = chunk.find(b"\n")
            if newline >= 0:
                chunks.append(chunk[:newline])
                if newline + 1 < len(chunk):
                    raise ControllerError(
                        f"desktop controller sent more than one reply to {op}: {chunk[newline + 1 :][:200]!r}"
                    )
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > _MAX_REPLY:
                raise ControllerError(
                    f"desktop controller's reply to {op} exceeds {_MAX_REPLY} bytes"
                )

    def _stderr(self) -> str:
        channel = self.channel
        if channel is None or channel.poll() is None:
            return "(still running)"
        return channel.stderr_tail(4000).strip()[-2000:] or "(no output)"

    async def write_file(self, path: str, data: bytes) -> dict[str, Any]:
        """Writes ``data`` at ``path`` as the desktop user (never through a host path the agent controls)."""
        return await self.request("write_file", path=path, data=base64.b64encode(data).decode())

    async def screenshot(self) -> tuple[bytes, tuple[int, int]]:
        started = time.monotonic()
        reply = await self.request("screenshot")
        self.last_screenshot_s = time.monotonic() - started
        if not reply.get("ok"):
            raise ControllerError(f"screenshot failed: {reply.get('error')}")
        png = base64.b64decode(str(reply["png"]))
        if not png.startswith(b"\x89PNG"):
            raise ControllerError("screenshot is not a PNG")
        x, y = reply.get("pointer", [0, 0])
        return png, (int(x), int(y))

    def signal(self, sig: signal.Signals) -> int:
        """Sends ``sig`` to every process of the desktop (its uid); returns how many there were."""
        return self.channel.signal(sig) if self.channel is not None else 0

    # -- end -------------------------------------------------------------------
    async def close(self) -> None:
        """Kills every process of the desktop and releases its uid (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if self.channel is not None:
            await self.channel.kill_async(grace_s=_GRACE_S)
        elif self.uid >= 0:
            deadline = time.monotonic() + _SWEEP_S
            while kill_uid(self.uid) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1

    def remove(self) -> None:
        remove_tree(self.workspace)

    # -- the freeze ----------------------------------------------------------------
    def processes(self) -> list[ProcessInfo]:
        """The desktop's processes now, read from host ``/proc`` (empty before `start`)."""
        return uid_processes(self.uid) if self.uid >= 0 else []

    def record_setup(self) -> None:
        r"""Remembers the processes alive now (end of setup) as the setup set: the only ones ever thawed,
        with the program each runs (a setup process that later ``exec``\ s another is not thawed)."""
        self.setup_set = {p.key: _exe(p.pid) for p in self.processes()}

    def freeze(self, *, passes: int = 50) -> list[ProcessInfo] | None:
        """SIGSTOPs every process of the desktop, again until a pass finds none new; returns them.

        A stopped process cannot fork, so each pass can only find children made
        before their parent stopped. None when ``passes`` passes were not enough (a
        process that forks and exits faster than the scan); the caller kills the jail.
        """
        stopped: dict[tuple[int, int], ProcessInfo] = {}
        for _ in range(passes):
            new = [p for p in self.processes() if p.key not in stopped]
            if not new:
                _wait_stopped(list(stopped), _STOP_WAIT_S)
                return sorted(stopped.values(), key=lambda p: p.pid)
            for process in new:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGSTOP)
                stopped[process.key] = process
        return None

    def kill_after_setup(self) -> int:
        """SIGKILLs every (frozen) process not in the setup set; returns how many."""
        killed = 0
        for process in self.processes():
            if process.key not in self.setup_set:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                killed += 1
        return killed

    def thaw_all(self) -> None:
        """SIGCONTs every process of the desktop (after a `freeze` for a submission mid-episode)."""
        for process in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)

    def thaw_setup(self) -> dict[str, list[int]]:
        r"""SIGCONTs the setup set alone (everything else is dead: `kill_after_setup` ran first).

        Not thawed: a setup process that now runs another program than at setup
        (it ``exec``\ ed one: killed), and shells and interpreters other than the
        controller (left stopped): the agent may have typed commands into a
        terminal the setup opened, which its shell would read and run once thawed.
        Returns the pids in each case.
        """
        done: dict[str, list[int]] = {"thawed": [], "left_stopped": [], "killed_changed": []}
        for process in self.processes():
            if process.key not in self.setup_set:
                continue
            exe = _exe(process.pid)
            if exe != self.setup_set[process.key]:
                sig, kind = signal.SIGKILL, "killed_changed"
            elif _INTERPRETER.match(os.path.basename(exe or "")) and not _namespace_init(
                process.pid
            ):
                done["left_stopped"].append(process.pid)
                continue
            else:
                sig, kind = signal.SIGCONT, "thawed"
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, sig)
            done[kind].append(process.pid)
        return done


_STDERR_CAP_BYTES = 4 << 20
"""The most the controller's stderr file (the agent's code writes there too) keeps on the host."""


def _bound_stderr(path: Path) -> None:
    """Empties the controller's stderr file once it passes `_STDERR_CAP_BYTES` (it is opened for appending)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        if os.fstat(fd).st_size > _STDERR_CAP_BYTES:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """One process as the host's ``/proc`` shows it (``comm`` and ``cmdline`` are the process's own words)."""

    pid: int
    start: int
    """Start time in clock ticks after boot (``/proc/PID/stat`` field 22): with the pid, its identity."""
    comm: str
    cmdline: list[str]

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start)

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "comm": self.comm, "cmdline": self.cmdline}


_INTERPRETER = re.compile(
    r"^(ba|da|z|k|c|tc|fi|mk|yash|busybox|r)?sh$|^(python|perl|ruby|node|nodejs|lua|tclsh|wish|php|guile)[0-9.]*$"
)
"""Programs that run what they read: a setup-set one is not thawed for postconfig."""


def _namespace_init(pid: int) -> bool:
    """Whether ``pid`` is its pid namespace's pid 1 (the jail's: the controller)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            status = handle.read(4096)
    except OSError:
        return False
    line = next((x for x in status.split(b"\n") if x.startswith(b"NSpid:")), b"")
    return line.split()[-1:] == [b"1"]


def _exe(pid: int) -> str | None:
    """The program ``pid`` runs (``/proc/PID/exe``, read by the host), None when it cannot be read."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


_STOP_WAIT_S = 2.0
"""How long the freeze waits for SIGSTOP to take effect (a process mid-system-call stops on its way out)."""


def _wait_stopped(keys: list[tuple[int, int]], timeout: float) -> bool:
    """Waits until every process in ``keys`` is stopped, dead or gone; False if ``timeout`` passed first."""
    deadline = time.monotonic() + timeout
    waiting = list(keys)
    while waiting:
        still = []
        for pid, start in waiting:
            try:
                with open(f"/proc/{pid}/stat", "rb") as handle:
                    fields = handle.read(4096).rpartition(b")")[2].split()
            except OSError:
                continue
            if int(fields[19]) == start and fields[0] not in (b"T", b"t", b"Z", b"X"):
                still.append((pid, start))
        waiting = still
        if waiting:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
    return True


def uid_processes(uid: int) -> list[ProcessInfo]:
    """Every live process any of whose uids (real, effective, saved, filesystem) is ``uid``.

    Read by the host from its own ``/proc``: nothing the process says about itself
    decides whether it is listed. Zombies are listed (they hold no memory but a pid).
    """
    found = []
    for pid in pids_by_uid().get(uid, []):
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                stat = handle.read(4096)
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read(8192)
        except OSError:
            continue  # gone meanwhile
        close = stat.rfind(b")")
        comm = stat[stat.find(b"(") + 1 : close].decode(errors="replace")
        fields = stat[close + 2 :].split()
        start = int(fields[19])  # field 22 of the line; fields here start at field 3
        arguments = [a.decode(errors="replace")[:1000] for a in cmdline.split(b"\0")[:64] if a]
        found.append(ProcessInfo(pid, start, comm, arguments))
    return found


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: Path) -> None:
    """Removes ``path`` and everything under it, without recursion: a chain of any depth is fine.

    One directory fd at a time (down by name, up through ``..``), so paths past
    ``PATH_MAX`` are fine too; no link is followed. Entries that cannot be removed
    are left, as ``shutil.rmtree(ignore_errors=True)`` leaves them.
    """
    try:
        fd = os.open(path, _DIRECTORY)
    except NotADirectoryError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    except OSError:
        return
    # One frame per folder entered: its name in its parent and its subfolders still to remove.
    frames: list[tuple[str, list[str]]] = [("", _clear_files(fd))]
    try:
        while frames:
            _, pending = frames[-1]
            if pending:
                name = pending.pop()
                try:
                    inner = os.open(name, _DIRECTORY, dir_fd=fd)
                except OSError:
                    continue
                os.close(fd)
                fd = inner
                frames.append((name, _clear_files(fd)))
                continue
            name, _ = frames.pop()
            if not frames:
                break
            parent = os.open("..", _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = parent
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _clear_files(fd: int) -> list[str]:
    """Unlinks everything but folders in the open folder ``fd``; returns the folders' names."""
    folders = []
    try:
        with os.scandir(fd) as scan:
            entries = list(scan)
    except OSError:
        return []
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                folders.append(entry.name)
            else:
                os.unlink(entry.name, dir_fd=fd)
        except OSError:
            continue
    return folders

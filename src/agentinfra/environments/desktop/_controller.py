"""The desktop's controller: runs inside the jail, as the desktop user, as its pid 1.

Started by `DesktopSession` with the desktop interpreter (Debian's Python with
pyatspi, plus mss and pyautogui in ``.venv/desktop``). It starts the X server
(Xvfb), a private D-Bus session (which starts the AT-SPI bus on demand) and
openbox, then serves one JSON request per line on stdin with one JSON reply per
line on stdout, until stdin closes. It reaps orphans, as a pid 1 must.

Everything here runs with the agent's privileges. Action code (the agent's own
on the ``code`` track) runs in a child forked per action (`Controller.run_code`)
with its own X connection, reaped before the reply, and killed past the action's
time limit: nothing the agent starts lives in this process, which the freeze
thaws for postconfig. This process is not dumpable (``PR_SET_DUMPABLE`` 0), so
the agent's processes, though of the same uid, cannot ptrace it or read its
memory. The host still trusts nothing it says beyond "this is what the desktop
showed"; grading never reads it.

It imports nothing of agentinfra (it is copied into the jail on its own).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import io
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from typing import Any

DISPLAY = ":0"
_XML_NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
_CHILD_LIMIT = 500  # a node reporting more children manages descendants (a sheet): not walked
_TEXT_LIMIT = 2000
_CELL_ROWS = 40
_CELL_COLUMNS = 16


class Controller:
    def __init__(self) -> None:
        self.children: list[subprocess.Popen[bytes]] = []
        self.width = 1920
        self.height = 1080
        self.pyautogui: Any = None
        self.namespace: dict[str, Any] = {}
        self.private_fds: list[int] = []
        """The request pipe and the reply pipe: an action's child never keeps them."""

    # -- session ---------------------------------------------------------------
    def start(self, width: int, height: int) -> dict[str, Any]:
        self.width, self.height = width, height
        runtime = os.environ["XDG_RUNTIME_DIR"]
        os.makedirs(runtime, mode=0o700, exist_ok=True)
        os.makedirs("/tmp/.X11-unix", mode=0o1777, exist_ok=True)
        home = os.environ["HOME"]
        xauth = os.path.join(home, ".Xauthority")
        if not os.path.exists(xauth):
            open(xauth, "ab").close()
        started = time.monotonic()
        _launchers()
        self._spawn(["Xvfb", DISPLAY, "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp",
                     "-nolisten", "unix", "-listen", "unix", "-noreset"])  # fmt: skip
        socket = "/tmp/.X11-unix/X" + DISPLAY[1:]
        while not os.path.exists(socket):
            if time.monotonic() - started > 15:
                raise RuntimeError("Xvfb did not start within 15 s")
            time.sleep(0.02)
        bus = os.path.join(runtime, "bus")
        self._spawn(["dbus-daemon", "--session", "--nofork", "--nopidfile",
                     f"--address=unix:path={bus}"])  # fmt: skip
        os.environ["DBUS_SESSION_BUS_ADDRESS"] = f"unix:path={bus}"
        while not os.path.exists(bus):
            if time.monotonic() - started > 15:
                raise RuntimeError("dbus-daemon did not start within 15 s")
            time.sleep(0.02)
        self._spawn(["openbox", "--sm-disable"])
        import pyautogui

        pyautogui.FAILSAFE = False
        pyautogui.PAUSE = 0.02
        _fix_keymap()
        self.pyautogui = pyautogui
        self.namespace = {"pyautogui": pyautogui, "time": time}
        return {"started_s": round(time.monotonic() - started, 3)}

    def _spawn(self, argv: list[str], *, shell: bool = False) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            argv if not shell else argv[0],
            shell=shell,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd=os.environ["HOME"],
        )
        self.children.append(process)
        return process

    def reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children = [c for c in self.children if c.pid != pid]

    # -- setup steps -----------------------------------------------------------
    def write_file(self, path: str, data: str) -> dict[str, Any]:
        # a relative path is under the home, where commands run (OSWorld's ``setup.sh`` downloads)
        path = os.path.join(os.environ["HOME"], path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(base64.b64decode(data))
        return {"bytes": os.path.getsize(path)}

    def launch(
        self, command: list[str] | str, shell: bool, wait_s: float, title: str = ""
    ) -> dict[str, Any]:
        """Starts a program; with ``wait_s``, waits up to that long for a new window (one whose name holds
        ``title``, when given: an office suite maps a frame before the document is loaded), then lets it settle."""
        argv = [command] if isinstance(command, str) else list(command)
        if isinstance(command, str) and not shell:
            argv = command.split()
        before = self._windows()
        process = self._spawn(argv, shell=shell)
        deadline = time.monotonic() + wait_s
        appeared = False
        while wait_s and time.monotonic() < deadline:
            new = self._windows() - before
            if new and (not title or any(title in self._window_name(w) for w in new)):
                appeared = True
                time.sleep(1.0)  # the window maps before the application takes input
                break
            time.sleep(0.1)
        return {"pid": process.pid, "window": appeared}

    def _window_name(self, window: str) -> str:
        found = subprocess.run(
            ["xdotool", "getwindowname", window], capture_output=True, check=False
        )
        return found.stdout.decode(errors="replace")

    def _windows(self) -> set[str]:
        found = subprocess.run(["xdotool", "search", "--onlyvisible", "--name", "."],
                               capture_output=True, check=False)  # fmt: skip
        return set(found.stdout.decode().split())

    def execute(self, command: list[str] | str, shell: bool, timeout: float) -> dict[str, Any]:
        argv: Any = command if not isinstance(command, str) or shell else command.split()
        try:
            done = subprocess.run(
                argv, shell=shell, capture_output=True, timeout=timeout, cwd=os.environ["HOME"],
                stdin=subprocess.DEVNULL, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"returncode": None, "output": "", "error": f"timed out after {timeout} s"}
        except OSError as exc:
            return {"returncode": None, "output": "", "error": str(exc)}
        return {
            "returncode": done.returncode,
            "output": done.stdout.decode(errors="replace")[-100_000:],
            "error": done.stderr.decode(errors="replace")[-10_000:],
        }

    def wait_window(self, name: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = subprocess.run(["xdotool", "search", "--onlyvisible", "--name", name],
                                   capture_output=True, check=False)  # fmt: skip
            if found.returncode == 0 and found.stdout.strip():
                return {"found": True}
            time.sleep(0.1)
        return {"found": False}

    def window(self, action: str, name: str, strict: bool, by_class: bool) -> dict[str, Any]:
        flag = {"activate": "-a", "close": "-c"}[action]
        argv = ["wmctrl", *(["-x"] if by_class else []), *(["-F"] if strict else []), flag, name]
        done = subprocess.run(argv, capture_output=True, check=False)
        return {"returncode": done.returncode}

    # -- actions ---------------------------------------------------------------
    def run_code(self, code: str, time_limit: float) -> dict[str, Any]:
        """Runs ``code`` in a forked child and reaps it; past ``time_limit`` seconds it is killed.

        The child gets its own X connection (the inherited one's request sequence
        belongs to this process; its socket becomes /dev/null in the child), no
        request or reply pipe, and ends with ``os._exit``: any thread it started
        ends with it; processes it started are orphans of this pid 1, never part
        of it.
        """
        errors_read, errors_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            status = 0
            try:
                os.close(errors_read)
                namespace = self._child()
                try:
                    exec(compile(code, "<action>", "exec"), namespace)
                except BaseException as exc:  # SystemExit too: the action's error, not ours
                    os.write(errors_write, f"{type(exc).__name__}: {exc}".encode()[:4000])
            except BaseException:
                status = 70
            finally:
                os._exit(status)
        os.close(errors_write)
        try:
            ended = _wait_child(pid, time_limit)
            if not ended:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"error": f"the action ran past its time limit of {time_limit:g} s and was stopped",
                        "time_limit": True}  # fmt: skip
            os.set_blocking(errors_read, False)
            try:
                error = os.read(errors_read, 4000).decode(errors="replace")
            except BlockingIOError:  # a process the action started holds the pipe open
                error = ""
        finally:
            os.close(errors_read)
        return {"error": error} if error else {}

    def _child(self) -> dict[str, Any]:
        """In an action's child: private pipes closed, a fresh X connection; the namespace to run in."""
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _set_dumpable(True)  # the agent's own process, as any it starts would be
        null = os.open("/dev/null", os.O_RDWR)
        for fd in self.private_fds:
            os.dup2(null, fd)
        from pyautogui import _pyautogui_x11 as x11
        from Xlib.display import Display

        os.dup2(null, x11._display.fileno())  # the parent's connection: unusable here
        x11._display = Display(DISPLAY)
        os.close(null)
        return dict(self.namespace)

    def pointer(self) -> tuple[int, int]:
        x, y = self.pyautogui.position()
        return int(x), int(y)

    # -- observations ----------------------------------------------------------
    def screenshot(self) -> dict[str, Any]:
        import mss
        from PIL import Image, ImageDraw

        with mss.mss(display=DISPLAY) as grabber:
            shot = grabber.grab(grabber.monitors[1])
            image = Image.frombytes("RGB", shot.size, shot.bgra, "raw", "BGRX")
        x, y = self.pointer()
        draw = ImageDraw.Draw(image)
        arrow = [(x, y), (x, y + 17), (x + 4, y + 13), (x + 8, y + 20), (x + 10, y + 19),
                 (x + 7, y + 12), (x + 12, y + 12)]  # fmt: skip
        draw.polygon(arrow, fill=(255, 255, 255), outline=(0, 0, 0))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", compress_level=1)
        return {"png": base64.b64encode(buffer.getvalue()).decode(), "pointer": [x, y]}

    def accessibility(self, max_nodes: int, cells: bool = True) -> dict[str, Any]:
        from xml.etree import ElementTree

        import pyatspi

        for prefix, uri in _XML_NS.items():
            ElementTree.register_namespace(prefix, uri)
        desktop = pyatspi.Registry.getDesktop(0)
        deadline = time.monotonic() + 3
        while desktop.childCount == 0 and self._windows() and time.monotonic() < deadline:
            time.sleep(
                0.2
            )  # an application that just mapped its window registers with AT-SPI soon after
        root = ElementTree.Element("desktop-frame", {"name": "Desktop"})
        count = [0]

        def walk(node: Any, into: ElementTree.Element, depth: int) -> None:
            if count[0] >= max_nodes or depth > 60:
                return
            count[0] += 1
            try:
                states = node.getState().getStates()
                total = node.childCount
            except Exception:
                return
            element = _describe(node, pyatspi, states)
            into.append(element)
            # Hidden subtrees (closed menus: most of an office window's nodes) are
            # not walked; the application itself always is.
            if depth > 0 and pyatspi.STATE_SHOWING not in states:
                return
            if pyatspi.STATE_MANAGES_DESCENDANTS in states or total > _CHILD_LIMIT:
                if cells:
                    _visible_cells(node, element, pyatspi)
                return
            for index in range(total):
                try:
                    child = node.getChildAtIndex(index)
                except Exception:
                    continue
                if child is not None:
                    walk(child, element, depth + 1)

        for index in range(desktop.childCount):
            app = desktop.getChildAtIndex(index)
            if app is not None:
                walk(app, root, 0)
        return {"xml": ElementTree.tostring(root, encoding="unicode"), "nodes": count[0]}


def _wait_child(pid: int, timeout: float) -> bool:
    """Waits up to ``timeout`` seconds for child ``pid`` to end and reaps it; False if it did not end."""
    try:
        handle = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd: poll
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
            time.sleep(0.005)
        return False
    try:
        ready, _, _ = select.select([handle], [], [], timeout)
    finally:
        os.close(handle)
    if not ready:
        return False
    os.waitpid(pid, 0)
    return True


def _set_dumpable(dumpable: bool) -> None:
    """``prctl(PR_SET_DUMPABLE)``: a non-dumpable process cannot be ptraced by its uid's other processes."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, int(dumpable), 0, 0, 0) != 0:  # PR_SET_DUMPABLE = 4
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


def _fix_keymap() -> None:
    """pyautogui types ``<`` as shift + the keycode of ``less``; X's default keymap puts ``less``
    unshifted on its own key, so that yields ``>``. Map ``<``/``>`` to shift+comma/period (US layout)."""
    from pyautogui import _pyautogui_x11 as x11
    from Xlib import XK

    for char, base in (("<", "comma"), (">", "period")):
        keycode = x11._display.keysym_to_keycode(XK.string_to_keysym(base))
        if keycode:
            x11.keyboardMapping[char] = keycode


def _describe(node: Any, pyatspi: Any, states: Any = None) -> Any:
    """One node as an element; any attribute the node fails to give (it may vanish mid-walk) is left out."""
    from xml.etree import ElementTree

    role, name, interfaces = "unknown", "", set()
    with contextlib.suppress(Exception):
        role = node.getRoleName() or "unknown"
    with contextlib.suppress(Exception):
        name = node.name or ""
    with contextlib.suppress(Exception):
        interfaces = set(node.get_interfaces())
    attributes: dict[str, str] = {"name": name}
    with contextlib.suppress(Exception):
        for state in states if states is not None else node.getState().getStates():
            key = pyatspi.stateToString(state).replace(" ", "_")
            attributes[f"{{{_XML_NS['st']}}}{key}"] = "true"
    with contextlib.suppress(Exception):
        for pair in node.getAttributes():
            key, _, value = pair.partition(":")
            if key.isidentifier():
                attributes[f"{{{_XML_NS['attr']}}}{key}"] = value
    if "Component" in interfaces:
        with contextlib.suppress(Exception):
            component = node.queryComponent()
            x, y = component.getPosition(pyatspi.XY_SCREEN)
            w, h = component.getSize()
            attributes[f"{{{_XML_NS['cp']}}}screencoord"] = f"({x}, {y})"
            attributes[f"{{{_XML_NS['cp']}}}size"] = f"({w}, {h})"
    with contextlib.suppress(Exception):
        if node.description:
            attributes["description"] = node.description
    element = ElementTree.Element(role.replace(" ", "-"), attributes)
    if "Text" in interfaces:
        with contextlib.suppress(Exception):
            text = node.queryText()
            element.text = text.getText(0, min(text.characterCount, _TEXT_LIMIT))
    if "Value" in interfaces:
        with contextlib.suppress(Exception):
            element.set(f"{{{_XML_NS['val']}}}value", str(node.queryValue().currentValue))
    return element


def _visible_cells(table: Any, into: Any, pyatspi: Any) -> None:
    """A sheet's top-left visible cells through its table interface (it reports millions of children).

    At most `_CELL_ROWS` x `_CELL_COLUMNS` cells, each with its name ("B2"), text,
    states and extents: each attribute is a D-Bus round trip, so this is the
    walk's cost; a cell's full record is left to the file, which the grader reads.
    """
    from xml.etree import ElementTree

    try:
        iface = table.queryTable()
        component = table.queryComponent()
        tx, ty = component.getPosition(pyatspi.XY_SCREEN)
        tw, th = component.getSize()
    except Exception:
        return
    for row in range(min(iface.nRows, _CELL_ROWS)):
        for column in range(min(iface.nColumns, _CELL_COLUMNS)):
            try:
                cell = iface.getAccessibleAt(row, column)
                cx, cy = cell.queryComponent().getPosition(pyatspi.XY_SCREEN)
                if not (tx <= cx < tx + tw and ty <= cy < ty + th):
                    continue
                cw, ch = cell.queryComponent().getSize()
                attributes = {"name": cell.name or "",
                              f"{{{_XML_NS['cp']}}}screencoord": f"({cx}, {cy})",
                              f"{{{_XML_NS['cp']}}}size": f"({cw}, {ch})"}  # fmt: skip
                for state in cell.getState().getStates():
                    if state in (
                        pyatspi.STATE_FOCUSED,
                        pyatspi.STATE_SELECTED,
                        pyatspi.STATE_SHOWING,
                    ):
                        name = pyatspi.stateToString(state).replace(" ", "_")
                        attributes[f"{{{_XML_NS['st']}}}{name}"] = "true"
                element = ElementTree.Element("table-cell", attributes)
                text = cell.queryText()
                element.text = text.getText(0, min(text.characterCount, _TEXT_LIMIT)) or None
            except Exception:
                continue
            into.append(element)


LAUNCHERS = "/tmp/work/bin"
"""First on the desktop's PATH: ``google-chrome`` as OSWorld's tasks start it, and ``sudo``."""
CHROMIUM = "/usr/lib/chromium/chromium"
CHROME_FLAGS = ("--no-first-run", "--no-default-browser-check", "--password-store=basic",
                "--disable-dev-shm-usage", "--test-type")  # fmt: skip
"""No first-run page or default-browser question, no keyring prompt, and no warning bar for
flags (``--test-type``): the window a task starts is the browser alone."""


SUDO = """#!/bin/sh
# The desktop user has no root. OSWorld's setups use sudo to install tools with apt; a package
# this desktop already has makes that a no-op, which is all this does. Anything else is refused.
[ "$1" = "-S" ] && { shift; cat >/dev/null; }
case "$1" in
  apt|apt-get) shift ;;
  *) echo "sudo: the desktop user has no root (only apt-get install of a package the desktop ships succeeds)" >&2; exit 1 ;;
esac
verb=""
for word in "$@"; do
  case "$word" in
    -*) ;;
    *) if [ -z "$verb" ]; then verb="$word"; continue; fi
       if [ "$verb" = install ] && [ "$(dpkg-query -W -f='${Status}' "$word" 2>/dev/null)" != "install ok installed" ]; then
         echo "sudo: package $word is not in this desktop, and the desktop user has no root to install it" >&2; exit 100
       fi ;;
  esac
done
case "$verb" in
  update|install) exit 0 ;;
  *) echo "sudo: the desktop user has no root (apt-get $verb refused)" >&2; exit 1 ;;
esac
"""
"""``sudo`` in the desktop: ``apt-get update`` and ``apt-get install`` of installed packages succeed
without doing anything; everything else fails with one line."""


def _launchers() -> None:
    """The programs first on the desktop's PATH (put first here, for every process the
    controller starts): ``sudo`` (`SUDO`) and the browser's launchers."""
    os.makedirs(LAUNCHERS, exist_ok=True)
    os.environ["PATH"] = f"{LAUNCHERS}:{os.environ.get('PATH', '')}"
    _write_program("sudo", SUDO)
    _browser_launchers()


def _write_program(name: str, text: str) -> None:
    path = os.path.join(LAUNCHERS, name)
    with open(path, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o755)


def _browser_launchers() -> None:
    """``google-chrome`` (and ``-stable``): Debian's Chromium with its profile where Google Chrome
    keeps one (``~/.config/google-chrome``, where OSWorld's getters read), its address-space
    limit raised to the hard limit the desktop allows. Chromium names its processes
    ``chromium``, so the launcher stays as their parent, named ``google-chrome``: OSWorld's
    postconfig ``pkill chrome`` reaches it, and it passes the signal on, so the browser shuts
    down cleanly and writes its settings, as Google Chrome does."""
    if not os.path.exists(CHROMIUM):
        return
    script = (
        "#!/bin/sh\n"
        'ulimit -S -v "$(ulimit -H -v)"\n'
        f'{CHROMIUM} --user-data-dir="$HOME/.config/google-chrome" {" ".join(CHROME_FLAGS)} "$@" &\n'
        "child=$!\n"
        "trap 'kill -TERM $child 2>/dev/null' TERM INT HUP\n"
        "status=0\n"
        'while kill -0 "$child" 2>/dev/null; do wait "$child"; status=$?; done\n'
        'exit "$status"\n'
    )
    for name in ("google-chrome", "google-chrome-stable"):
        _write_program(name, script)


def main() -> None:
    _set_dumpable(False)
    controller = Controller()
    signal.signal(signal.SIGCHLD, lambda *_: None)
    handlers: dict[str, Any] = {
        "start": lambda r: controller.start(int(r["width"]), int(r["height"])),
        "write_file": lambda r: controller.write_file(r["path"], r["data"]),
        "launch": lambda r: controller.launch(
            r["command"],
            bool(r.get("shell", False)),
            float(r.get("wait_s", 0)),
            str(r.get("title", "")),
        ),
        "execute": lambda r: controller.execute(
            r["command"], bool(r.get("shell", False)), float(r.get("timeout", 60))
        ),
        "wait_window": lambda r: controller.wait_window(r["name"], float(r.get("timeout", 10))),
        "window": lambda r: controller.window(
            r["action"], r["name"], bool(r.get("strict")), bool(r.get("by_class"))
        ),
        "code": lambda r: controller.run_code(r["code"], float(r.get("time_limit", 120))),
        "pointer": lambda r: {"pointer": list(controller.pointer())},
        "screenshot": lambda r: controller.screenshot(),
        "accessibility": lambda r: controller.accessibility(
            int(r.get("max_nodes", 5000)), bool(r.get("cells", True))
        ),
    }
    # Replies get a private copy of stdout; anything a library prints (Xlib warns
    # there) goes to stderr instead of corrupting the protocol.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    controller.private_fds = [0, out.fileno()]
    for line in sys.stdin:
        controller.reap()
        request = json.loads(line)
        started = time.monotonic()
        try:
            reply = handlers[request["op"]](request)
            reply["ok"] = True
        except Exception as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                     "trace": traceback.format_exc()[-2000:]}  # fmt: skip
        reply["elapsed_s"] = round(time.monotonic() - started, 4)
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()

"""OSWorld's task JSON, read unchanged, and whether this machine can run a task.

A task is ``{id, instruction, config[], evaluator{func, result, expected, options,
postconfig, conj}, related_apps, proxy, ...}``. `load_desktop_task` refuses, with
the name, a setup type or evaluator function that OSWorld does not have; one it
has but we do not implement makes the task *unsupported* with that reason
(`support`), as does a download absent from the mirror, a live-web or Google
Drive step, or an application we do not ship. Nothing is skipped silently.

The mirror is a directory keyed by URL the way OSWorld names its cache:
``<uuid5(NAMESPACE_URL, url)>_<basename of the URL's path>``.
"""

from __future__ import annotations

import json
import shutil
import urllib.parse
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentinfra.errors import TaskEnvironmentError

__all__ = [
    "GETTERS",
    "METRICS",
    "SETUP_TYPES",
    "DesktopTask",
    "Support",
    "load_desktop_task",
    "mirror_path",
    "placeholders",
    "support",
]

SETUP_TYPES = ("download", "launch", "open", "execute", "command", "sleep", "activate_window",
               "close_window")  # fmt: skip
"""Setup and postconfig steps we run."""
_OSWORLD_SETUP_ONLY = ("chrome_open_tabs", "chrome_close_tabs", "login", "googledrive",
                       "update_browse_history", "proxy", "execute_with_verification")  # fmt: skip
METRICS = (
    "compare_table", "compare_pptx_files", "infeasible", "check_include_exclude",
    "check_direct_json_object", "exact_match", "compare_docx_files", "compare_pdfs",
    "compare_images", "check_list", "compare_text_file", "compare_csv", "compare_line_spacing",
)  # fmt: skip
"""Metrics we implement (OSWorld's documented semantics, our code)."""
_OSWORLD_METRICS_ONLY = (
    "is_expected_url_pattern_match", "check_json_settings", "is_extension_installed",
    "is_expected_tabs", "is_expected_bookmarks", "check_history_deleted", "compare_archive",
    "check_config_status", "check_image_size", "check_structure_sim", "compare_epub",
    "compare_conference_city_in_order", "check_brightness_decrease_and_structure_sim",
    "is_expected_active_tab", "check_enabled_experiments", "check_font_size", "fuzzy_match",
    "check_gnome_favorite_apps", "is_utc_0", "check_text_enlarged", "check_moved_jpgs",
    "is_in_vm_clickboard", "compare_python_pure_text", "literal_match", "diff_text_file",
    "compare_result_files", "check_accessibility_tree", "check_thunderbird_prefs",
    "check_mp3_meta", "compare_audios", "compare_videos", "check_qt_bgcone", "run_sqlite3",
)  # fmt: skip
GETTERS = ("vm_file", "cloud_file", "rule", "rule_relativeTime", "vm_command_line",
           "accessibility_tree")  # fmt: skip
"""Result and expected getters we implement."""
_OSWORLD_GETTERS_ONLY = (
    "active_url_from_accessTree", "active_tab_html_parse", "active_tab_url_parse", "cache_file",
    "vlc_config", "googledrive_file", "gimp_config_file", "vm_terminal_output", "list_directory",
    "vm_screen_size", "vm_wallpaper", "default_search_engine", "bookmarks", "history",
    "open_tabs_info", "content_from_vm_file", "audio_in_slide", "vscode_config",
)  # fmt: skip
_SHIPPED_APPS = {"soffice", "libreoffice", "localc", "lowriter", "loimpress", "mousepad",
                 "xterm", "bash", "sh", "python3", "python"}  # fmt: skip
_APPS_NOT_SHIPPED = {"google-chrome": "Google Chrome", "chrome": "Google Chrome",
                     "chromium": "a browser with the live web", "code": "VS Code",
                     "gimp": "GIMP", "vlc": "VLC", "thunderbird": "Thunderbird",
                     "nautilus": "Nautilus", "gnome-terminal": "GNOME Terminal"}  # fmt: skip
_OFFICE = {".xlsx", ".xls", ".ods", ".csv", ".docx", ".doc", ".odt", ".rtf", ".pptx", ".ppt",
           ".odp"}  # fmt: skip
_TEXT = {".txt", ".md", ".py", ".json", ".sh", ".log", ".ini", ".conf", ".html", ".xml"}


@dataclass(frozen=True, slots=True)
class DesktopTask:
    """One OSWorld-format task: the JSON as read (``raw``), its path, and the parts we use."""

    raw: dict[str, Any]
    path: Path

    @property
    def id(self) -> str:
        return str(self.raw["id"])

    @property
    def instruction(self) -> str:
        return str(self.raw["instruction"])

    @property
    def config(self) -> list[dict[str, Any]]:
        return list(self.raw.get("config") or [])

    @property
    def evaluator(self) -> dict[str, Any]:
        return dict(self.raw["evaluator"])

    @property
    def funcs(self) -> list[str]:
        func = self.evaluator["func"]
        return [func] if isinstance(func, str) else list(func)

    @property
    def infeasible(self) -> bool:
        return self.funcs == ["infeasible"]

    def graded_files(self) -> list[str]:
        """The ``vm_file`` paths the evaluator reads, in order, each once."""
        found: list[str] = []
        for spec in self.specs("result"):
            if spec is not None and spec["type"] == "vm_file":
                paths = spec.get("path")
                for path in paths if isinstance(paths, list) else [paths]:
                    if str(path) not in found:
                        found.append(str(path))
        return found

    @property
    def postconfig(self) -> list[dict[str, Any]]:
        return list(self.evaluator.get("postconfig") or [])

    def specs(self, key: str) -> list[dict[str, Any] | None]:
        """``result``/``expected``/``options`` as one entry per func (OSWorld's parallel lists)."""
        value = self.evaluator.get(key)
        count = len(self.funcs)
        if isinstance(self.evaluator["func"], list):
            values = list(value) if isinstance(value, list) else [value] * count
        else:
            values = [value]
        if len(values) != count:
            raise TaskEnvironmentError(
                f"task {self.id}: evaluator {key} has {len(values)} entries for {count} funcs"
            )
        return [v if isinstance(v, dict) else None for v in values]

    def solution(self) -> dict[str, Any] | None:
        """Our extension: ``"solution": {"action_space", "actions"}``, the scripted proof it is solvable."""
        solution = self.raw.get("solution")
        return dict(solution) if isinstance(solution, dict) else None


def load_desktop_task(path: Path) -> DesktopTask:
    """Reads one task file.

    Raises:
        TaskEnvironmentError: not JSON, not an object with ``id``, ``instruction`` and
            ``evaluator.func``, or a setup type / evaluator func / getter type that
            OSWorld does not have (named).
    """
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskEnvironmentError(f"cannot read task file {path}: {exc}") from exc
    except ValueError as exc:
        raise TaskEnvironmentError(f"task file {path} is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise TaskEnvironmentError(f"task file {path} is not a JSON object")
    for key in ("id", "instruction", "evaluator"):
        if key not in raw:
            raise TaskEnvironmentError(f"task file {path} has no {key!r}")
    evaluator = raw["evaluator"]
    if not isinstance(evaluator, dict) or "func" not in evaluator:
        raise TaskEnvironmentError(f"task file {path}: evaluator has no 'func'")
    task = DesktopTask(raw, Path(path))
    for step in [*task.config, *task.postconfig]:
        kind = step.get("type") if isinstance(step, dict) else None
        if kind not in SETUP_TYPES and kind not in _OSWORLD_SETUP_ONLY:
            raise TaskEnvironmentError(
                f"task file {path}: unknown config type {kind!r} (known: {', '.join(SETUP_TYPES)})"
            )
    for func in task.funcs:
        if func not in METRICS and func not in _OSWORLD_METRICS_ONLY:
            raise TaskEnvironmentError(
                f"task file {path}: unknown evaluator func {func!r} (known: {', '.join(METRICS)})"
            )
    for key in ("result", "expected"):
        for spec in task.specs(key):
            kind = spec.get("type") if spec else None
            if spec and kind not in GETTERS and kind not in _OSWORLD_GETTERS_ONLY:
                raise TaskEnvironmentError(f"task file {path}: unknown {key} getter type {kind!r}")
    return task


def mirror_path(mirror: Path, url: str) -> Path:
    """Where the mirror keeps ``url``: ``<uuid5(NAMESPACE_URL, url)>_<basename>``, like OSWorld's cache."""
    name = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)).name or "file"
    return Path(mirror) / f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_{name}"


def placeholders(text: str, width: int, height: int) -> str:
    """OSWorld's placeholders: the password (the desktop user has none; sudo is not available) and screen sizes."""
    for key, value in (("{CLIENT_PASSWORD}", "password"), ("{SCREEN_WIDTH_HALF}", str(width // 2)),
                       ("{SCREEN_HEIGHT_HALF}", str(height // 2)), ("{SCREEN_WIDTH}", str(width)),
                       ("{SCREEN_HEIGHT}", str(height))):  # fmt: skip
        text = text.replace(key, value)
    return text


@dataclass(frozen=True, slots=True)
class Support:
    supported: bool
    reason: str


def _program(command: Any) -> str:
    if isinstance(command, list) and command:
        return Path(str(command[0])).name
    if isinstance(command, str) and command.strip():
        return Path(command.split()[0]).name
    return ""


def support(task: DesktopTask, mirror: Path | None) -> Support:
    """Whether this machine can run ``task`` here, and if not, why (the first reason found)."""
    if task.raw.get("proxy"):
        return Support(False, "needs the live web through a proxy (proxy: true)")
    for step in [*task.config, *task.postconfig]:
        kind, params = step["type"], step.get("parameters") or {}
        if kind in _OSWORLD_SETUP_ONLY:
            return Support(
                False, f"setup step {kind!r} needs the live web, a browser or an account"
            )
        if kind == "download":
            for item in params.get("files") or []:
                url = str(item.get("url", ""))
                if "drive.google" in url:
                    return Support(False, f"downloads from Google Drive ({url})")
                if mirror is None or not mirror_path(mirror, url).is_file():
                    return Support(
                        False,
                        f"file {url} is not in the mirror ({mirror}); add it as {mirror_path(Path('MIRROR'), url).name}",
                    )
        if kind in ("launch", "execute", "command"):
            program = _program(params.get("command"))
            if program in _APPS_NOT_SHIPPED:
                return Support(
                    False, f"needs {_APPS_NOT_SHIPPED[program]}, which this desktop does not ship"
                )
            if program and program not in _SHIPPED_APPS and shutil.which(program) is None:
                return Support(False, f"needs program {program!r}, not installed here")
        if kind == "open":
            suffix = Path(str(params.get("path", ""))).suffix.lower()
            if suffix not in _OFFICE and suffix not in _TEXT:
                return Support(
                    False, f"opens a {suffix or 'suffix-less'} file, which no shipped app handles"
                )
    for func in task.funcs:
        if func not in METRICS:
            return Support(False, f"evaluator func {func!r} is not implemented here")
    for key in ("result", "expected"):
        for spec in task.specs(key):
            if spec is None:
                continue
            if spec["type"] not in GETTERS:
                return Support(False, f"{key} getter {spec['type']!r} is not implemented here")
            if spec["type"] == "cloud_file":
                urls = spec.get("path")
                for link in urls if isinstance(urls, list) else [urls]:
                    if mirror is None or not mirror_path(mirror, str(link)).is_file():
                        return Support(
                            False, f"expected file {link} is not in the mirror ({mirror})"
                        )
            if spec["type"] == "vm_file":
                paths = spec.get("path")
                for p in paths if isinstance(paths, list) else [paths]:
                    if not str(p).startswith("/home/user/"):
                        return Support(
                            False,
                            f"result file {p} is outside /home/user, the only place snapshotted",
                        )
    return Support(True, "")

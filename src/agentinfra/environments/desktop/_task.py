"""OSWorld's task JSON, read unchanged, and whether this machine can run a task.

A task is ``{id, instruction, config[], evaluator{func, result, expected, options,
postconfig, conj}, related_apps, proxy, ...}``. `load_desktop_task` refuses, with
the name, a setup type or evaluator function that OSWorld does not have; one it
has but we do not implement makes the task *unsupported* with that reason
(`support`), as does a download absent from the mirror (any URL the mirror holds
is served from it, Google Drive's included), a live-web step, an application we do
not ship, a live postconfig step after a download (downloads apply to the frozen
snapshot), or a check whose command reads a fact of the live desktop that the
episode does not record (processes, packages, the display, paths outside the
home). Nothing is skipped silently.

The mirror is a directory keyed by URL the way OSWorld names its cache:
``<uuid5(NAMESPACE_URL, url)>_<basename of the URL's path>``.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import urllib.parse
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentinfra.environments.desktop._evaluate import CHROME_GETTERS, unimplemented_options
from agentinfra.environments.desktop._evaluate import METRICS as EVALUATE_METRICS
from agentinfra.errors import ConfigError, TaskEnvironmentError

__all__ = [
    "GETTERS",
    "app_config_path",
    "METRICS",
    "SETUP_TYPES",
    "DesktopTask",
    "Support",
    "load_desktop_task",
    "getter_files",
    "mirror_file",
    "mirror_hint",
    "mirror_path",
    "placeholders",
    "selected_task_files",
    "support",
]

SETUP_TYPES = ("download", "launch", "open", "execute", "command", "sleep", "activate_window",
               "close_window")  # fmt: skip
"""Setup and postconfig steps we run."""
_OSWORLD_SETUP_ONLY = ("chrome_open_tabs", "chrome_close_tabs", "login", "googledrive",
                       "update_browse_history", "proxy", "execute_with_verification")  # fmt: skip
METRICS = ("infeasible", *EVALUATE_METRICS)
"""The evaluator funcs implemented here: the grading jail's (`_evaluate.METRICS`) and ``infeasible``."""
"""Metrics we implement (OSWorld's documented semantics, our code)."""
OSWORLD_METRICS = frozenset((
    # Names only (no code), from OSWorld's desktop_env/evaluators/metrics/__init__.py. The
    # upstream repository (github.com/xlang-ai/OSWorld) was not reachable from here; this is the
    # union of the names in the stored forks ljxpython/OSWorldUse @e96a65545f14 and
    # karakuri-ai/OSWorld-JP @3301bf9fd54c, which agree but for three names each has alone.
    "check_gnome_favorite_apps", "is_utc_0", "check_text_enlarged", "check_moved_jpgs",
    "is_in_vm_clickboard", "is_expected_tabs", "is_expected_bookmarks", "compare_pdfs",
    "compare_pdf_editable_fields", "compare_htmls", "compare_archive", "is_cookie_deleted",
    "is_shortcut_on_desktop", "check_font_size", "check_enabled_experiments",
    "check_history_deleted", "is_expected_search_query", "is_expected_active_tab",
    "is_expected_url_pattern_match", "is_added_to_steam_cart", "is_expected_installed_extensions",
    "compare_pdf_images", "is_expected_active_tab_approximate", "compare_font_names",
    "compare_subscript_contains", "has_page_numbers_in_footers", "compare_docx_lines",
    "evaluate_colored_words_in_tables", "check_highlighted_words",
    "evaluate_strike_through_last_paragraph", "evaluate_conversion", "evaluate_spacing",
    "check_italic_font_size_14", "evaluate_alignment", "get_unique_train_ids",
    "check_no_duplicates", "compare_init_lines", "find_default_font", "contains_page_break",
    "compare_docx_files", "compare_docx_tables", "compare_line_spacing", "compare_insert_equation",
    "compare_highlighted_text", "is_first_line_centered", "check_file_exists", "check_tabstops",
    "compare_contains_image", "compare_docx_files_and_ignore_new_lines", "compare_docx_images",
    "compare_image_text", "compare_references", "compare_unique_train_records", "check_csv",
    "check_accessibility_tree", "run_sqlite3", "check_json", "check_list", "exact_match",
    "match_in_list", "is_in_list", "fuzzy_match", "check_include_exclude",
    "check_direct_json_object", "compare_time_in_speedtest_results",
    "is_included_all_json_objects", "is_gold_text_included_in_pdf", "check_line_number",
    "file_contains", "compare_terminal_and_txt", "fuzzy_place_math", "compare_python_pure_text",
    "diff_text_file", "literal_match", "check_structure_sim_resized",
    "check_structure_sim_with_threshold", "check_brightness_decrease_and_structure_sim",
    "check_contrast_increase_and_structure_sim", "check_saturation_increase_and_structure_sim",
    "check_image_size", "check_image_mirror", "check_palette_and_structure_sim",
    "check_textbox_on_leftside", "check_green_background", "check_file_exists_and_structure_sim",
    "check_triangle_position", "check_structure_sim", "check_config_status", "compare_image_list",
    "increase_saturation", "decrease_brightness", "compare_triangle_positions", "check_sharper",
    "check_image_file_size", "check_libre_locale", "compare_epub", "check_mp3_meta",
    "check_pdf_pages", "check_presenter_console_disable", "check_image_stretch_and_center",
    "check_slide_numbers_color", "compare_pptx_files", "check_strikethrough",
    "check_slide_orientation_Portrait", "evaluate_presentation_fill_to_rgb_distance",
    "check_left_panel", "check_transition", "check_page_number_colors", "check_auto_saving_time",
    "compare_table", "compare_csv", "compare_conference_city_in_order", "check_thunderbird_prefs",
    "check_thunderbird_filter", "check_thunderbird_folder", "is_vlc_playing",
    "is_vlc_recordings_folder", "is_vlc_fullscreen", "compare_images", "compare_audios",
    "compare_videos", "check_qt_bgcone", "check_one_instance_when_started_from_file",
    "check_qt_minimal_view", "check_qt_max_volume", "check_qt_slider_colours",
    "check_global_key_play_pause", "check_play_and_exit", "compare_text_file", "compare_config",
    "compare_answer", "compare_result_files", "is_extension_installed", "check_json_settings",
    "check_json_keybindings", "check_python_file_by_test_suite", "check_python_file_by_gold_file",
    "check_html_background_image", "compare_zip_files", "infeasible",
))  # fmt: skip
"""Every evaluator func OSWorld defines: one we lack is "not implemented", any other is unknown."""
GETTERS = ("vm_file", "cloud_file", "cache_file", "rule", "rule_relativeTime", "vm_command_line",
           "accessibility_tree", "gimp_config_file", "vlc_config", *CHROME_GETTERS)  # fmt: skip
"""Result and expected getters we implement (Chrome's: those that read its profile's files)."""


def app_config_path(spec: dict[str, Any]) -> str:
    """Where OSWorld's ``gimp_config_file`` and ``vlc_config`` getters read, in the home: GIMP
    2.10's ``file_name`` and VLC's ``vlcrc``."""
    if spec["type"] == "vlc_config":
        return "/home/user/.config/vlc/vlcrc"
    name = str(spec.get("file_name", ""))
    if not name or name.startswith("/") or ".." in Path(name).parts:
        raise TaskEnvironmentError(
            f"gimp_config_file file_name {name!r} is not a file under ~/.config/GIMP/2.10; "
            "fix the task's getter"
        )
    return f"/home/user/.config/GIMP/2.10/{name}"


OSWORLD_GETTERS = frozenset((
    # Names only, from OSWorld's desktop_env/evaluators/getters/__init__.py (a getter type T is
    # its function get_T): the union of the stored forks samuellin01/osworld-dag-scheduler
    # @8d07fc90ca9a and asyhyxcqdx/osworld-realtime @367fdb88eaf7 (less the latter's own
    # realtime_gui_bench_state); xlang-ai/OSWorld itself was not reachable from here.
    "default_search_engine", "cookie_data", "bookmarks", "open_tabs_info", "pdf_from_url",
    "shortcuts_on_desktop", "history", "page_info", "enabled_experiments", "chrome_language",
    "chrome_font_size", "chrome_color_scheme", "chrome_appearance_mode_ui", "profile_name",
    "number_of_search_results", "googledrive_file", "google_sheet", "google_doc", "google_slide",
    "active_tab_info", "active_tab_url_and_body_text", "enable_do_not_track",
    "enable_enhanced_safety_browsing", "enable_safe_browsing", "new_startup_page",
    "find_unpacked_extension_path", "data_delete_automacally", "active_tab_html_parse",
    "active_tab_url_parse", "gotoRecreationPage_and_get_html_content", "url_dashPart",
    "active_url_from_accessTree", "find_installed_extension_name", "info_from_website",
    "macys_product_url_parse", "url_path_parse", "cloud_file", "local_file", "vm_file",
    "cache_file", "content_from_vm_file", "vm_command_line", "vm_terminal_output",
    "vm_command_error", "gimp_config_file", "audio_in_slide", "background_image_in_slide",
    "vm_screen_size", "vm_window_size", "vm_wallpaper", "list_directory", "rule",
    "accessibility_tree", "rule_relativeTime", "time_diff_range", "replay", "vlc_playing_info",
    "vlc_config", "default_video_player", "vscode_config", "conference_city_in_order",
))  # fmt: skip
"""Every getter type OSWorld defines."""
_SHIPPED_APPS = {"soffice", "libreoffice", "localc", "lowriter", "loimpress", "mousepad",
                 "xterm", "bash", "sh", "python3", "python", "gimp", "vlc", "thunderbird",
                 "google-chrome", "google-chrome-stable", "chromium"}  # fmt: skip
"""Programs the desktop starts that the host may lack (``google-chrome`` is Chromium's launcher
in the desktop, `_controller._browser_launchers`)."""
_APPS_NOT_SHIPPED = {"code": "VS Code", "nautilus": "Nautilus",
                     "gnome-terminal": "GNOME Terminal"}  # fmt: skip
_LENIENT_HERE = {
    "data_delete_automacally": (
        "data_delete_automacally reads 'true' when the profile has any "
        "default_content_setting_values, which this desktop's Chromium writes on its first run: "
        "a do-nothing episode would pass"
    ),
}  # fmt: skip
"""Getters we implement whose reading of this desktop's browser scores a do-nothing episode 1."""
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

    def output_steps(self) -> dict[str, tuple[int, dict[str, Any]]]:
        """Postconfig ``execute``/``command`` steps whose output a ``cache_file`` getter reads, by the
        name they write it to (``stdout``), with their index. OSWorld runs them on the VM and writes
        their output to its cache; here they are checks: they run in the probe, on the snapshot."""
        found: dict[str, tuple[int, dict[str, Any]]] = {}
        for index, step in enumerate(self.postconfig):
            if step.get("type") in ("execute", "command"):
                params = step.get("parameters") or {}
                for key in ("stdout", "stderr"):
                    if params.get(key):
                        found.setdefault(str(params[key]), (index, step))
        return found

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
        if func not in METRICS and func not in OSWORLD_METRICS:
            raise TaskEnvironmentError(
                f"task file {path}: unknown evaluator func {func!r}: OSWorld defines no such "
                f"function (implemented here: {', '.join(METRICS)})"
            )
    for key in ("result", "expected"):
        for spec in task.specs(key):
            kind = spec.get("type") if spec else None
            if spec and kind not in GETTERS and kind not in OSWORLD_GETTERS:
                raise TaskEnvironmentError(
                    f"task file {path}: unknown {key} getter type {kind!r}: OSWorld defines no such getter"
                )
    return task


def selected_task_files(root: Path, selection: Path) -> list[Path]:
    """The task files a task list (OSWorld's ``test_all.json``: ``{domain: [task id, ...]}``) names,
    under ``root``: an OSWorld checkout, its ``evaluation_examples/`` or its ``examples/`` folder.

    Raises:
        ConfigError: the list is not such an object, or names a task file ``root`` lacks.
    """
    try:
        chosen = json.loads(Path(selection).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the task list {selection} (--tasks): {exc}") from exc
    if not isinstance(chosen, dict) or not all(isinstance(v, list) for v in chosen.values()):
        raise ConfigError(
            f"task list {selection} must map each domain to a list of task ids (--tasks)"
        )
    root = Path(root)
    for folder in (root / "evaluation_examples" / "examples", root / "examples", root):
        if folder.is_dir() and all((folder / d).is_dir() for d in chosen):
            break
    else:
        raise ConfigError(
            f"{root} has no examples/<domain>/ folders for {sorted(chosen)} (--tasks {selection})"
        )
    files = [folder / str(d) / f"{i}.json" for d, ids in chosen.items() for i in ids]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ConfigError(f"task list {selection} names {len(missing)} task file(s) {root} lacks, "
                          f"first {missing[0]}")  # fmt: skip
    return files


def mirror_path(mirror: Path, url: str) -> Path:
    """Where a flat mirror keeps ``url``: ``<uuid5(NAMESPACE_URL, url)>_<basename of the URL>``."""
    name = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)).name or "file"
    return Path(mirror) / f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_{name}"


def _one_name(name: str | None) -> str | None:
    """``name`` if it is one plain path component (a task id, a file name), else None."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        return None
    return name


def getter_files(
    spec: dict[str, Any], *, every: bool = False
) -> tuple[list[tuple[str, str | None]], bool]:
    """The (path or url, dest) pairs a ``vm_file`` or ``cloud_file`` getter hands its metric, and
    whether the metric gets one file rather than a list, as OSWorld's getters pick them.

    Without ``multi`` (or with a lone path), the one file. With ``multi``, ``path`` and ``dest``
    are lists and the metric gets those at ``gives`` (default ``[0]``): one file when exactly one
    is given, else a list in file order. ``every``: all its files, given or not (OSWorld's
    ``cloud_file`` fetches them all, and a metric may read one beside the one it is given).

    Raises:
        TaskEnvironmentError: ``gives`` names a file the lists do not have, or the lists differ.
    """
    paths, dests = spec.get("path"), spec.get("dest")
    if not spec.get("multi") or not isinstance(paths, list):
        if isinstance(paths, list):  # our own tasks' shorthand: a list without ``multi``
            return [(str(p), None) for p in paths], False
        return [(str(paths), None if dests is None else str(dests))], True
    if not isinstance(dests, list):
        dests = [dests] * len(paths)
    if len(dests) != len(paths):
        raise TaskEnvironmentError(
            f"{spec.get('type')} getter lists {len(paths)} paths and {len(dests)} dests"
        )
    gives = spec.get("gives", [0])
    if not isinstance(gives, list) or not all(isinstance(g, int) and 0 <= g < len(paths)
                                              for g in gives):  # fmt: skip
        raise TaskEnvironmentError(
            f"{spec.get('type')} getter gives {gives!r}, not indices of its {len(paths)} files"
        )
    pairs = [(str(p), None if d is None else str(d)) for p, d in zip(paths, dests, strict=True)]
    if every:
        return pairs, False
    chosen = [pairs[i] for i in sorted(set(gives))]
    return chosen, len(chosen) == 1


def mirror_candidates(mirror: Path, url: str, *, task_id: str, dest: str | None,
                      cloud: bool = False) -> list[Path]:  # fmt: skip
    """Where ``mirror`` may keep ``url`` for task ``task_id``, in the order they are tried.

    Two layouts are read. OSWorld's own cache keeps a folder per task: a setup or
    postconfig download as ``<task id>/<uuid5(NAMESPACE_URL, url)>_<basename of the
    path it is written to>``, and a ``cloud_file`` getter's file (``cloud=True``) as
    ``<task id>/<dest>``. agentinfra's flat mirror keeps every file as `mirror_path`
    names it. A download is never looked up by its bare ``dest``: in OSWorld's cache
    that name is an expected file's, and the gold must never be written into the home.
    """
    found: list[Path] = []
    folder = _one_name(task_id)
    base = _one_name(Path(dest).name if dest else None)
    if folder is not None and base is not None:
        found.append(Path(mirror) / folder / f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_{base}")
        if cloud and _one_name(dest) is not None:
            found.insert(0, Path(mirror) / folder / str(dest))
    found.append(mirror_path(mirror, url))
    return found


def mirror_file(mirror: Path | None, url: str, *, task_id: str, dest: str | None,
                cloud: bool = False) -> Path | None:  # fmt: skip
    """The mirror's regular file for ``url`` (`mirror_candidates`, first found), or None."""
    if mirror is None:
        return None
    for candidate in mirror_candidates(mirror, url, task_id=task_id, dest=dest, cloud=cloud):
        if candidate.is_file():
            return candidate
    return None


def mirror_hint(mirror: Path | None, url: str, *, task_id: str, dest: str | None,
                cloud: bool = False) -> str:  # fmt: skip
    """One line for a file the mirror lacks: the mirror, and the names it was looked up by."""
    names = mirror_candidates(Path("MIRROR"), url, task_id=task_id, dest=dest, cloud=cloud)
    where = " or ".join(str(n) for n in names)
    if mirror is None:
        return f"{url} needs a mirror (--mirror DIR, AGENTINFRA_DESKTOP_MIRROR); add it as {where}"
    return f"{url} is not in the mirror ({mirror}); add it as {where}"


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


_STARTS_COMMAND = {"|", "||", "&&", ";", "&", "(", ";;", "|&", "((", "{"}
_KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "time", "exec", "command",
             "nohup", "env", "xargs", "timeout", "nice", "builtin"}  # fmt: skip
"""Words after which the next word is still a command (shell keywords and program prefixes)."""
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_LIVE_STATE = {
    **dict.fromkeys(("ps", "pgrep", "pidof", "pstree", "top", "htop", "lsof"), "the live process list (recorded at the freeze, but no check reads the record yet)"),
    **dict.fromkeys(("dpkg", "dpkg-query", "apt", "apt-get", "apt-cache", "snap", "flatpak"),
                    "the installed packages"),
    **dict.fromkeys(("systemctl", "service", "loginctl", "who", "w", "users", "crontab",
                     "timedatectl", "localectl", "hostnamectl", "nmcli", "ss", "netstat"),
                    "the live system's services and sessions"),
    **dict.fromkeys(("xdotool", "wmctrl", "xrandr", "xprop", "xset", "xclip", "xsel", "xwininfo",
                     "pactl", "amixer"), "the live display or sound server"),
}  # fmt: skip
"""Programs that read a fact of the live desktop that the episode does not record for the probe."""
_PROBE_VISIBLE = ("/home/user", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/dev/null",
                  "/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/zero")  # fmt: skip
"""Absolute paths a check's command may name: the home (snapshotted) and the system view the probe shares."""
_ABSOLUTE = re.compile(r"(?:^|[=:])(/[^\s:=]*)")


def _one_line(text: str) -> str:
    """Shell text with its comments dropped and each newline outside quotes made ``;`` (a newline
    ends a command as ``;`` does; joined first, a comment would have run to the end of the text)."""
    out: list[str] = []
    quote = ""
    index = 0
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\" and quote == '"' and index + 1 < len(text):
                out += [char, text[index + 1]]
                index += 2
                continue
            quote = "" if char == quote else quote
        elif char == "\\" and index + 1 < len(text):
            out += [char, text[index + 1]] if text[index + 1] != "\n" else [" "]
            index += 2
            continue
        elif char in "'\"":
            quote = char
        elif char == "#" and (not out or out[-1][-1] in " \t;|&()"):
            end = text.find("\n", index)
            index = len(text) if end < 0 else end
            continue
        elif char == "\n":
            out.append(" ; ")
            index += 1
            continue
        out.append(char)
        index += 1
    return "".join(out)


def _tokens(command: Any, shell: bool) -> list[str]:
    """A command's words: a list as given; a shell string split as the shell would (operators apart)."""
    if isinstance(command, list):
        return [str(c) for c in command]
    if not isinstance(command, str):
        return []
    if not shell:
        return command.split()
    lexer = shlex.shlex(_one_line(command), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: the shell says so when the step runs
        return []


def _command_positions(tokens: list[str], shell: bool) -> list[int]:
    """Where ``tokens`` start programs: the first word, and in a shell string every word in a command
    position (after ``|``, ``&&``, ``;``, ``(``, a keyword or a prefix such as ``nohup``), assignments
    (``X=1``) skipped."""
    if not shell:
        return [0] if tokens else []
    found: list[int] = []
    at_start = True
    for index, token in enumerate(tokens):
        if token in _STARTS_COMMAND:
            at_start = True
        elif at_start and _ASSIGNMENT.match(token):
            continue
        elif at_start:
            found.append(index)
            at_start = token in _KEYWORDS
    return found


def _command_words(command: Any, shell: bool) -> list[str]:
    """The programs a command starts (`_command_positions`), by name."""
    tokens = _tokens(command, shell)
    return [Path(tokens[i]).name if "/" in tokens[i] or not shell else tokens[i]
            for i in _command_positions(tokens, shell)]  # fmt: skip


def _command_needs(command: Any, shell: bool) -> str:
    """Why a check's command cannot be answered by the probe here ("" when it can)."""
    for word in _command_words(command, shell):
        if word in _LIVE_STATE:
            return (f"the check runs {word!r}, which reads {_LIVE_STATE[word]}; the probe that runs "
                    "checks has its own namespaces and sees none of the live desktop")  # fmt: skip
    for token in _tokens(command, shell):
        for path in _ABSOLUTE.findall(token):
            if not any(path == v or path.startswith(v + "/") for v in _PROBE_VISIBLE):
                return (f"the check reads {path}, outside /home/user: only the home is snapshotted "
                        "(the probe sees the desktop's system files, not its / or /tmp)")  # fmt: skip
    return ""


def _step_support(step: dict[str, Any], mirror: Path | None, task_id: str) -> str:
    """Why one setup or postconfig step cannot run here ("" when it can)."""
    kind, params = step["type"], step.get("parameters") or {}
    if kind in _OSWORLD_SETUP_ONLY:
        return f"setup step {kind!r} needs the live web, a browser or an account"
    if kind == "download":
        for item in params.get("files") or []:
            url, dest = str(item.get("url", "")), str(item.get("path", ""))
            if mirror_file(mirror, url, task_id=task_id, dest=dest) is None:
                return "file " + mirror_hint(mirror, url, task_id=task_id, dest=dest)
    if kind in ("launch", "execute", "command"):
        # A shell string is checked by running it (a failed setup step is a finding); only an
        # application we know is absent is named up front. A list's first word is its program.
        shell = bool(params.get("shell"))
        for program in _command_words(params.get("command"), shell):
            if program in _APPS_NOT_SHIPPED:
                return f"needs {_APPS_NOT_SHIPPED[program]}, which this desktop does not ship"
            if not shell and program not in _SHIPPED_APPS and shutil.which(program) is None:
                return f"needs program {program!r}, not installed here"
    if kind == "open":
        suffix = Path(str(params.get("path", ""))).suffix.lower()
        if suffix not in _OFFICE and suffix not in _TEXT:
            return f"opens a {suffix or 'suffix-less'} file, which no shipped app handles"
    return ""


def home_path(path: str) -> str:
    """A postconfig path as OSWorld's VM reads it: a relative one is relative to the home, the working
    folder of the controller and of the probe (OSWorld's ``eval.sh`` checkers are downloaded so)."""
    return path if path.startswith("/") else f"/home/user/{path}"


_CHMOD_SYMBOLIC = re.compile(r"^([ugoa]*)([+-])([rwx]+)$")


def chmod_mode(mode: str, old: int) -> int | None:
    """``old`` changed as ``chmod MODE`` changes it (octal, or ``[ugoa]*[+-][rwx]+``); None for any other form."""
    if re.fullmatch(r"[0-7]{3,4}", mode):
        return int(mode, 8) & 0o7777
    match = _CHMOD_SYMBOLIC.match(mode)
    if match is None:
        return None
    who, sign, what = match.groups()
    shifts = [
        s for letter, s in (("u", 6), ("g", 3), ("o", 0)) if not who or "a" in who or letter in who
    ]
    bits = sum((4 if "r" in what else 0) + (2 if "w" in what else 0) + (1 if "x" in what else 0) << s
               for s in shifts)  # fmt: skip
    return old | bits if sign == "+" else old & ~bits


def _chmods(steps: list[dict[str, Any]]) -> dict[int, tuple[str, list[str]]]:
    """The steps that only ``chmod`` files an earlier one of ``steps`` downloaded, by index: (mode, home paths)."""
    downloaded: set[str] = set()
    found: dict[int, tuple[str, list[str]]] = {}
    for index, step in enumerate(steps):
        params = step.get("parameters") or {}
        if step.get("type") == "download":
            downloaded |= {
                home_path(str(item.get("path", ""))) for item in params.get("files") or []
            }
            continue
        if (
            step.get("type") not in ("execute", "command")
            or params.get("stdout")
            or params.get("stderr")
        ):
            continue
        command = params.get("command")
        if isinstance(command, str) and (
            not params.get("shell") or re.search(r"[;&|<>$`(){}*?~\\]", command)
        ):
            continue  # a plain string runs as one program name; a shell string with more than words is not this
        words = _tokens(command, bool(params.get("shell")))
        if len(words) < 3 or words[0] != "chmod" or chmod_mode(words[1], 0o644) is None:
            continue
        paths = [home_path(w) for w in words[2:]]
        if all(p in downloaded for p in paths):
            found[index] = (words[1], paths)
    return found  # fmt: skip


def snapshot_chmods(task: DesktopTask) -> dict[int, tuple[str, list[str]]]:
    """Postconfig steps that only ``chmod`` files an earlier postconfig step downloaded (OSWorld's
    ``chmod +x eval.sh``), by index: (mode, home paths). The downloads apply to the snapshot, so
    these do too, to its recorded modes (what the probe's copy gets); they never run live."""
    return _chmods(task.postconfig)


def _check_commands(task: DesktopTask) -> list[tuple[Any, bool]]:
    """The commands the task's checks run in the probe: ``vm_command_line`` getters and the steps
    whose stdout ``cache_file`` reads."""
    found = [(spec.get("command"), bool(spec.get("shell"))) for key in ("result", "expected")
             for spec in task.specs(key) if spec is not None and spec["type"] == "vm_command_line"]  # fmt: skip
    for _, step in task.output_steps().values():
        params = step.get("parameters") or {}
        found.append((params.get("command"), bool(params.get("shell"))))
    return found


_SCRIPT_RUNNERS = {"bash", "sh", "source", "."}


def _runs(command: Any, shell: bool, path: str) -> bool:
    """Whether ``command`` runs the shell script ``path``: as a program (``./eval.sh``, its home path)
    or as the script of ``bash``/``sh``/``source`` (``bash eval.sh``); naming it otherwise (``stat
    -c %a ~/backup.sh``) is not running it."""
    if not path.endswith(".sh"):
        return False
    target = home_path(path)
    tokens = _tokens(command, shell)
    for index in _command_positions(tokens, shell):
        if home_path(tokens[index].removeprefix("./")) == target:
            return True
        if Path(tokens[index]).name in _SCRIPT_RUNNERS:
            rest = [t for t in tokens[index + 1 :] if not t.startswith("-")]
            if rest and home_path(rest[0].removeprefix("./")) == target:
                return True
    return False


def setup_checkers(task: DesktopTask) -> list[tuple[str, str, str | None]]:
    """Shell scripts the setup downloads and a check runs (OSWorld's ``os/5c1075ca``: ``eval.sh`` in
    the setup, ``bash eval.sh`` as the check): (url, path, the setup's chmod mode of it or None).
    The agent could have rewritten one in its home, so the grader writes the mirror's bytes over it
    in the snapshot before the checks, as it does for a postconfig download."""
    commands = _check_commands(task)
    modes: dict[str, str] = {}
    for mode, paths in _chmods(task.config).values():
        for path in paths:
            modes[path] = mode
    found: list[tuple[str, str, str | None]] = []
    for step in task.config:
        if step.get("type") != "download":
            continue
        for item in (step.get("parameters") or {}).get("files") or []:
            path = str(item.get("path", ""))
            if any(_runs(command, shell, path) for command, shell in commands):
                found.append((str(item.get("url", "")), path, modes.get(home_path(path))))
    return found


def _script_needs(task: DesktopTask, mirror: Path | None, command: Any, shell: bool) -> str:
    """Why a shell script a check runs, downloaded by the setup or in postconfig from the mirror, cannot
    be answered by the probe (its text read for what it names, never run here); "" when it can or the
    check runs none."""
    for step in [*task.config, *task.postconfig]:
        if step.get("type") != "download":
            continue
        for item in (step.get("parameters") or {}).get("files") or []:
            path = str(item.get("path", ""))
            if not _runs(command, shell, path):
                continue  # only shell scripts are read (a Python checker is not shell text)
            source = mirror_file(mirror, str(item.get("url", "")), task_id=task.id, dest=path)
            if source is None:
                continue  # the download's own check names the missing file
            text = source.read_text(encoding="utf-8", errors="replace")
            if text.strip() and not _tokens(text, True):
                return f"the check runs {path}, whose shell text cannot be read for what it needs"
            reason = _command_needs(text, True)
            if reason:
                return f"the check runs {path}: {reason}"
    return ""


def _output_step_support(task: DesktopTask, mirror: Path | None) -> str:
    """Why the steps that write what ``cache_file`` reads cannot run as checks ("" when they can).

    They run in the probe after every other postconfig step has applied (the live ones, then the
    downloads into the snapshot), so they must come last; only their stdout comes back."""
    outputs = task.output_steps()
    if not outputs:
        return ""
    first = min(index for index, _ in outputs.values())
    for index, step in enumerate(task.postconfig[first:], start=first):
        params = step.get("parameters") or {}
        if step.get("type") not in ("execute", "command") or not params.get("stdout"):
            return (f"postconfig step {index} ({step.get('type')}) follows step {first}, whose output a "
                    "cache_file getter reads; such steps run as checks after all the others")  # fmt: skip
    for name, (index, step) in outputs.items():
        params = step.get("parameters") or {}
        if params.get("stderr"):
            return f"postconfig step {index} writes its stderr for cache_file; the probe returns stdout only"
        if _one_name(name) != name:
            return f"postconfig step {index} writes its stdout to {name!r}, not a plain file name"
        if params.get("until"):
            return f"postconfig step {index} repeats until {params['until']!r}; a check runs once"
        command, shell = params.get("command"), bool(params.get("shell"))
        reason = _command_needs(command, shell) or _script_needs(task, mirror, command, shell)
        if reason:
            return f"postconfig step {index}: {reason}"
    return ""


def _postconfig_support(task: DesktopTask) -> str:
    """Downloads in postconfig apply to the frozen snapshot, so nothing live may come after one."""
    downloaded = False
    outputs = {index for index, _ in task.output_steps().values()} | set(snapshot_chmods(task))
    for index, step in enumerate(task.postconfig):
        if index in outputs:
            continue  # applied to the snapshot, or a check on it (`_output_step_support`): not live
        if step["type"] == "download":
            downloaded = True
            for item in (step.get("parameters") or {}).get("files") or []:
                if not home_path(str(item.get("path", ""))).startswith("/home/user/"):
                    return (f"postconfig step {index} downloads to {item.get('path')}, outside "
                            "/home/user: downloads apply to the snapshot of the home")  # fmt: skip
        elif downloaded:
            return (f"postconfig step {index} ({step['type']}) follows a download; downloads "
                    "apply to the frozen snapshot")  # fmt: skip
    return ""


def support(task: DesktopTask, mirror: Path | None) -> Support:
    """Whether this machine can run ``task`` here, and if not, why (the first reason found)."""
    if task.raw.get("proxy"):
        return Support(False, "needs the live web through a proxy (proxy: true)")
    for step in [*task.config, *task.postconfig]:
        reason = _step_support(step, mirror, task.id)
        if reason:
            return Support(False, reason)
    reason = _postconfig_support(task) or _output_step_support(task, mirror)
    if reason:
        return Support(False, reason)
    for func in task.funcs:
        if func not in METRICS:
            return Support(False, f"not implemented: {func} (an OSWorld evaluator func)")
    for func, options, result in zip(task.funcs, task.specs("options"), task.specs("result"),
                                     strict=True):  # fmt: skip
        missing = unimplemented_options(func, options)
        if missing:  # ignored, it would grade leniently: a reward for doing nothing
            return Support(False, f"not implemented: {', '.join(missing)}")
        if (
            func == "compare_docx_files"
            and result
            and not str(result.get("path")).endswith(".docx")
        ):
            return Support(False, "not implemented: compare_docx_files on files other than .docx")
    for key in ("result", "expected"):
        for spec in task.specs(key):
            if spec is None:
                continue
            if spec["type"] not in GETTERS:
                return Support(False, f"not implemented: {spec['type']} (an OSWorld {key} getter)")
            if spec["type"] in _LENIENT_HERE:
                return Support(False, _LENIENT_HERE[spec["type"]])
            if spec["type"] == "gimp_config_file":
                try:
                    app_config_path(spec)
                except TaskEnvironmentError as exc:
                    return Support(False, str(exc))
            if spec["type"] == "vm_command_line":
                command, shell = spec.get("command"), bool(spec.get("shell"))
                reason = _command_needs(command, shell) or _script_needs(
                    task, mirror, command, shell
                )
                if reason:
                    return Support(False, reason)
            if spec["type"] == "cache_file" and str(spec.get("path")) not in task.output_steps():
                return Support(False, f"cache_file reads {spec.get('path')!r}, which no postconfig "
                                      "step writes (only a step's stdout is kept here)")  # fmt: skip
            if spec["type"] == "cloud_file":
                for link, dest in getter_files(spec, every=True)[0]:
                    if mirror_file(mirror, link, task_id=task.id, dest=dest, cloud=True) is None:
                        return Support(False, "expected file " + mirror_hint(
                            mirror, link, task_id=task.id, dest=dest, cloud=True))  # fmt: skip
            if spec["type"] == "vm_file":
                for p, _ in getter_files(spec)[0]:
                    if not str(p).startswith("/home/user/"):
                        return Support(
                            False,
                            f"result file {p} is outside /home/user, the only place snapshotted",
                        )
    return Support(True, "")

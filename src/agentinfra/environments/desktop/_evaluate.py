"""The desktop grader's checks: getters and metrics, run inside the grading jail.

Started by `_grading._grading_jail` as a script in a jail of its own: another
uid than the episode's and the probe's, no network, the frozen home snapshot
read-only at ``/home/user``, the expected files (from the mirror) read-only at
``/expected``, the grader's Python and its libraries, no system binaries and no
``PATH``. A file getter whose real path leaves the home (the snapshot keeps the
agent's symbolic links) reads as no file. It reads one
JSON request on stdin and writes one JSON reply on stdout:
``{"scores": [per func], "details": [per func], "errors": [per func]}``.

The metrics are our implementation of OSWorld's documented semantics (names,
arguments and rules as in its task files), built on openpyxl, python-docx,
python-pptx, rapidfuzz, pypdf and Pillow. Nothing from the home is executed
here: a ``vm_command_line`` check's command ran before, in the probe jail
(`_probe.py`), and arrives as a value (its bounded stdout).

It imports nothing of agentinfra (it is copied into the jail on its own).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import re
import sys
from typing import Any

Value = Any


class FileValue(str):
    """A getter's file (a path); any other string is a value, never opened as a file."""


# -- getters ----------------------------------------------------------------------
def resolve(spec: dict[str, Any] | None) -> Value:
    if spec is None:
        return None
    kind = spec["kind"]
    if kind == "value":
        return spec["value"]
    if kind == "file":
        paths = spec["path"]
        if isinstance(paths, list):
            return [_file(p) for p in paths]
        return _file(paths)
    if kind == "chrome":
        return CHROME_GETTERS[spec["getter"]]()
    raise ValueError(f"unknown getter kind {kind!r}")


# OSWorld's Chrome getters that read the browser's profile files, as desktop-env 1.0.2 reads
# them on Linux (~/.config/google-chrome), its fallbacks on a missing or unreadable file kept:
# a getter that cannot read returns what OSWorld's returns then (some return "Google", whatever
# they read).
CHROME_PROFILE = "/home/user/.config/google-chrome"


def _chrome_json(name: str) -> Any:
    """A profile file parsed as JSON; raises as OSWorld's ``json.loads(get_file(...))`` would."""
    path = _file(f"{CHROME_PROFILE}/{name}")
    if path is None:
        raise FileNotFoundError(f"~/.config/google-chrome/{name}")
    with open(path, "rb") as handle:
        return json.loads(handle.read())


def _preference(read: Any, fallback: Any, name: str = "Default/Preferences") -> Any:
    try:
        return read(_chrome_json(name))
    except Exception:
        return fallback


def _chrome_bookmarks() -> Any:
    """No fallback: OSWorld's reads ``[]`` for a missing file and raises on a broken one."""
    path = _file(f"{CHROME_PROFILE}/Default/Bookmarks")
    if path is None or os.path.getsize(path) == 0:
        return []
    return _chrome_json("Default/Bookmarks").get("roots", {})


def _truth(value: Any) -> str:
    return "true" if value else "false"


def _startup_page(data: dict[str, Any]) -> str:
    """No ``session`` key is a fresh start, which OSWorld reads as the new tab page."""
    if "session" not in data:
        return "true"
    return _truth(data.get("session", {}).get("restore_on_startup", {}) == 5)


_FONT_DEFAULTS = {"default_fixed_font_size": 13, "default_font_size": 16, "minimum_font_size": 13}
CHROME_GETTERS: dict[str, Any] = {
    "default_search_engine": lambda: _preference(
        lambda d: d.get("default_search_provider_data", {}).get("template_url_data", {})
        .get("short_name", "Google"), "Google"),
    "profile_name": lambda: _preference(lambda d: d.get("profile", {}).get("name", None), None),
    "enabled_experiments": lambda: _preference(
        lambda d: d.get("browser", {}).get("enabled_labs_experiments", []), [], "Local State"),
    "chrome_language": lambda: _preference(
        lambda d: d.get("intl", {}).get("app_locale", "en-US"), "en-US", "Local State"),
    "chrome_font_size": lambda: _preference(
        lambda d: d.get("webkit", {}).get("webprefs", dict(_FONT_DEFAULTS)),
        {"default_fixed_font_size": 13, "default_font_size": 16}),
    "bookmarks": _chrome_bookmarks,
    "enable_do_not_track": lambda: _preference(
        lambda d: _truth(d.get("enable_do_not_track", {})), "false"),
    "enable_enhanced_safety_browsing": lambda: _preference(
        lambda d: _truth(d.get("safebrowsing", {}).get("enhanced", {})), "Google"),
    "new_startup_page": lambda: _preference(_startup_page, "Google"),
    "find_unpacked_extension_path": lambda: _preference(
        lambda d: [e["path"] for e in d.get("extensions", {}).get("settings", {}).values()],
        "Google"),
    "find_installed_extension_name": lambda: _preference(
        lambda d: [e["manifest"]["name"]
                   for e in d.get("extensions", {}).get("settings", {}).values()], "Google"),
    "data_delete_automacally": lambda: _preference(
        lambda d: _truth(d["profile"].get("default_content_setting_values", None) is not None),
        "Google"),
}  # fmt: skip
"""OSWorld's getter name -> its value, read from the snapshot's Chrome profile."""


def _file(path: str) -> FileValue | None:
    """``path`` if it is a regular file whose real place stays where it names (the home or
    ``/expected``): the snapshot keeps the agent's symbolic links, and one pointing out of the
    home (at ``/expected``, say) reads as no file at all."""
    real = os.path.realpath(path)
    for root in ("/home/user/", "/expected/"):
        if path.startswith(root):
            return FileValue(real) if real.startswith(root) and os.path.isfile(real) else None
    return None


def _text(value: Value) -> str | None:
    """A getter's value as text: a file's contents, or the string itself."""
    if value is None:
        return None
    if isinstance(value, FileValue):
        with open(value, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    return value if isinstance(value, str) else json.dumps(value)


# -- metrics ----------------------------------------------------------------------
def _sheet(workbook: Any, index: Any) -> Any:
    if isinstance(index, int):
        return workbook.worksheets[index]
    text = str(index)
    if text[1:2] == "I":
        return workbook.worksheets[int(text[2:])]
    if text[1:2] == "N":
        return workbook[text[2:]]
    raise ValueError(f"sheet index {index!r} is not RI<n>, RN<name>, EI<n> or EN<name>")


def _printed(result: Any, expected: Any, ours: Any, gold: Any, index: Any) -> list[str] | None:
    """OSWorld's sheet_print: the sheet as LibreOffice printed it to ``<book's stem>-<sheet name>.csv``
    beside the book (the task's postconfig converts it), its lines stripped and trailing blank lines
    dropped; None when there is no such file."""
    text = str(index)
    book, path = (gold, expected) if text.startswith("E") else (ours, result)
    if book is None or path is None:
        return None
    names = book.sheetnames
    try:
        name = (
            names[index]
            if isinstance(index, int)
            else names[int(text[2:])]
            if text[1:2] == "I"
            else text[2:]
        )
    except (IndexError, ValueError):
        return None
    printed = _file(f"{os.path.splitext(str(path))[0]}-{name}.csv")
    if printed is None:
        return None
    lines = [line.strip() for line in _lines(printed)]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _grid(sheet: Any, digits: int = 9) -> list[list[Any]]:
    rows = [list(row) for row in sheet.iter_rows(values_only=True)]
    rows = [[_norm(v, digits) for v in row] for row in rows]
    while rows and all(v is None for v in rows[-1]):
        rows.pop()
    width = max(
        (max((i + 1 for i, v in enumerate(r) if v is not None), default=0) for r in rows), default=0
    )
    return [(r + [None] * width)[:width] for r in rows]


def _norm(value: Any, digits: int = 9) -> Any:
    if isinstance(value, float):
        value = round(value, digits)
        return int(value) if value.is_integer() else value
    if value == "":
        return None
    return value


def _compare_cell(value: Any, method: str, ref: Any) -> bool:
    value = _norm(value)
    if method == "eq":
        return bool(value == _norm(ref))
    if method == "ne":
        return bool(value != _norm(ref))
    if method in ("lt", "le", "gt", "ge"):
        try:
            a, b = float(value), float(ref)
        except (TypeError, ValueError):
            return False
        return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[method]
    if method == "str_eq":
        return str(value) == str(ref)
    if method == "approx":
        try:
            return abs(float(value) - float(ref)) <= 1e-6 * max(1.0, abs(float(ref)))
        except (TypeError, ValueError):
            return False
    if method.startswith("approx:"):  # OSWorld's approx:THRESHOLD, an absolute difference
        try:
            return abs(float(value) - float(ref)) <= float(method.split(":", 1)[1])
        except (TypeError, ValueError):
            return False
    raise ValueError(f"unknown check_cell method {method!r}")


def _fuzzy_rule(a: Any, b: Any, rule: dict[str, Any]) -> bool:
    from rapidfuzz import fuzz

    sa, sb = "" if a is None else str(a), "" if b is None else str(b)
    if rule.get("trim_leadings"):
        sa, sb = sa.lstrip(rule["trim_leadings"]), sb.lstrip(rule["trim_leadings"])
    if rule.get("trim_trailings"):
        sa, sb = sa.rstrip(rule["trim_trailings"]), sb.rstrip(rule["trim_trailings"])
    if rule.get("ignore_case"):
        sa, sb = sa.lower(), sb.lower()
    kind = rule.get("type", "exact_match")
    if kind == "exact_match":
        return sa == sb
    if kind == "fuzzy_match":
        return fuzz.ratio(sa, sb) >= float(rule.get("threshold", 85))
    if kind == "includes":
        return sb in sa
    if kind == "included_by":
        return sa in sb
    if kind == "starts_with":
        return sa.startswith(sb)
    if kind == "ends_with":
        return sa.endswith(sb)
    raise ValueError(f"unknown sheet_fuzzy rule type {kind!r}")


def _match_rule(value: Any, rule: dict[str, Any]) -> bool:
    """OSWorld's ``_match_value_to_rule``: ``rule["method"]`` applied to ``value`` and ``rule["ref"]``
    (`MATCH_METHODS`: ``re[.FLAG...]``, the six comparisons, ``approx:T``, ``spreadsheet_range``,
    ``range.XY`` (X, Y each ``t`` or ``e``: open or closed ends), ``str_list_eq``, ``str_set_eq``)."""
    import operator

    method, ref = str(rule["method"]), rule["ref"]
    if method.startswith("re"):
        flags = 0
        for name in method.split(".")[1:]:
            flags |= int(getattr(re, name))
        return re.search(ref, value, flags) is not None
    if method in ("eq", "ne", "le", "lt", "ge", "gt"):
        return bool(getattr(operator, method)(value, ref))
    if method.startswith("approx:"):
        try:
            return abs(float(value) - float(ref)) <= float(method.split(":", 1)[1])
        except (TypeError, ValueError):
            return False
    if (
        method == "spreadsheet_range"
    ):  # value (a MultiCellRange) lies within ref[1] and covers ref[0]
        from openpyxl.worksheet.cell_range import MultiCellRange

        inner, outer = MultiCellRange(ref[0]), MultiCellRange(ref[1])
        return all(r in value for r in inner) and all(r in outer for r in value)
    if method.startswith("range.") and len(method) == 8:
        left, right = (getattr(operator, "l" + end) for end in method[6:8])
        return bool(left(ref[0], value) and right(value, ref[1]))
    if method in ("str_list_eq", "str_set_eq"):
        kind = list if method == "str_list_eq" else set
        return bool(kind(str(value).strip("\"'").split(",")) == kind(ref))
    raise ValueError(f"unknown match method {method!r}")


def _known_match_method(method: Any) -> bool:
    if not isinstance(method, str):
        return False
    if method.startswith("approx:"):
        return _known_method(method)
    if method.startswith("range."):
        return len(method) == 8 and set(method[6:8]) <= {"t", "e"}
    if method == "re" or method.startswith("re."):
        return all(isinstance(getattr(re, f, None), re.RegexFlag) for f in method.split(".")[1:])
    return method in MATCH_METHODS


def _cell_style(name: str, cell: Any) -> Any:
    """OSWorld's ``_read_cell_style`` of a cell (`CELL_STYLES`): font and number format only for
    a cell with a value, the fill's foreground colour for ``bgcolor`` as for ``fgcolor``."""
    has_value = cell.value is not None
    if name == "number_format":
        return cell.number_format if has_value and cell.data_type == "n" else None
    if name.startswith("font_"):
        if not has_value:
            return None
        font = cell.font
        if name == "font_color":  # OSWorld's read fails without a colour, and reads as None
            return font.color.rgb if font.color is not None else None
        return getattr(font, {"font_name": "name", "font_family": "family", "font_bold": "bold",
                              "font_italic": "italic", "font_underline": "underline",
                              "font_size": "size"}[name])  # fmt: skip
    if name == "fill_type":
        try:
            return cell.fill.tagname
        except AttributeError:
            return None
    if name in ("bgcolor", "fgcolor"):
        try:
            return cell.fill.fgColor.rgb
        except AttributeError:
            return None
    if name == "hyperlink":
        return (cell.hyperlink or "") if has_value else None
    if name == "merge":
        from openpyxl.cell.cell import MergedCell

        return isinstance(cell, MergedCell)
    raise ValueError(f"cell style {name!r} is not implemented")


def _rich_title(title: Any) -> Any:
    try:
        return title.tx.rich.p[0].r[0].t
    except (AttributeError, IndexError, TypeError):
        return None


def _charts(sheet: Any, props: set[str]) -> dict[str, dict[str, Any]]:
    """OSWorld's ``load_charts``: each chart of a sheet keyed by its series' value and category
    references, with the properties asked for (`CHART_PROPS`). The anchor is OSWorld's list, which
    reads the end row twice and never the start row."""

    def ref(data: Any) -> str:
        for kind in ("numRef", "strRef"):
            inner = getattr(data, kind, None)
            if inner is not None and getattr(inner, "f", None) is not None:
                return str(inner.f)
        return ""

    found: dict[str, dict[str, Any]] = {}
    for chart in [] if sheet is None else sheet._charts:
        key = ";".join(f"{ref(s.val)},{ref(s.cat)}" for s in chart.series)
        info: dict[str, Any] = {}
        if "title" in props:
            info["title"] = _rich_title(chart.title)
        if "legend" in props:
            info["legend"] = chart.legend.position if chart.legend is not None else None
        if "anchor" in props:
            a = chart.anchor
            info["anchor"] = [a.editAs, a._from.col, a.to.row, a.to.col, a.to.row]
        for prop, attribute in (("width", "width"), ("height", "height"), ("type", "tagname"),
                                ("direction", "barDir")):  # fmt: skip
            if prop in props:
                info[prop] = getattr(chart, attribute)
        for prop, axis in (("xtitle", "x_axis"), ("ytitle", "y_axis"), ("ztitle", "z_axis")):
            if prop in props:
                info[prop] = _rich_title(getattr(getattr(chart, axis, None), "title", None))
        found[key] = info
    return found


def _pivots(sheet: Any, props: set[str]) -> dict[str, dict[str, Any]]:
    """OSWorld's ``load_pivot_tables``: each pivot table of a sheet keyed by its source (type,
    range less the empty fields at either end, sheet), with the properties asked for
    (`PIVOT_PROPS`). Field indices count from the first non-empty field, as OSWorld's do."""
    from openpyxl.utils.cell import coordinate_to_tuple

    found: dict[str, dict[str, Any]] = {}
    for pivot in [] if sheet is None else sheet._pivots:
        raw = [
            [(item.h, item.x) for item in f.items if item.x is not None] for f in pivot.pivotFields
        ]
        first = next((i for i, r in enumerate(raw) if r), len(raw))
        last = next((i for i in range(len(raw) - 1, first - 1, -1) if raw[i]), first - 1)
        selection, left, right = raw[first : last + 1], first, len(raw) - 1 - last
        if not selection:
            right = 0
        source = pivot.cache.cacheSource
        start, end = source.worksheetSource.ref.split(":")
        r1, c1 = coordinate_to_tuple(start)
        r2, c2 = coordinate_to_tuple(end)
        key = f"{source.type};{(r1, c1 + left)}:{(r2, c2 - right)};{source.worksheetSource.sheet}"
        info: dict[str, Any] = {}
        for prop, attribute in (("name", "name"), ("show_total", "visualTotals"),
                                ("show_empty_row", "showEmptyRow"), ("show_empty_col", "showEmptyCol"),
                                ("show_headers", "showHeaders"), ("location", "location")):  # fmt: skip
            if prop in props:
                info[prop] = getattr(pivot, attribute)
        if "filter" in props or "selection" in props:
            info["selection"] = selection if "ordered" in props else [set(r) for r in selection]
        if "filter" in props:
            info["filter_fields"] = {f.fld for f in pivot.pageFields}
        if "col_fields" in props:
            info["col_fields"] = [f.x - left for f in pivot.colFields]
        if "row_fields" in props:
            info["row_fields"] = [f.x - left for f in pivot.rowFields]
        if "data_fields" in props:
            named = "data_fields_name" in props
            info["data_fields"] = [f"{f.fld - left:d};{f.name if named else ''};{f.subtotal};"
                                   f"{f.showDataAs}" for f in pivot.dataFields]  # fmt: skip
        found[key] = info
    return found


def _dimensions(sheet: Any, kind: str, props: list[str]) -> dict[Any, dict[str, Any]]:
    """OSWorld's ``load_rows_or_cols``: every row or column the sheet describes, with the
    properties asked for (`ROW_PROPS`, `COL_PROPS`)."""
    if sheet is None:
        return {}
    held = sheet.row_dimensions if kind == "row" else sheet.column_dimensions
    return {key: {p: getattr(dims, p) for p in props} for key, dims in held.items()}


def _validations_hold(sheet: Any, wanted: list[dict[str, Any]]) -> bool:
    """OSWorld's data_validation rule: at least as many validations as patterns, and every
    validation matching one pattern (each attribute by its method)."""
    validations = sheet.data_validations.dataValidation
    if len(validations) < len(wanted):
        return False
    return all(
        any(all(_match_rule(getattr(v, a), m) for a, m in pattern.items()) for pattern in wanted)
        for v in validations
    )


def compare_table(result: Value, expected: Value = None, **options: Any) -> float:
    """OSWorld's compare_table: every rule must hold (`TABLE_RULES`: sheet_name, sheet_data, sheet_print,
    sheet_fuzzy, check_cell on values and styles, chart, pivot_table, row_props, col_props, freeze,
    zoom, data_validation)."""
    if result is None:
        return 0.0
    import openpyxl

    ours = openpyxl.load_workbook(result, data_only=True)
    gold = openpyxl.load_workbook(expected, data_only=True) if expected else None
    rules = options.get("rules") or [{"type": "sheet_data", "sheet_idx0": f"RI{i}", "sheet_idx1": f"EI{i}"}
                                     for i in range(len(gold.worksheets) if gold else 0)]  # fmt: skip

    def pick(index: Any) -> Any:
        book = gold if str(index).startswith("E") else ours
        if book is None:
            raise ValueError(
                f"rule names expected sheet {index!r} but the task has no expected file"
            )
        return _sheet(book, index)

    def pick_or_none(index: Any) -> Any:  # OSWorld reads a sheet that is not there as nothing
        try:
            return pick(index)
        except (KeyError, IndexError):
            return None

    formulas: dict[str, Any] = {}

    def styled(index: Any) -> Any:
        """The sheet as OSWorld reads it for styles: formulas kept, not their cached values (a
        formula cell whose value was never cached still has a value)."""
        side = "E" if str(index).startswith("E") else "R"
        if side not in formulas:
            formulas[side] = openpyxl.load_workbook(expected if side == "E" else result)
        return _sheet(formulas[side], index)

    for rule in rules:
        kind = rule["type"]
        try:
            if kind == "sheet_data":
                digits = int(rule.get("precision", 4))  # OSWorld rounds both sheets to 4 decimals
                if _grid(pick(rule["sheet_idx0"]), digits) != _grid(
                    pick(rule["sheet_idx1"]), digits
                ):
                    return 0.0
            elif kind == "sheet_print":
                printed = [
                    _printed(result, expected, ours, gold, rule[k])
                    for k in ("sheet_idx0", "sheet_idx1")
                ]
                if rule.get("ignore_case"):
                    printed = [None if p is None else [x.lower() for x in p] for p in printed]
                if printed[0] is None or printed[0] != printed[1]:
                    return 0.0
            elif kind == "sheet_name":
                if gold is None or ours.sheetnames != gold.sheetnames:
                    return 0.0
            elif kind == "check_cell":
                sheet = pick(rule.get("sheet_idx", "RI0"))
                cell = sheet[rule["coordinate"]]
                for prop, check in (rule.get("props") or {}).items():
                    if prop == "value":
                        if not _compare_cell(
                            cell.value, check.get("method", "eq"), check.get("ref")
                        ):
                            return 0.0
                        continue
                    if prop not in CELL_STYLES:
                        raise ValueError(f"check_cell property {prop!r} is not implemented")
                    try:
                        style = _cell_style(
                            prop, styled(rule.get("sheet_idx", "RI0"))[rule["coordinate"]]
                        )
                    except (AttributeError, KeyError, IndexError):
                        style = None  # as OSWorld: a style it cannot read is None
                    if not _match_rule(style, check):
                        return 0.0
            elif kind in ("chart", "pivot_table"):
                load, props = (
                    (_charts, "chart_props") if kind == "chart" else (_pivots, "pivot_props")
                )
                wanted = set(rule.get(props) or [])
                if load(pick_or_none(rule["sheet_idx0"]), wanted) != load(
                    pick_or_none(rule["sheet_idx1"]), wanted
                ):
                    return 0.0
            elif kind in ("row_props", "col_props"):
                obj, asked = kind[:3], list(rule.get("props") or [])
                if _dimensions(pick_or_none(rule["sheet_idx0"]), obj, asked) != _dimensions(
                    pick_or_none(rule["sheet_idx1"]), obj, asked
                ):
                    return 0.0
            elif kind == "freeze":
                panes = [pick(rule[k]).freeze_panes for k in ("sheet_idx0", "sheet_idx1")]
                if panes[0] != panes[1]:
                    return 0.0
            elif kind == "zoom":
                zoom = pick(rule["sheet_idx"]).sheet_view.zoomScale or 100.0
                if not _match_rule(zoom, rule):
                    return 0.0
            elif kind == "data_validation":
                if not _validations_hold(pick(rule["sheet_idx"]), list(rule.get("dv_props") or [])):
                    return 0.0
            elif kind == "sheet_fuzzy":
                a, b = pick(rule["sheet_idx0"]), pick(rule["sheet_idx1"])
                for sub in rule.get("rules") or []:
                    for area in sub["range"]:
                        for row_a, row_b in zip(a[area], b[area], strict=True):
                            for ca, cb in zip(row_a, row_b, strict=True):
                                if not _fuzzy_rule(ca.value, cb.value, sub):
                                    return 0.0
            else:
                raise ValueError(f"compare_table rule {kind!r} is not implemented")
        except (KeyError, IndexError):
            return 0.0
    return 1.0


PPTX_EXAMINE = {
    "number_of_slides": True, "shape": True, "text": True, "indent": True, "font_name": True,
    "font_size": True, "font_bold": True, "font_italic": True, "color_rgb": True,
    "font_underline": True, "strike_through": True, "alignment": True, "bullets": True,
    "background_color": True, "note": True, "title_bottom_position": False,
    "table_bottom_position": False, "right_position": False, "top_position": False,
    "shape_for_shift_size": False, "image_size": False, "modify_height": False,
}  # fmt: skip
"""compare_pptx_files' ``examine_*`` options and their defaults, as OSWorld's (desktop-env 1.0.2)."""

_PICTURE, _FREEFORM, _TABLE = 13, 5, 19  # python-pptx's MSO_SHAPE_TYPE values OSWorld tests
_DRAWING = "{http://schemas.openxmlformats.org/drawingml/2006/main}"


def _rgb(font: Any) -> Any:
    """A run's explicit RGB colour, or None when it has none (theme or inherited colours)."""
    try:
        return font.color.rgb
    except AttributeError:
        return None


def _runs_match(ra: Any, rb: Any, examine: dict[str, bool], *, table_cell: bool) -> bool:
    """One pair of runs as OSWorld compares them: bold and italic treat None as False; underline
    differs when both are set and differ, or one is None and the other True; colour only when
    both runs have an explicit RGB. In a table cell only colour, bold, italic and underline are
    compared, and bold, italic and underline regardless of their options (as OSWorld does)."""
    fa, fb = ra.font, rb.font
    if not table_cell:
        if examine["font_name"] and fa.name != fb.name:
            return False
        if examine["font_size"] and fa.size != fb.size:
            return False
    if (table_cell or examine["font_bold"]) and bool(fa.bold) != bool(fb.bold):
        return False
    if (table_cell or examine["font_italic"]) and bool(fa.italic) != bool(fb.italic):
        return False
    ca, cb = _rgb(fa), _rgb(fb)
    if examine["color_rgb"] and ca is not None and cb is not None and ca != cb:
        return False
    ua, ub = fa.underline, fb.underline
    if (
        (table_cell or examine["font_underline"])
        and ua != ub
        and (
            (ua is not None and ub is not None)
            or (ua is None and ub is True)
            or (ua is True and ub is None)
        )
    ):
        return False
    if not table_cell and examine["strike_through"]:
        strike = (
            fa._element.attrib.get("strike", "noStrike"),
            fb._element.attrib.get("strike", "noStrike"),
        )
        if strike[0] != strike[1]:
            return False
    return True


def _bullets(slide: Any) -> list[tuple[Any, Any, str]] | None:
    """Every non-empty paragraph of a slide's XML as (level, bullet character, text); None when
    the XML cannot be read (OSWorld then skips the bullet check)."""
    from xml.etree import ElementTree

    try:
        root = ElementTree.fromstring(slide.part.blob)
        found: list[tuple[Any, Any, str]] = []
        for paragraph in root.iter(f"{_DRAWING}p"):
            props = paragraph.find(f"{_DRAWING}pPr")
            level: str | None = "No Level"
            char: str | None = "No Bullet"
            if props is not None:
                bullet = props.find(f"{_DRAWING}buChar")
                level = props.get("lvl", "0")  # OSWorld: an absent level is "0"
                char = bullet.get("char") if bullet is not None else "No Bullet"
            pieces = [t.text for t in paragraph.iter(f"{_DRAWING}t")]
            if None in pieces:  # OSWorld's join fails there, and it skips the check
                return None
            text = "".join(p for p in pieces if p is not None)
            if text.strip():
                found.append((level, char, text))
        return found
    except (TypeError, ValueError, ElementTree.ParseError):
        return None


def _text_shapes(shapes: Any) -> list[Any]:
    """The shapes with a text frame, groups' members included, in document order."""
    found = []
    for shape in shapes:
        if hasattr(shape, "text") and hasattr(shape, "text_frame"):
            found.append(shape)
        if hasattr(shape, "shapes"):
            found += _text_shapes(shape.shapes)
    return found


def _background(slide: Any) -> Any:
    """A slide's solid background colour (its master's when it inherits one), else None."""
    fill = slide.background.fill
    if fill.type == 5:  # MSO_FILL.BACKGROUND: the master's
        fill = slide.slide_layout.slide_master.background.fill
    return fill.fore_color.rgb if fill.type == 1 else None  # MSO_FILL.SOLID


def _alignment(paragraph: Any) -> Any:
    from pptx.enum.text import PP_ALIGN

    return PP_ALIGN.LEFT if paragraph.alignment is None else paragraph.alignment


def compare_pptx_files(result: Value, expected: Value, **options: Any) -> float:
    """OSWorld's compare_pptx_files (desktop-env 1.0.2): slide by slide, background colour and
    notes; shape by shape, geometry (within ``approximately_tolerance``), tables, text,
    paragraphs (alignment, level), runs (font, colour, underline, strike-through) and the
    slide's bullets, each ``examine_*`` option on or off as `PPTX_EXAMINE` defaults it; then the
    text shapes inside groups. The position options OSWorld wrote for single tasks keep its
    task-specific thresholds."""
    if result is None or expected is None:
        return 0.0
    from pptx import Presentation

    examine = {k: bool(options.get(f"examine_{k}", v)) for k, v in PPTX_EXAMINE.items()}
    tolerance = float(options.get("approximately_tolerance", 0.005))

    def near(x: Any, y: Any) -> bool:
        if x == y:
            return True
        if not x or not y:
            return False
        return bool(abs(x - y) / max(abs(x), abs(y)) <= tolerance)

    def same_box(sa: Any, sb: Any) -> bool:
        return all(near(getattr(sa, k), getattr(sb, k)) for k in ("left", "top", "width", "height"))

    a, b = Presentation(result), Presentation(expected)
    if examine["number_of_slides"] and len(a.slides) != len(b.slides):
        return 0.0
    for number, (slide_a, slide_b) in enumerate(zip(a.slides, b.slides, strict=False), start=1):
        if examine["background_color"] and _background(slide_a) != _background(slide_b):
            return 0.0
        notes = (
            slide_a.notes_slide.notes_text_frame.text,
            slide_b.notes_slide.notes_text_frame.text,
        )
        if examine["note"] and notes[0].strip() != notes[1].strip():
            return 0.0
        shapes_a, shapes_b = list(slide_a.shapes), list(slide_b.shapes)
        if len(shapes_a) != len(shapes_b):
            return 0.0
        bullets_checked = False
        for sa, sb in zip(shapes_a, shapes_b, strict=True):
            texts = hasattr(sa, "text") and hasattr(sb, "text")
            if examine["title_bottom_position"]:
                if texts and sa.text == sb.text:
                    if sa.text == "Product Comparison" and (sa.top <= sb.top or sa.top < 3600000):
                        return 0.0
                elif not same_box(sa, sb):
                    return 0.0
            if examine["table_bottom_position"]:
                if number == 3 and sa.shape_type == sb.shape_type == _TABLE:
                    if sa.top <= sb.top or sa.top < 3600000:
                        return 0.0
                elif not same_box(sa, sb):
                    return 0.0
            if (examine["right_position"] and number == 2 and not hasattr(sa, "text")
                    and not hasattr(sb, "text") and (sa.left <= sb.left or sa.left < 4320000)):  # fmt: skip
                return 0.0
            if (examine["top_position"] and number == 2 and sa.shape_type == sb.shape_type == _PICTURE
                    and (sa.top >= sb.top or sa.top > 1980000)):  # fmt: skip
                return 0.0
            if (
                examine["shape_for_shift_size"]
                and not same_box(sa, sb)
                and not (texts and sa.text == sb.text == "Elaborate on what you want to discuss.")
            ):
                return 0.0
            if examine["shape"] and not same_box(sa, sb):
                return 0.0
            if examine["image_size"]:
                if sa.shape_type == sb.shape_type == _PICTURE:
                    if not (near(sa.width, sb.width) and near(sa.height, sb.height)):
                        return 0.0
                elif not same_box(sa, sb):
                    return 0.0
            if examine["modify_height"]:
                plain = not hasattr(sa, "text") and not hasattr(sb, "text")
                if plain or sa.shape_type == sb.shape_type == _FREEFORM:
                    if not near(sa.height, sb.height):
                        return 0.0
                elif not same_box(sa, sb):
                    return 0.0
            if sa.shape_type == _TABLE:
                ta, tb = sa.table, sb.table
                if (len(ta.rows), len(ta.columns)) != (len(tb.rows), len(tb.columns)):
                    return 0.0
                for row in range(len(ta.rows)):
                    for column in range(len(ta.columns)):
                        pa = ta.cell(row, column).text_frame.paragraphs
                        pb = tb.cell(row, column).text_frame.paragraphs
                        if len(pa) != len(pb):
                            return 0.0
                        for para_a, para_b in zip(pa, pb, strict=True):
                            if len(para_a.runs) != len(para_b.runs):
                                return 0.0
                            for ra, rb in zip(para_a.runs, para_b.runs, strict=True):
                                if not _runs_match(ra, rb, examine, table_cell=True):
                                    return 0.0
            if not texts:
                continue
            if examine["text"] and sa.text.strip() != sb.text.strip():
                return 0.0
            paragraphs_a, paragraphs_b = sa.text_frame.paragraphs, sb.text_frame.paragraphs
            if len(paragraphs_a) != len(paragraphs_b):
                return 0.0
            for pa, pb in zip(paragraphs_a, paragraphs_b, strict=True):
                if examine["alignment"] and _alignment(pa) != _alignment(pb):
                    return 0.0
                if examine["text"] and pa.text != pb.text:
                    return 0.0
                if examine["indent"] and pa.level != pb.level:
                    return 0.0
                if len(pa.runs) != len(pb.runs):
                    return 0.0
                for ra, rb in zip(pa.runs, pb.runs, strict=True):
                    if not _runs_match(ra, rb, examine, table_cell=False):
                        return 0.0
                    if examine["bullets"] and not bullets_checked:
                        bullets_checked = True  # the whole slide's bullets: the same for every run
                        found_a, found_b = _bullets(slide_a), _bullets(slide_b)
                        if found_a is not None and found_b is not None and found_a != found_b:
                            return 0.0
        text_a, text_b = _text_shapes(slide_a.shapes), _text_shapes(slide_b.shapes)
        if len(text_a) != len(text_b):
            return 0.0
        if examine["alignment"]:
            for sa, sb in zip(text_a, text_b, strict=True):
                if examine["text"] and sa.text.strip() != sb.text.strip():
                    return 0.0
                paragraphs_a, paragraphs_b = sa.text_frame.paragraphs, sb.text_frame.paragraphs
                if len(paragraphs_a) != len(paragraphs_b):
                    return 0.0
                if any(_alignment(pa) != _alignment(pb)
                       for pa, pb in zip(paragraphs_a, paragraphs_b, strict=True)):  # fmt: skip
                    return 0.0
    return 1.0


def check_include_exclude(result: Value, rules: dict[str, Any], **_: Any) -> float:
    text = _text(result)
    if text is None:
        return 0.0
    ok = all(s in text for s in rules.get("include", [])) and not any(
        s in text for s in rules.get("exclude", [])
    )
    return 1.0 if ok else 0.0


def check_direct_json_object(result: Value, rules: dict[str, Any], **_: Any) -> float:
    text = _text(result)
    if text is None:
        return 0.0
    try:
        data = json.loads(text)
    except ValueError:
        return 0.0
    if not isinstance(data, dict):
        return 0.0
    expected = rules.get("expected", {})
    if rules.get("expect_in_result"):
        return 1.0 if all(str(v) in str(data.get(k, "")) for k, v in expected.items()) else 0.0
    return 1.0 if all(k in data and data[k] == v for k, v in expected.items()) else 0.0


def match_in_list(result: Value, rules: dict[str, Any], **_: Any) -> float:
    return 1.0 if result in rules["expected"] else 0.0


def is_in_list(result: Value, rules: dict[str, Any], **_: Any) -> float:
    """OSWorld's: the expected value ``in`` the result (a list's member, or a string's part)."""
    return 1.0 if rules["expected"] in result else 0.0


def is_expected_bookmarks(bookmarks: Value, rule: dict[str, Any], **_: Any) -> float:
    if not bookmarks:
        return 0.0
    bar = bookmarks["bookmark_bar"]["children"]
    kind = rule["type"]
    if kind == "bookmark_bar_folders_names":
        return (
            1.0 if {b["name"] for b in bar if b["type"] == "folder"} == set(rule["names"]) else 0.0
        )
    if kind == "bookmark_bar_websites_urls":
        return 1.0 if {b["url"] for b in bar if b["type"] == "url"} == set(rule["urls"]) else 0.0
    if kind == "liked_authors_websites_urls":
        folder = next(
            (b for b in bar if b["type"] == "folder" and b["name"] == "Liked Authors"), None
        )
        if folder is None:
            return 0.0
        urls = {b["url"] for b in folder["children"] if b["type"] == "url"}
        choices = [[u] if isinstance(u, str) else list(u) for u in rule["urls"]]
        return 1.0 if any(set(pick) == urls for pick in itertools.product(*choices)) else 0.0
    raise TypeError(f"{kind} not support yet!")


def is_expected_installed_extensions(installed: Value, expected: dict[str, Any], **_: Any) -> float:
    if not installed:
        return 0.0
    return 1.0 if set(expected["expected"]) <= set(installed) else 0.0


def check_enabled_experiments(enabled: Value, rule: dict[str, Any], **_: Any) -> float:
    """The names before ``@`` in order, as OSWorld compares them (a list, not a set)."""
    if rule["type"] != "names":
        raise TypeError(f"{rule['type']} not support yet!")
    return 1.0 if [e.split("@")[0] for e in enabled] == rule["names"] else 0.0


def check_font_size(font_size: Value, rule: dict[str, Any], **_: Any) -> float:
    size = font_size["default_font_size"]
    if rule["type"] == "value":
        return 1.0 if size == rule["value"] else 0.0
    if rule["type"] == "range":
        return 1.0 if rule["min"] < size < rule["max"] else 0.0
    raise TypeError(f"{rule['type']} not support yet!")


def exact_match(result: Value, rules: dict[str, Any], **_: Any) -> float:
    text = _text(result)
    return 1.0 if text is not None and text.rstrip() == str(rules["expected"]).rstrip() else 0.0


def _docx_paragraphs(path: str) -> list[Any]:
    from docx import Document

    return list(Document(path).paragraphs)


def _collapsed(paragraphs: list[str], ignore_case: bool) -> str:
    text = re.sub(r"\s+", " ", "\n".join(paragraphs)).strip()
    return text.lower() if ignore_case else text


def compare_docx_files(result: Value, expected: Value, **options: Any) -> float:
    """OSWorld's compare_docx_files on .docx files: the paragraphs' texts, by default with runs of
    whitespace collapsed over the whole text (``ignore_blanks``, default true); ``content_only``
    and ``fuzzy_match`` give a fuzzy ratio; ``ignore_order`` sorts, ``delete_empty_lines`` drops
    blank paragraphs; without ``ignore_blanks`` paragraph by paragraph."""
    if result is None or expected is None:
        return 0.0
    if not (str(result).endswith(".docx") and str(expected).endswith(".docx")):
        raise ValueError("compare_docx_files is implemented for .docx files only")
    from rapidfuzz import fuzz

    try:
        a = [p.text for p in _docx_paragraphs(result)]
        b = [p.text for p in _docx_paragraphs(expected)]
    except Exception:  # OSWorld: a file python-docx cannot open scores 0
        return 0.0
    ignore_case = bool(options.get("ignore_case", False))
    if options.get("ignore_order", False):
        a, b = sorted(a), sorted(b)
    if options.get("delete_empty_lines", False):
        a, b = [t for t in a if t.strip()], [t for t in b if t.strip()]
    fuzzy = bool(options.get("fuzzy_match", False))
    if options.get("content_only", False):
        return fuzz.ratio(_collapsed(a, ignore_case), _collapsed(b, ignore_case)) / 100
    if options.get("ignore_blanks", True):
        ta, tb = _collapsed(a, ignore_case), _collapsed(b, ignore_case)
        if fuzzy:
            return fuzz.ratio(ta, tb) / 100
        return 1.0 if ta == tb else 0.0
    if len(a) != len(b):
        return 0.0
    if ignore_case:
        a, b = [t.lower() for t in a], [t.lower() for t in b]
    if fuzzy:
        return sum(fuzz.ratio(x, y) / 100 for x, y in zip(a, b, strict=True)) / len(a) if a else 1.0
    return 1.0 if a == b else 0.0


def compare_line_spacing(result: Value, expected: Value, **_: Any) -> float:
    if result is None or expected is None:
        return 0.0
    a, b = _docx_paragraphs(result), _docx_paragraphs(expected)
    if len(a) != len(b):
        return 0.0
    for pa, pb in zip(a, b, strict=True):
        if (
            pa.text != pb.text
            or pa.paragraph_format.line_spacing != pb.paragraph_format.line_spacing
        ):
            return 0.0
    return 1.0


def compare_pdfs(result: Value, expected: Value, **_: Any) -> float:
    """OSWorld's compare_pdfs: the mean fuzzy ratio of the files' texts (lenient by design; the audit checks tasks)."""
    from pypdf import PdfReader
    from rapidfuzz import fuzz

    pairs = (
        list(zip(result, expected, strict=False))
        if isinstance(result, list)
        else [(result, expected)]
    )
    scores = []
    for a, b in pairs:
        if a is None or b is None:
            scores.append(0.0)
            continue
        ta = "".join(page.extract_text() or "" for page in PdfReader(a).pages)
        tb = "".join(page.extract_text() or "" for page in PdfReader(b).pages)
        scores.append(fuzz.ratio(ta, tb) / 100)
    return sum(scores) / len(scores) if scores else 0.0


def compare_images(result: Value, expected: Value, **_: Any) -> float:
    if result is None or expected is None:
        return 0.0
    from PIL import Image, ImageChops

    a, b = Image.open(result).convert("RGB"), Image.open(expected).convert("RGB")
    if a.size != b.size:
        return 0.0
    return 1.0 if ImageChops.difference(a, b).getbbox() is None else 0.0


def check_list(result: Value, rules: dict[str, Any], **_: Any) -> float:
    text = _text(result)
    if text is None:
        return 0.0
    lines = text.splitlines()
    expect = all(any(re.search(p, line) for line in lines) for p in rules.get("expect", []))
    unexpect = any(re.search(p, line) for p in rules.get("unexpect", []) for line in lines)
    return 1.0 if expect and not unexpect else 0.0


def check_csv(result: Value, rules: dict[str, Any], **_: Any) -> float:
    """OSWorld's check_csv: every ``expect`` record (a dict of column values) matches some row of
    the result's CSV (read by its header), and no ``unexpect`` record matches any row."""
    text = _text(result)
    if text is None:
        return 0.0
    rows = list(csv.DictReader(io.StringIO(text.replace("\r\n", "\n"))))

    def matches(record: dict[str, Any], row: dict[str, Any]) -> bool:
        return all(key in row and row[key] == value for key, value in record.items())

    expect = all(any(matches(r, row) for row in rows) for r in rules.get("expect", []))
    unexpect = any(matches(r, row) for r in rules.get("unexpect", []) for row in rows)
    return 1.0 if expect and not unexpect else 0.0


def compare_text_file(result: Value, expected: Value, **options: Any) -> float:
    """OSWorld's compare_text_file: the texts equal, after ``ignore_blanks`` (tabs and newlines to
    spaces, runs of whitespace to one, ends stripped) and ``ignore_case``."""
    a, b = _text(result), _text(expected)
    if a is None or b is None:
        return 0.0
    if options.get("ignore_blanks", False):
        a = re.sub(r"\s+", " ", re.sub(r"[\t\n]", " ", a).strip())
        b = re.sub(r"\s+", " ", re.sub(r"[\t\n]", " ", b).strip())
    if options.get("ignore_case", False):
        a, b = a.lower(), b.lower()
    return 1.0 if a == b else 0.0


def _lines(path: str) -> list[str]:
    """A text file's lines as OSWorld reads them: UTF-8, else Latin-1 (which reads any bytes)."""
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return data.decode("latin-1").splitlines()


def compare_csv(result: Value, expected: Value, **options: Any) -> float:
    """OSWorld's compare_csv: the result's lines equal one expected file's (any, when several),
    exactly by default; ``strict: false`` strips each line, ``ignore_case`` lowers them."""
    if result is None or not isinstance(result, FileValue):
        return 0.0
    ours = _lines(result)
    for gold in expected if isinstance(expected, list) else [expected]:
        if not isinstance(gold, FileValue):
            continue
        a, b = ours, _lines(gold)
        if not options.get("strict", True):
            a, b = [x.strip() for x in a], [x.strip() for x in b]
        if options.get("ignore_case", False):
            a, b = [x.lower() for x in a], [x.lower() for x in b]
        if a == b:
            return 1.0
    return 0.0


# -- OSWorld's single-purpose document checks (desktop-env 1.0.2's semantics, leniencies kept) --
def _docx(path: Value) -> Any:
    """A .docx as python-docx reads it, or None (no file, or one it cannot open: OSWorld scores 0)."""
    if not isinstance(path, FileValue):
        return None
    from docx import Document

    try:
        return Document(path)
    except Exception:
        return None


def compare_docx_tables(result: Value, expected: Value, **_: Any) -> float:
    """The same tables: as many, each of the same size, every cell's text equal (stripped)."""
    a, b = _docx(result), _docx(expected)
    if a is None or b is None or len(a.tables) != len(b.tables):
        return 0.0
    for ta, tb in zip(a.tables, b.tables, strict=True):
        if (len(ta.rows), len(ta.columns)) != (len(tb.rows), len(tb.columns)):
            return 0.0
        for i in range(len(ta.rows)):
            for j in range(len(ta.columns)):
                if ta.cell(i, j).text.strip() != tb.cell(i, j).text.strip():
                    return 0.0
    return 1.0


def compare_subscript_contains(result: Value, expected: Value, **_: Any) -> float:
    """OSWorld's check: some run, paired by position in paragraphs paired by position, is subscript
    in both files."""
    a, b = _docx(result), _docx(expected)
    if a is None or b is None:
        return 0.0
    for pa, pb in zip(a.paragraphs, b.paragraphs, strict=False):
        for ra, rb in zip(pa.runs, pb.runs, strict=False):
            if ra.font.subscript and rb.font.subscript:
                return 1.0
    return 0.0


def has_page_numbers_in_footers(result: Value, expected: Value = None, **_: Any) -> float:
    """Every section's footer has a digit in its first paragraph."""
    document = _docx(result)
    if document is None:
        return 0.0
    for section in document.sections:
        paragraphs = section.footer.paragraphs
        if not any(c.isdigit() for c in (paragraphs[0].text if paragraphs else "")):
            return 0.0
    return 1.0


def compare_font_names(result: Value, rules: dict[str, Any], **_: Any) -> float:
    """Every run's font is ``rules["font_name"]`` (a file without runs passes, as in OSWorld)."""
    document = _docx(result)
    if document is None:
        return 0.0
    wanted = rules["font_name"]
    return 1.0 if all(r.font.name == wanted for p in document.paragraphs for r in p.runs) else 0.0


def is_first_line_centered(result: Value, expected: Value = None, **_: Any) -> float:
    from docx.enum.text import WD_PARAGRAPH_ALIGNMENT

    document = _docx(result)
    if document is None:
        return 0.0
    return (
        1.0
        if document.paragraphs[0].paragraph_format.alignment == WD_PARAGRAPH_ALIGNMENT.CENTER
        else 0.0
    )


def check_italic_font_size_14(result: Value, expected: Value, **_: Any) -> float:
    """The text as the expected file's (compare_docx_files), and every italic run 14 pt."""
    if result is None or expected is None or not compare_docx_files(result, expected):
        return 0.0
    document = _docx(result)
    if document is None:
        return 0.0
    for paragraph in document.paragraphs:
        for run in paragraph.runs:
            if run.italic and (run.font.size is None or run.font.size.pt != 14):
                return 0.0
    return 1.0


def contains_page_break(result: Value, rules: dict[str, Any] | None = None, **_: Any) -> float:
    """At least one page break in the runs, and exactly ``rules["page_break_count"]`` when given."""
    document = _docx(result)
    if document is None:
        return 0.0
    word = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
    count = sum(1 for p in document.paragraphs for r in p.runs
                for br in r.element.iter(f"{word}br") if br.get(f"{word}type") == "page")  # fmt: skip
    wanted = rules.get("page_break_count") if isinstance(rules, dict) else None
    if wanted is not None and count != wanted:
        return 0.0
    return 1.0 if count > 0 else 0.0


def find_default_font(result: Value, rules: dict[str, Any], **_: Any) -> float:
    """LibreOffice Writer's default font in its registry (``registrymodifications.xcu``) is
    ``rules["font_name"]``."""
    from xml.etree import ElementTree

    if not isinstance(result, FileValue):
        return 0.0
    found = None
    registry = "{http://openoffice.org/2001/registry}"
    try:
        root = ElementTree.parse(result).getroot()
        for item in root.iter("item"):
            if item.get(f"{registry}path") != "/org.openoffice.Office.Writer/DefaultFont":
                continue
            for prop in item.iter("prop"):
                if prop.get(f"{registry}name") == "Standard":
                    for value in prop.findall("value"):
                        found = value.text
    except (ElementTree.ParseError, OSError):
        pass
    return 1.0 if found == rules["font_name"] else 0.0


def check_slide_orientation_Portrait(result: Value, expected: Value = None, **_: Any) -> float:  # noqa: N802 - OSWorld's name
    if not isinstance(result, FileValue):
        return 0.0
    from pptx import Presentation

    deck = Presentation(result)
    return 1.0 if deck.slide_width < deck.slide_height else 0.0


def file_contains(result: Value, rules: dict[str, Any], **_: Any) -> float:
    """Every string of ``rules["expected"]`` is in the file."""
    if not isinstance(result, FileValue):
        return 0.0
    try:
        with open(result, encoding="utf-8") as handle:
            text = handle.read()
        return 1.0 if all(s in text for s in rules["expected"]) else 0.0
    except (OSError, UnicodeDecodeError, KeyError, TypeError):
        return 0.0


_TIME = re.compile(r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)")


def check_line_number(result: Value, rules: dict[str, Any], **_: Any) -> float:
    """As many lines holding a time of day (HH:MM:SS) as ``rules["expected"]``."""
    if not isinstance(result, FileValue):
        return 0.0
    try:
        with open(result, encoding="utf-8") as handle:
            count = sum(1 for line in handle if _TIME.search(line))
        return 1.0 if count == int(rules["expected"]) else 0.0
    except (OSError, UnicodeDecodeError, KeyError, TypeError, ValueError):
        return 0.0


def fuzzy_place_math(result: Value, rules: dict[str, Any], **_: Any) -> float:
    """The document's words, exactly three, each scored by its best fuzzy ratio against the
    ``rules["expected"]`` answers; their mean (0 unless there are three words)."""
    from rapidfuzz import fuzz

    document = _docx(result)
    if document is None:
        return 0.0
    words = [w for p in document.paragraphs for w in p.text.split()]
    if len(words) != 3:
        return 0.0
    return (
        sum(max((fuzz.ratio(w, a) / 100 for a in rules["expected"]), default=0.0) for w in words)
        / 3
    )


def check_image_file_size(result: Value, rules: dict[str, Any], **_: Any) -> float:
    """The file is smaller than ``rules["max_size"]`` bytes."""
    if not isinstance(result, FileValue):
        return 0.0
    return 1.0 if os.path.getsize(result) < rules["max_size"] else 0.0


def compare_docx_images(result: Value, expected: Value, **_: Any) -> float:
    """The same images, in the same order, pixel for pixel."""
    from PIL import Image

    a, b = _docx(result), _docx(expected)
    if a is None or b is None:
        return 0.0

    def images(document: Any) -> list[bytes]:
        return [
            rel.target_part.blob for rel in document.part.rels.values() if "image" in rel.reltype
        ]

    found_a, found_b = images(a), images(b)
    if len(found_a) != len(found_b):
        return 0.0
    for x, y in zip(found_a, found_b, strict=True):
        if Image.open(io.BytesIO(x)).tobytes() != Image.open(io.BytesIO(y)).tobytes():
            return 0.0
    return 1.0


def _registry_value(path: Value, item_path: str, name: str) -> str | None:
    """One property of LibreOffice's registry (``registrymodifications.xcu``), or None."""
    from xml.etree import ElementTree

    registry = "{http://openoffice.org/2001/registry}"
    found = None
    try:
        for item in ElementTree.parse(str(path)).getroot().iter("item"):
            if item.get(f"{registry}path") != item_path:
                continue
            for prop in item.iter("prop"):
                if prop.get(f"{registry}name") == name:
                    value = prop.find(".//value")
                    found = value.text if value is not None else None
                    break
    except (ElementTree.ParseError, OSError):
        return None
    return found


def check_auto_saving_time(result: Value, rules: dict[str, Any], **_: Any) -> float:
    """LibreOffice's autosave interval (``AutoSaveTimeIntervall``) is ``rules["minutes"]``."""
    if not isinstance(result, FileValue):
        return 0.0
    value = _registry_value(
        result, "/org.openoffice.Office.Common/Save/Document", "AutoSaveTimeIntervall"
    )
    try:
        return 1.0 if value is not None and int(value) == rules["minutes"] else 0.0
    except ValueError:
        return 0.0


def check_left_panel(result: Value, expected: Value = None, **_: Any) -> float:
    """Impress's slide pane is open: the accessibility tree has a document-frame "Slides View"."""
    from xml.etree import ElementTree

    text = _text(result)
    if text is None:
        return 0.0
    root = ElementTree.fromstring(text)
    return 1.0 if any(f.get("name") == "Slides View" for f in root.iter("document-frame")) else 0.0


def evaluate_presentation_fill_to_rgb_distance(
    result: Value, rules: dict[str, Any], **_: Any
) -> float:
    """1 minus the mean over slides of each solid background's distance to ``rules["rgb"]``
    (normalised to 0..1); a slide with no solid fill, or still ``rules["original_rgb"]``, counts 1."""
    if not isinstance(result, FileValue):
        return 0.0
    from pptx import Presentation

    target, original = rules["rgb"], rules.get("original_rgb")

    def distance(slide: Any) -> float:
        fill = slide.background.fill
        if fill.type == 5:
            fill = slide.slide_layout.slide_master.background.fill
        if fill.type != 1:
            return 1.0
        try:
            colour = fill.fore_color.rgb
        except AttributeError:
            return 1.0
        if colour is None:
            return 1.0
        if original is not None and tuple(colour) == tuple(original):
            return 1.0
        return math.dist(tuple(colour), tuple(target)) / math.dist((0, 0, 0), (255, 255, 255))

    deck = Presentation(result)
    return 1 - sum(distance(s) for s in deck.slides) / len(deck.slides)


def check_page_number_colors(result: Value, rules: dict[str, Any], **_: Any) -> float:
    """The slide master's second-to-last solid colour is ``rules["color"]`` (red, blue, green or
    black), read as OSWorld reads it: its hex value sliced from the second character (OSWorld's
    slices assume a leading "#" the file does not have; kept, since its scores depend on them)."""
    import zipfile
    from xml.etree import ElementTree

    if not isinstance(result, FileValue):
        return 0.0
    drawing = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
    with (
        zipfile.ZipFile(result) as archive,
        archive.open("ppt/slideMasters/slideMaster1.xml") as master,
    ):
        root = ElementTree.parse(master).getroot()
    colours = [
        c for fill in root.iter(f"{drawing}solidFill") for c in fill.iter(f"{drawing}srgbClr")
    ]
    value = colours[-2].get("val")
    if value is None:
        return 0.0
    r, g, b = (int(value[i : i + 2], 16) for i in (1, 3, 5))
    wanted = rules["color"]
    checks = {"red": r > g + 50 and r > b + 50, "blue": b > g + 50 and b > r + 50,
              "green": g > r + 50 and g > b + 50, "black": r < 50 and g < 50 and b < 50}  # fmt: skip
    return 0.0 if wanted in checks and not checks[wanted] else 1.0


# -- images: OSWorld's GIMP checks, structural similarity as scikit-image computes it ----------------
def _box_means(x: Any, size: int) -> Any:
    """The mean of every ``size`` x ``size`` window lying wholly inside ``x`` (2-D, float64): exact
    window sums from an integral image, for integer-valued inputs."""
    import numpy as np

    total = np.pad(x.cumsum(0).cumsum(1), ((1, 0), (1, 0)))
    sums = total[size:, size:] - total[:-size, size:] - total[size:, :-size] + total[:-size, :-size]
    return sums / float(size * size)


def _ssim(a: Any, b: Any, size: int = 7) -> float:
    """scikit-image's ``structural_similarity`` for two uint8 H x W x C arrays with its defaults
    (a uniform ``size`` window, sample covariance, K1 0.01, K2 0.03, data range 255, the border of
    half a window left out), averaged over the channels as with ``channel_axis``."""
    import numpy as np

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    norm = size * size / (size * size - 1.0)
    scores = []
    for channel in range(a.shape[2]):
        x, y = a[..., channel].astype(np.float64), b[..., channel].astype(np.float64)
        ux, uy = _box_means(x, size), _box_means(y, size)
        vx = norm * (_box_means(x * x, size) - ux * ux)
        vy = norm * (_box_means(y * y, size) - uy * uy)
        vxy = norm * (_box_means(x * y, size) - ux * uy)
        s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
        scores.append(float(s.mean(dtype=np.float64)))
    return float(np.mean(scores))


def _same_structure(first: Any, second: Any, threshold: float = 0.9) -> bool:
    """OSWorld's structure_check_by_ssim: both at least 7 px a side, as RGB, the same size, and an
    SSIM (7 px window) of at least ``threshold``."""
    import numpy as np

    if min(first.width, first.height, second.width, second.height) < 7:
        return False
    first, second = first.convert("RGB"), second.convert("RGB")
    if first.size != second.size:
        return False
    return _ssim(np.array(first), np.array(second)) >= threshold


def _same_by_mse(first: Any, second: Any, threshold: float = 0.03) -> bool:
    """OSWorld's structure_check_by_mse: the first resized to the second (Lanczos), both RGB, the
    mean squared difference of values in 0..1 below ``threshold``."""
    import numpy as np
    from PIL import Image

    if first.size != second.size:
        first = first.resize(second.size, Image.Resampling.LANCZOS)
    first, second = first.convert("RGB"), second.convert("RGB")
    difference = np.array(first, dtype=np.float32) / 255 - np.array(second, dtype=np.float32) / 255
    return bool(np.mean(difference**2) < threshold)


def _brightness(image: Any) -> float:
    from PIL import ImageStat

    return float(ImageStat.Stat(image.convert("L")).mean[0])


def _images(*paths: Value) -> list[Any] | None:
    from PIL import Image

    if any(p is None for p in paths):
        return None
    loaded = []
    for path in paths:
        with Image.open(path) as image:
            image.load()
            loaded.append(image.copy())  # mode and info kept; the file closed
    return loaded


def check_structure_sim(result: Value, expected: Value, **_: Any) -> float:
    """OSWorld's check_structure_sim: the same size and the same structure (`_same_structure`)."""
    images = _images(result, expected)
    if images is None or images[0].size != images[1].size:
        return 0.0
    return 1.0 if _same_structure(*images) else 0.0


def check_structure_sim_resized(result: Value, expected: Value, **_: Any) -> float:
    """OSWorld's check_structure_sim_resized: the result (cropped to its opaque part when it has
    transparency) resized to the expected size, then `_same_structure`."""
    images = _images(result, expected)
    if images is None:
        return 0.0
    source, target = images
    if source.mode in ("RGBA", "LA") or "transparency" in source.info:
        source = source.convert("RGBA") if source.mode != "RGBA" else source
        box = source.split()[-1].getbbox()
        if box is None:
            return 0.0
        source = source.crop(box).convert("RGB")
    return 1.0 if _same_structure(source.resize(target.size), target.convert("RGB")) else 0.0


def check_brightness_decrease_and_structure_sim(result: Value, expected: Value, **_: Any) -> float:
    """OSWorld's: the result darker than the original, and the same by `_same_by_mse` once both are
    scaled to a mean brightness of 128."""
    images = _images(result, expected)
    if images is None:
        return 0.0

    def normalised(image: Any) -> Any:
        factor = 128 / _brightness(image)
        return image.point(lambda v: min(255, max(0, int(v * factor))))

    darker = _brightness(images[1]) > _brightness(images[0])
    return 1.0 if darker and _same_by_mse(*(normalised(i) for i in images)) else 0.0


def check_saturation_increase_and_structure_sim(result: Value, expected: Value, **_: Any) -> float:
    """OSWorld's: the result's mean HSV saturation above the original's, hue and value each the
    same structure."""
    import numpy as np

    images = _images(result, expected)
    if images is None:
        return 0.0
    (h1, s1, v1), (h2, s2, v2) = (i.convert("HSV").split() for i in images)
    more = float(np.mean(np.array(s2))) < float(np.mean(np.array(s1)))
    return 1.0 if more and _same_structure(h1, h2) and _same_structure(v1, v2) else 0.0


def check_contrast_increase_and_structure_sim(result: Value, expected: Value, **_: Any) -> float:
    """OSWorld's: the result's standard deviation of values above the original's, and the same
    structure at SSIM 0.65."""
    import numpy as np

    images = _images(result, expected)
    if images is None:
        return 0.0
    contrast = [float(np.std(np.asarray(i, dtype=np.float32))) for i in images]
    return 1.0 if contrast[1] < contrast[0] and _same_structure(images[0], images[1], 0.65) else 0.0


def check_file_exists_and_structure_sim(result: Value, expected: Value, **_: Any) -> float:
    """OSWorld's: the exported file exists and has the original's structure."""
    images = _images(result, expected)
    return 1.0 if images is not None and _same_structure(*images) else 0.0


def check_palette_and_structure_sim(result: Value, expected: Value, **_: Any) -> float:
    """OSWorld's: the result is palette-based (mode P) and, as RGB, has the original's structure."""
    if result is None or expected is None or os.path.getsize(str(result)) == 0:
        return 0.0
    try:
        images = _images(result, expected)
    except OSError:  # OSWorld's opening gives up on a truncated or unreadable file
        return 0.0
    assert images is not None
    palette = images[0].mode == "P"
    return 1.0 if palette and _same_structure(images[0].convert("RGB"), images[1]) else 0.0


def check_image_mirror(result: Value, expected: Value, **_: Any) -> float:
    """OSWorld's: the result flipped left to right has the original's structure at SSIM 0.99."""
    from PIL import Image

    images = _images(result, expected)
    if images is None:
        return 0.0
    flipped = images[0].transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return 1.0 if _same_structure(flipped, images[1], 0.99) else 0.0


def check_image_size(result: Value, rule: dict[str, Any], **_: Any) -> float:
    """OSWorld's check_image_size: the width and height the rule names (its opaque part's, with
    ``ignore_transparent``, or whenever the image carries a transparency key, as OSWorld reads it)."""
    images = _images(result)
    if images is None:
        return 0.0
    image = images[0]
    opaque = rule.get("ignore_transparent", False) and image.mode in ("RGBA", "LA")
    if opaque or "transparency" in image.info:
        box = (image if image.mode == "RGBA" else image.convert("RGBA")).split()[-1].getbbox()
        width, height = (0, 0) if box is None else (box[2] - box[0], box[3] - box[1])
    else:
        width, height = image.size
    same_height = rule.get("height") is None or height == rule["height"]
    same_width = rule.get("width") is None or width == rule["width"]
    return 1.0 if same_height and same_width else 0.0


def check_triangle_position(result: Value, *_: Any, **__: Any) -> float:
    """OSWorld's: the second most common colour's centroid within 5% of the image's centre."""
    import numpy as np

    images = _images(result)
    if images is None:
        return 0.0
    pixels = np.array(images[0])
    colours, counts = np.unique(pixels.reshape(-1, pixels.shape[2]), axis=0, return_counts=True)
    triangle = colours[np.argsort(counts)][1]
    centroid = np.argwhere(np.all(pixels == triangle, axis=2)).mean(axis=0)
    centre, tolerance = np.array(pixels.shape[:2]) / 2, 0.05 * np.array(pixels.shape[:2])
    return 1.0 if bool(np.all(np.abs(centroid - centre) < tolerance)) else 0.0


def check_textbox_on_leftside(result: Value, *_: Any, **__: Any) -> float:
    """OSWorld's: some dark pixel (grey below 128) within the left 5% of the image."""
    import numpy as np

    images = _images(result)
    if images is None:
        return 0.0
    dark = np.array(images[0].convert("L")) < 128
    width = images[0].size[0]
    rows = dark.any(axis=1)
    left = int(dark[rows].argmax(axis=1).min()) if rows.any() else width
    return 1.0 if left < width * 0.05 else 0.0


def check_green_background(result: Value, expected: Value, **_: Any) -> float:
    """OSWorld's: every pixel not black in the original is green (G above R and B) in the result.
    OSWorld indexes both images as [x, y] with x over the width: it reads a non-square image
    transposed and fails past its shorter side. That is kept: a rewritten check would grade
    other episodes than OSWorld's."""
    import numpy as np

    images = _images(result, expected)
    if images is None:
        return 0.0
    source, target = np.array(images[0]), np.array(images[1])
    width, height = images[1].size
    if target.ndim != 3 or source.ndim != 3:
        raise TypeError("check_green_background reads colour images only (as OSWorld's does)")
    for x in range(width):
        if x >= target.shape[0]:
            raise IndexError(f"row {x} of a {target.shape[0]}-row image (OSWorld reads [x, y])")
        span = min(height, target.shape[1])
        row = target[x, :span]
        background = (row[:, :3] != 0).any(axis=1) if row.shape[1] >= 3 else np.ones(span, bool)
        for y in np.flatnonzero(background):
            r, g, b = source[x, y][:3]
            if not (g > r and g > b):
                return 0.0
        if height > target.shape[1]:
            raise IndexError(f"column {target.shape[1]} of a {target.shape[1]}-column image")
    return 1.0


# -- application settings: GIMP's gimprc, VLC's vlcrc, Thunderbird's prefs.js and filters ----------
def check_config_status(result: Value, rule: dict[str, Any], **_: Any) -> float:
    """OSWorld's check_config_status (GIMP): some line ``(KEY ... VALUE)`` of the file, outside
    comments, whose first word is ``rule["key"]`` (or first two words, for a two-item key) and whose
    last word is ``rule["value"]``. A blank line of spaces fails the read, as in OSWorld."""
    text = _text(result) if isinstance(result, FileValue) else None
    if text is None:
        return 0.0
    key = rule["key"]
    for line in text.splitlines(keepends=True):
        if line.startswith("#") or line == "\n":
            continue
        items = line.strip().lstrip("(").rstrip(")\n").split()
        if isinstance(key, str) and items[0] == key and items[-1] == rule["value"]:
            return 1.0
        if (
            isinstance(key, list)
            and len(key) == 2
            and items[:2] == key
            and items[-1] == rule["value"]
        ):
            return 1.0
    return 0.0


def _vlc_setting(result: Value, key: str, default: str) -> str | None:
    """What OSWorld reads of a vlcrc setting: the last line containing ``key`` (commented or not:
    VLC writes every default as a comment), after its last ``=``; ``default`` when none does."""
    text = _text(result) if isinstance(result, FileValue) else None
    if text is None:
        return None
    value = default
    for line in text.split("\n"):
        if key in line:
            value = line.split("=")[-1].strip()
    return value


def _vlc_check(key: str, default: str, wanted: str) -> Any:
    def check(result: Value, rule: dict[str, Any], **_: Any) -> float:
        value = _vlc_setting(result, f"{key}=", default)
        return 1.0 if value is not None and value == str(rule[wanted]) else 0.0

    return check


check_qt_bgcone = _vlc_check("qt-bgcone", "1", "expected_qt_bgcone")
check_qt_max_volume = _vlc_check("qt-max-volume", "125", "expected_qt_max_volume")
check_qt_minimal_view = _vlc_check("qt-minimal-view", "0", "expected_qt_minimal_view")
check_one_instance_when_started_from_file = _vlc_check(
    "one-instance-when-started-from-file", "1", "expected_one_instance_when_started_from_file"
)
for _name, _check in (("check_qt_bgcone", check_qt_bgcone), ("check_qt_max_volume", check_qt_max_volume),
                      ("check_qt_minimal_view", check_qt_minimal_view),
                      ("check_one_instance_when_started_from_file",
                       check_one_instance_when_started_from_file)):  # fmt: skip
    _check.__name__ = _name
    _check.__doc__ = (
        f"OSWorld's {_name}: the vlcrc setting (`_vlc_setting`) equals the rule's value."
    )


def check_qt_slider_colours(result: Value, rule: dict[str, Any], **_: Any) -> float:
    """OSWorld's check_qt_slider_colours: the volume slider's colours (VLC's default when unset)
    equal ``expected_qt_slider_colours`` (``match``), or every colour has each channel under 100
    (``blackish``)."""
    value = _vlc_setting(result, "qt-slider-colours", "153;210;153;20;210;20;255;199;15;245;39;29")
    if value is None:
        return 0.0
    if rule["type"] == "match":
        return 1.0 if value == rule["expected_qt_slider_colours"] else 0.0
    if rule["type"] == "blackish":
        numbers = [int(x) for x in value.split(";")]
        colours = zip(numbers[0::3], numbers[1::3], numbers[2::3], strict=False)
        return 1.0 if all(all(c < 100 for c in colour) for colour in colours) else 0.0
    raise ValueError(f"check_qt_slider_colours type {rule['type']!r} is not implemented")


def is_vlc_recordings_folder(result: Value, rule: dict[str, Any], **_: Any) -> float:
    """OSWorld's is_vlc_recordings_folder: the first uncommented line naming ``input-record-path``
    sets it to ``recording_file_path``."""
    text = _text(result) if isinstance(result, FileValue) else None
    if text is None:
        return 0.0
    for line in text.split("\n"):
        if line.startswith("#") or not line.strip():
            continue
        if "input-record-path" in line:
            return 1.0 if line.split("=")[-1].strip() == rule["recording_file_path"] else 0.0
    return 0.0


_PREF = re.compile(r'^user_pref\("(?P<key>(?:[^"]|\\")+)\", (?P<val>.+)\);$')


def check_thunderbird_prefs(result: Value, rule: dict[str, Any], **_: Any) -> float:
    """OSWorld's check_thunderbird_prefs: in prefs.js, every ``expect`` preference present and
    matching its rule (`_match_rule`, on the JSON value), no ``unexpect`` one matching."""
    text = _text(result) if isinstance(result, FileValue) else None
    if text is None:
        return 0.0
    expect, unexpect = rule.get("expect", {}), rule.get("unexpect", {})
    found = dict.fromkeys(expect, False)
    clean = True
    for line in text.splitlines():
        match = _PREF.match(line.strip())
        if match is None:
            continue
        key, value = match.group("key"), json.loads(match.group("val"))
        if key in expect:
            found[key] = _match_rule(value, expect[key])
        elif key in unexpect:
            clean = clean and not _match_rule(value, unexpect[key])
    return 1.0 if all(found.values()) and clean else 0.0


_FILTER_CONDITION = re.compile(
    r"\b(?:AND|OR) \((?:[\w ]+),(?:[\w ']+),(?:\"(?:(?:[^\"]|\")+)\"|(?:[^)]+))\)|\bALL\b"
)


def _unescape_filter(value: str) -> str:
    return value.replace('\\"', '"').replace("\\\\", "\\")


def check_thunderbird_filter(result: Value, rules: dict[str, Any], **_: Any) -> float:
    """OSWorld's check_thunderbird_filter: msgFilterRules.dat read into filters (name, enabled,
    type, action, actionValue, conditions; a filter counts once its condition line is read); every
    ``expect`` record matched by some filter, no ``unexpect`` record by any."""
    text = _text(result) if isinstance(result, FileValue) else None
    if text is None:
        return 0.0
    filters: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    fields = {"name=": 6, "enabled=": 9, "type=": 6, "action=": 8, "actionValue=": 13}
    for line in text.splitlines(keepends=True):
        if line.startswith("name="):
            current = {}
        for prefix, start in fields.items():
            if line.startswith(prefix):
                if current is None:  # OSWorld fails here: a field before any name
                    raise ValueError(f"filter field {prefix!r} before any name")
                current[prefix[:-1]] = _unescape_filter(line[start:-2])
        if line.startswith("condition="):
            if current is None:
                raise ValueError("filter condition before any name")
            current["condition"] = _FILTER_CONDITION.findall(_unescape_filter(line[11:-2]))
            filters.append(current)

    def matches(record: dict[str, Any], item: dict[str, Any]) -> bool:
        return all(k in item and item[k] == v for k, v in record.items())

    expect, unexpect = rules.get("expect", []), rules.get("unexpect", [])
    found = [any(matches(r, f) for f in filters) for r in expect]
    clean = not any(matches(r, f) for f in filters for r in unexpect)
    return 1.0 if all(found) and clean else 0.0


OPTIONS: dict[str, frozenset[str]] = {
    "compare_table": frozenset({"rules"}),
    "compare_pptx_files": frozenset(
        {f"examine_{k}" for k in PPTX_EXAMINE} | {"approximately_tolerance", "enable_debug"}
    ),
    "compare_docx_files": frozenset(
        {
            "ignore_blanks",
            "ignore_case",
            "ignore_order",
            "content_only",
            "fuzzy_match",
            "delete_empty_lines",
        }
    ),
    "compare_text_file": frozenset({"ignore_blanks", "ignore_case"}),
    "compare_csv": frozenset({"strict", "ignore_case"}),
}
"""The options each metric implements (none for a metric not named). A task that gives another
is unsupported (`unimplemented_options`): an option ignored would grade leniently, or not at all."""

_PAIR = frozenset({"sheet_idx0", "sheet_idx1"})
TABLE_RULES: dict[str, frozenset[str]] = {
    "sheet_name": frozenset(),
    # OSWorld's sheet_data reads no ignore_case: one task gives it, and it is ignored there as here
    "sheet_data": _PAIR | {"precision", "ignore_case"},
    "sheet_print": _PAIR | {"ignore_case"},
    "sheet_fuzzy": _PAIR | {"rules"},
    "check_cell": frozenset({"sheet_idx", "coordinate", "props"}),
    "chart": _PAIR | {"chart_props"},
    "pivot_table": _PAIR | {"pivot_props"},
    "row_props": _PAIR | {"props"},
    "col_props": _PAIR | {"props"},
    "freeze": _PAIR,
    "zoom": frozenset({"sheet_idx", "method", "ref"}),
    "data_validation": frozenset({"sheet_idx", "dv_props"}),
}
"""compare_table's rule types implemented here, with the keys each reads besides ``type``. Not
implemented: ``style`` (its conditional formatting needs a formula engine), ``filter``,
``sparkline``."""

CHART_PROPS = frozenset({"title", "legend", "anchor", "width", "height", "type", "direction",
                         "xtitle", "ytitle", "ztitle"})  # fmt: skip
PIVOT_PROPS = frozenset({"name", "show_total", "show_empty_row", "show_empty_col", "show_headers",
                         "location", "filter", "selection", "ordered", "col_fields", "row_fields",
                         "data_fields", "data_fields_name"})  # fmt: skip
ROW_PROPS = frozenset({"hidden", "collapsed", "height", "outline_level"})
COL_PROPS = frozenset({"width", "auto_size", "hidden", "collapsed", "min", "max", "outline_level"})
DV_ATTRIBUTES = frozenset({"ranges", "type", "formula1", "formula2", "operator", "allowBlank",
                           "showDropDown", "showInputMessage", "showErrorMessage", "error",
                           "errorTitle", "errorStyle", "prompt", "promptTitle", "imeMode"})  # fmt: skip
CELL_STYLES = frozenset({"number_format", "font_name", "font_family", "font_color", "font_bold",
                         "font_italic", "font_underline", "font_size", "fill_type", "bgcolor",
                         "fgcolor", "hyperlink", "merge"})  # fmt: skip
MATCH_METHODS = frozenset({"eq", "ne", "le", "lt", "ge", "gt", "spreadsheet_range", "str_list_eq",
                           "str_set_eq"})  # fmt: skip
"""What OSWorld's rules read, as desktop-env 1.0.2 documents them: a name outside these is not
implemented here (OSWorld ignores an unknown chart or pivot property: a lenient check)."""

FUZZY_KEYS = frozenset({"range", "type", "threshold", "trim_leadings", "trim_trailings",
                        "ignore_case"})  # fmt: skip
FUZZY_TYPES = frozenset({"exact_match", "fuzzy_match", "includes", "included_by", "starts_with",
                         "ends_with"})  # fmt: skip
CELL_METHODS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "str_eq", "approx"})


def unimplemented_options(func: str, options: dict[str, Any] | None) -> list[str]:
    """What ``options`` asks of ``func`` that is not implemented here, each named ("" none).

    Covers the metric's own options and, for compare_table, every rule's type, keys,
    sheet_fuzzy sub-rules and check_cell properties and methods.
    """
    options = options or {}
    # a key beginning with "_" is a task author's comment (OSWorld's "_note"), not a check
    missing = [f"{func} option {k!r}" for k in sorted(options)
               if k not in OPTIONS.get(func, ()) and not k.startswith("_")]  # fmt: skip
    if func != "compare_table":
        return missing
    rules = options.get("rules")
    for rule in rules if isinstance(rules, list) else []:
        kind = rule.get("type") if isinstance(rule, dict) else None
        if kind not in TABLE_RULES:
            missing.append(f"compare_table rule {kind!r}")
            continue
        missing += [f"compare_table {kind} key {k!r}" for k in sorted(rule)
                    if k != "type" and k not in TABLE_RULES[kind]]  # fmt: skip
        if kind == "sheet_fuzzy":
            for sub in rule.get("rules") or []:
                missing += [f"sheet_fuzzy key {k!r}" for k in sorted(sub) if k not in FUZZY_KEYS]
                if sub.get("type", "exact_match") not in FUZZY_TYPES:
                    missing.append(f"sheet_fuzzy type {sub.get('type')!r}")
        if kind == "check_cell":
            for prop, check in (rule.get("props") or {}).items():
                if prop != "value" and prop not in CELL_STYLES:
                    missing.append(f"check_cell property {prop!r}")
                elif not isinstance(check, dict):
                    missing.append(f"check_cell {prop} check {check!r}")
                else:
                    method = check.get("method", "eq")
                    known = (
                        _known_method(str(method))
                        if prop == "value"
                        else _known_match_method(method)
                    )
                    if not known:
                        missing.append(f"check_cell method {method!r}")
        named = {"chart": ("chart_props", CHART_PROPS), "pivot_table": ("pivot_props", PIVOT_PROPS),
                 "row_props": ("props", ROW_PROPS), "col_props": ("props", COL_PROPS)}  # fmt: skip
        if kind in named:
            key, names = named[kind]
            missing += [f"{kind} property {p!r}" for p in rule.get(key) or [] if p not in names]
        if kind == "zoom" and not _known_match_method(rule.get("method")):
            missing.append(f"zoom method {rule.get('method')!r}")
        if kind == "data_validation":
            for pattern in rule.get("dv_props") or []:
                for attribute, check in pattern.items() if isinstance(pattern, dict) else []:
                    if attribute not in DV_ATTRIBUTES:
                        missing.append(f"data_validation attribute {attribute!r}")
                    elif not isinstance(check, dict) or not _known_match_method(
                        check.get("method")
                    ):
                        missing.append(f"data_validation method {check!r}")
    return list(dict.fromkeys(missing))  # each named once


def _known_method(method: str) -> bool:
    if method.startswith("approx:"):
        try:
            float(method.split(":", 1)[1])
        except ValueError:
            return False
        return True
    return method in CELL_METHODS


METRICS = {f.__name__: f for f in (
    compare_table, compare_pptx_files, check_include_exclude, check_direct_json_object, exact_match,
    compare_docx_files, compare_line_spacing, compare_pdfs, compare_images, check_list, check_csv,
    compare_text_file, compare_csv, compare_docx_tables, compare_subscript_contains,
    has_page_numbers_in_footers, compare_font_names, is_first_line_centered, check_italic_font_size_14,
    contains_page_break, find_default_font, check_slide_orientation_Portrait, file_contains,
    check_line_number, fuzzy_place_math, check_image_file_size, compare_docx_images, check_auto_saving_time,
    check_left_panel, evaluate_presentation_fill_to_rgb_distance, check_page_number_colors,
    check_config_status, check_qt_bgcone, check_qt_max_volume, check_qt_minimal_view,
    check_one_instance_when_started_from_file, check_qt_slider_colours, is_vlc_recordings_folder,
    check_thunderbird_prefs, check_thunderbird_filter, check_structure_sim, check_structure_sim_resized,
    check_brightness_decrease_and_structure_sim, check_saturation_increase_and_structure_sim,
    check_contrast_increase_and_structure_sim, check_file_exists_and_structure_sim,
    check_palette_and_structure_sim, check_image_mirror, check_image_size, check_triangle_position,
    check_textbox_on_leftside, check_green_background, match_in_list, is_in_list,
    is_expected_bookmarks, is_expected_installed_extensions, check_enabled_experiments,
    check_font_size,
)}  # fmt: skip


def main() -> None:
    request = json.loads(sys.stdin.read())
    scores: list[float] = []
    errors: list[str] = []
    values: list[Any] = []
    for func, result_spec, expected_spec, options in zip(
        request["funcs"], request["results"], request["expected"], request["options"], strict=True
    ):
        values.append(None)
        try:
            result = values[-1] = resolve(result_spec)
            expected = resolve(expected_spec)
            options = {k: v for k, v in (options or {}).items() if not k.startswith("_")}
            missing = unimplemented_options(func, options)
            if missing:  # loading refuses such a task; a grading is never lenient about it either
                raise ValueError(f"not implemented: {', '.join(missing)}")
            score = METRICS[func](result, expected, **options)
            scores.append(float(score))
            errors.append("")
        except Exception as exc:
            scores.append(0.0)
            errors.append(f"{func}: {type(exc).__name__}: {exc}"[:1000])
    reply: dict[str, Any] = {"scores": scores, "errors": errors}
    if request.get("values"):  # the result getters' values too (the differential benchmark)
        reply["values"] = values
    print(json.dumps(reply, default=str))


if __name__ == "__main__":
    main()

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

import json
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
    raise ValueError(f"unknown getter kind {kind!r}")


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


def _grid(sheet: Any) -> list[list[Any]]:
    rows = [list(row) for row in sheet.iter_rows(values_only=True)]
    rows = [[_norm(v) for v in row] for row in rows]
    while rows and all(v is None for v in rows[-1]):
        rows.pop()
    width = max(
        (max((i + 1 for i, v in enumerate(r) if v is not None), default=0) for r in rows), default=0
    )
    return [(r + [None] * width)[:width] for r in rows]


def _norm(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, float):
        return round(value, 9)
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


def compare_table(result: Value, expected: Value = None, **options: Any) -> float:
    """OSWorld's compare_table: every rule must hold (sheet_data, check_cell, sheet_print, sheet_fuzzy)."""
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

    for rule in rules:
        kind = rule["type"]
        try:
            if kind in ("sheet_data", "sheet_print"):
                a, b = _grid(pick(rule["sheet_idx0"])), _grid(pick(rule["sheet_idx1"]))
                if kind == "sheet_print":
                    a = [["" if v is None else str(v) for v in r] for r in a]
                    b = [["" if v is None else str(v) for v in r] for r in b]
                if a != b:
                    return 0.0
            elif kind == "check_cell":
                sheet = pick(rule.get("sheet_idx", "RI0"))
                cell = sheet[rule["coordinate"]]
                for prop, check in (rule.get("props") or {}).items():
                    if prop != "value":
                        raise ValueError(
                            f"check_cell property {prop!r} is not implemented (value only)"
                        )
                    if not _compare_cell(cell.value, check.get("method", "eq"), check.get("ref")):
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


def compare_pptx_files(result: Value, expected: Value, **options: Any) -> float:
    """OSWorld's compare_pptx_files: same slides, shapes, texts, and (by default) run fonts and shape geometry."""
    if result is None or expected is None:
        return 0.0
    from pptx import Presentation

    a, b = Presentation(result), Presentation(expected)
    if len(a.slides) != len(b.slides):
        return 0.0
    examine_shape = options.get("examine_shape", True)
    font_checks = [
        k
        for k in ("bold", "italic", "underline", "size", "name")
        if options.get(f"examine_font_{k}", True)
    ]
    for slide_a, slide_b in zip(a.slides, b.slides, strict=True):
        shapes_a, shapes_b = list(slide_a.shapes), list(slide_b.shapes)
        if len(shapes_a) != len(shapes_b):
            return 0.0
        for sa, sb in zip(shapes_a, shapes_b, strict=True):
            if examine_shape and (sa.left, sa.top, sa.width, sa.height) != (
                sb.left,
                sb.top,
                sb.width,
                sb.height,
            ):
                return 0.0
            if sa.has_text_frame != sb.has_text_frame:
                return 0.0
            if not sa.has_text_frame:
                continue
            if sa.text_frame.text.strip() != sb.text_frame.text.strip():
                return 0.0
            for pa, pb in zip(sa.text_frame.paragraphs, sb.text_frame.paragraphs, strict=False):
                for ra, rb in zip(pa.runs, pb.runs, strict=False):
                    for key in font_checks:
                        if getattr(ra.font, key) != getattr(rb.font, key):
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


def exact_match(result: Value, rules: dict[str, Any], **_: Any) -> float:
    text = _text(result)
    return 1.0 if text is not None and text.rstrip() == str(rules["expected"]).rstrip() else 0.0


def _docx_paragraphs(path: str) -> list[Any]:
    from docx import Document

    return list(Document(path).paragraphs)


def compare_docx_files(result: Value, expected: Value, **options: Any) -> float:
    """OSWorld's compare_docx_files: same paragraphs (or, with content_only, the fuzzy ratio of all text)."""
    if result is None or expected is None:
        return 0.0
    a, b = [p.text for p in _docx_paragraphs(result)], [p.text for p in _docx_paragraphs(expected)]
    if options.get("ignore_case"):
        a, b = [t.lower() for t in a], [t.lower() for t in b]
    if options.get("content_only"):
        from rapidfuzz import fuzz

        return fuzz.ratio("\n".join(a), "\n".join(b)) / 100
    if options.get("ignore_blanks"):
        return 1.0 if re.sub(r"\s+", "", "".join(a)) == re.sub(r"\s+", "", "".join(b)) else 0.0
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


def compare_text_file(result: Value, expected: Value, **options: Any) -> float:
    a, b = _text(result), _text(expected)
    if a is None or b is None:
        return 0.0
    if options.get("ignore_blanks"):
        a, b = re.sub(r"\s+", " ", a).strip(), re.sub(r"\s+", " ", b).strip()
    if options.get("ignore_case"):
        a, b = a.lower(), b.lower()
    return 1.0 if a == b else 0.0


def compare_csv(result: Value, expected: Value, **options: Any) -> float:
    a, b = _text(result), _text(expected)
    if a is None or b is None:
        return 0.0
    la = [line.strip() for line in a.splitlines() if line.strip()]
    lb = [line.strip() for line in b.splitlines() if line.strip()]
    if options.get("ignore_case"):
        la, lb = [x.lower() for x in la], [x.lower() for x in lb]
    return 1.0 if la == lb else 0.0


METRICS = {f.__name__: f for f in (
    compare_table, compare_pptx_files, check_include_exclude, check_direct_json_object, exact_match,
    compare_docx_files, compare_line_spacing, compare_pdfs, compare_images, check_list,
    compare_text_file, compare_csv,
)}  # fmt: skip


def main() -> None:
    request = json.loads(sys.stdin.read())
    scores: list[float] = []
    errors: list[str] = []
    for func, result_spec, expected_spec, options in zip(
        request["funcs"], request["results"], request["expected"], request["options"], strict=True
    ):
        try:
            result = resolve(result_spec)
            expected = resolve(expected_spec)
            options = dict(options or {})
            score = METRICS[func](result, expected, **options)
            scores.append(float(score))
            errors.append("")
        except Exception as exc:
            scores.append(0.0)
            errors.append(f"{func}: {type(exc).__name__}: {exc}"[:1000])
    print(json.dumps({"scores": scores, "errors": errors}))


if __name__ == "__main__":
    main()

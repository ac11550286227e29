"""Our desktop metrics against OSWorld's own (desktop-env 1.0.2) on the same triples (issue 32).

    make osworld-evals-venv
    .venv/bin/python benchmarks/desktop/osworld_differential.py \
        [--osworld OSWORLD_DIR --cache CACHE_DIR] [--out results/osworld_differential.jsonl]

Triples (function, result file, expected file, options), from:

* every shipped task (``examples/desktop``) that compares a result file with an expected
  file: the gold against itself, the initial file against the gold;
* generated variants of each gold, against the gold: one cell changed and a sheet
  renamed (xlsx), a paragraph changed and a run made bold (docx), the slides reordered and a
  run's colour or a paragraph's alignment changed (pptx), a line changed, trailing blanks and
  upper case (csv, text);
* with ``--osworld`` and ``--cache``: the real tasks of ``test_all.json`` that are supported
  here and compare one result file with one expected file, with their own options: the gold
  against itself, the initial file against the gold, and the same variants.

Both sides run in jails of their own (never in this process: the functions parse the files,
and OSWorld's run code of its own), ours with the grader's interpreter and `_evaluate.py`,
OSWorld's with ``.venv/osworld-evals`` and `osworld_runner.py`. A triple agrees when the
scores are equal; an exception counts as 0 on either side, and is listed. Every
disagreement is printed with both answers, for a reason to be recorded in RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import openpyxl
from docx import Document
from pptx import Presentation
from pptx.dml.color import RGBColor
from pptx.enum.text import PP_ALIGN

from agentinfra.environments.desktop._grading import GRADER_DISTRIBUTIONS
from agentinfra.environments.desktop._task import (
    getter_files,
    load_desktop_task,
    mirror_file,
    selected_task_files,
    support,
)
from agentinfra.sandbox import (
    JailLimits,
    JailSpec,
    kill_uid,
    python_runtime_paths,
    reserve_uid,
    system_library_paths,
)

ROOT = Path(__file__).resolve().parents[2]
EVALUATE = ROOT / "src" / "agentinfra" / "environments" / "desktop" / "_evaluate.py"
RUNNER = Path(__file__).resolve().parent / "osworld_runner.py"
OSWORLD_VENV = ROOT / ".venv" / "osworld-evals"
MODULES = {"compare_pptx_files": "slides", "compare_docx_files": "docs", "compare_line_spacing": "docs",
           "compare_table": "table", "compare_csv": "table", "compare_text_file": "vscode",
           "compare_docx_tables": "docs", "compare_subscript_contains": "docs",
           "has_page_numbers_in_footers": "docs", "compare_font_names": "docs", "is_first_line_centered": "docs",
           "check_italic_font_size_14": "docs", "contains_page_break": "docs", "find_default_font": "docs",
           "check_slide_orientation_Portrait": "slides", "file_contains": "general", "check_line_number": "general",
           "fuzzy_place_math": "general", "check_image_file_size": "gimp", "compare_docx_images": "docs",
           "check_auto_saving_time": "slides", "evaluate_presentation_fill_to_rgb_distance": "slides",
           "check_page_number_colors": "slides", "check_structure_sim": "gimp",
           "check_structure_sim_resized": "gimp", "check_brightness_decrease_and_structure_sim": "gimp",
           "check_saturation_increase_and_structure_sim": "gimp",
           "check_contrast_increase_and_structure_sim": "gimp", "check_file_exists_and_structure_sim": "gimp",
           "check_palette_and_structure_sim": "gimp", "check_image_mirror": "gimp", "check_image_size": "gimp",
           "check_triangle_position": "gimp", "check_textbox_on_leftside": "gimp",
           "check_green_background": "gimp"}  # fmt: skip


# -- variants ------------------------------------------------------------------------
def _xlsx_variants(gold: Path, folder: Path) -> list[tuple[str, Path]]:
    out = []
    book = openpyxl.load_workbook(gold)
    sheet = book.worksheets[0]
    for row in sheet.iter_rows():
        cell = next((c for c in row if c.value is not None and c.data_type in ("n", "s")), None)
        if cell is not None:
            cell.value = cell.value + 1 if cell.data_type == "n" else f"{cell.value}x"
            book.save(folder / "cell.xlsx")
            out.append(("one cell changed", folder / "cell.xlsx"))
            break
    book = openpyxl.load_workbook(gold)
    book.worksheets[0].title = f"{book.worksheets[0].title[:25]} renamed"
    book.save(folder / "renamed.xlsx")
    out.append(("a sheet renamed", folder / "renamed.xlsx"))
    return out + _xlsx_object_variants(gold, folder)


def _xlsx_object_variants(gold: Path, folder: Path) -> list[tuple[str, Path]]:
    """Variants of what compare_table's object rules read: a chart's title and first series,
    a pivot table's row and data fields, the zoom, a row hidden, a validation's list."""
    out: list[tuple[str, Path]] = []

    def variant(name: str, change: Any) -> None:
        book = openpyxl.load_workbook(gold)
        if change(book):
            path = folder / f"{name.replace(' ', '_')}.xlsx"
            book.save(path)
            out.append((name, path))

    def chart_title(book: Any) -> bool:
        charts = [c for ws in book.worksheets for c in ws._charts]
        if charts:
            charts[0].title = "Another title"
        return bool(charts)

    def chart_series(book: Any) -> bool:
        charts = [c for ws in book.worksheets for c in ws._charts if c.series]
        if charts:
            charts[0].series.pop()
        return bool(charts)

    def pivot_fields(book: Any) -> bool:
        pivots = [p for ws in book.worksheets for p in ws._pivots if p.rowFields or p.dataFields]
        for pivot in pivots[:1]:
            if pivot.rowFields:
                pivot.rowFields[0].x += 1
            else:
                pivot.dataFields[0].subtotal = "average"
        return bool(pivots)

    def zoom(book: Any) -> bool:
        view = book.worksheets[0].sheet_view
        view.zoomScale = 300 if (view.zoomScale or 100) < 200 else 80
        return True

    def hide_row(book: Any) -> bool:
        dims = book.worksheets[0].row_dimensions[2]
        dims.hidden = not dims.hidden
        return True

    def validation(book: Any) -> bool:
        found = [v for ws in book.worksheets for v in ws.data_validations.dataValidation]
        if found:
            found[0].formula1 = '"Yes,No"'
        return bool(found)

    for name, change in (("a chart retitled", chart_title), ("a chart series dropped", chart_series),
                         ("a pivot field moved", pivot_fields), ("the zoom changed", zoom),
                         ("a row hidden or shown", hide_row), ("a validation list changed", validation)):  # fmt: skip
        try:
            variant(name, change)
        except Exception as exc:  # openpyxl cannot write every book it reads: say so, go on
            print(f"variant {name!r} of {gold.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return out


def _docx_variants(gold: Path, folder: Path) -> list[tuple[str, Path]]:
    out = []
    document = Document(str(gold))
    paragraph = next((p for p in document.paragraphs if p.text.strip()), None)
    if paragraph is None:
        return out
    paragraph.add_run(" changed")
    document.save(str(folder / "text.docx"))
    out.append(("a paragraph changed", folder / "text.docx"))
    document = Document(str(gold))
    for run in next(p for p in document.paragraphs if p.text.strip()).runs:
        run.bold = True
    document.save(str(folder / "bold.docx"))
    out.append(("a run made bold", folder / "bold.docx"))
    return out


def _pptx_variants(gold: Path, folder: Path) -> list[tuple[str, Path]]:
    out = []
    deck = Presentation(str(gold))
    ids = deck.slides._sldIdLst
    if len(ids) >= 2:
        first = ids[0]
        ids.remove(first)
        ids.append(first)
        deck.save(str(folder / "reordered.pptx"))
        out.append(("slides reordered", folder / "reordered.pptx"))
    for name, change in (
        ("a run's colour changed", "colour"),
        ("a paragraph's alignment changed", "align"),
    ):
        deck = Presentation(str(gold))
        done = False
        for slide in deck.slides:
            for shape in slide.shapes:
                if not getattr(shape, "has_text_frame", False) or done:
                    continue
                for paragraph in shape.text_frame.paragraphs:
                    if paragraph.runs and not done:
                        if change == "colour":
                            paragraph.runs[0].font.color.rgb = RGBColor(0xC0, 0x10, 0x10)
                        else:
                            paragraph.alignment = (
                                PP_ALIGN.RIGHT
                                if paragraph.alignment != PP_ALIGN.RIGHT
                                else PP_ALIGN.LEFT
                            )
                        done = True
        if done:
            target = folder / f"{change}.pptx"
            deck.save(str(target))
            out.append((name, target))
    return out


def _text_variants(gold: Path, folder: Path) -> list[tuple[str, Path]]:
    text = gold.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    if not lines:
        return []
    suffix = gold.suffix
    changed = [f"{lines[0]}x", *lines[1:]]
    variants = {"a line changed": "\n".join(changed) + "\n", "trailing blanks": "\n".join(f"{x}  " for x in lines) + "\n",
                "upper case": text.upper()}  # fmt: skip
    out = []
    for index, (name, body) in enumerate(variants.items()):
        (folder / f"v{index}{suffix}").write_text(body)
        out.append((name, folder / f"v{index}{suffix}"))
    return out


def _image_variants(original: Path, folder: Path) -> list[tuple[str, Path]]:
    """What GIMP's checks tell apart: darker, brighter, more and less contrast and saturation, a
    mirror, a palette, half the size, noise, and a green background."""
    from PIL import Image, ImageEnhance, ImageOps

    source = Image.open(original)
    rgb = source.convert("RGB")
    out: list[tuple[str, Path]] = []

    def save(name: str, image: Any) -> None:
        path = folder / f"{name.replace(' ', '_')}.png"
        image.save(path)
        out.append((name, path))

    save("darker", ImageEnhance.Brightness(rgb).enhance(0.7))
    save("brighter", ImageEnhance.Brightness(rgb).enhance(1.3))
    save("more contrast", ImageEnhance.Contrast(rgb).enhance(1.5))
    save("less contrast", ImageEnhance.Contrast(rgb).enhance(0.6))
    save("more saturation", ImageEnhance.Color(rgb).enhance(1.6))
    save("less saturation", ImageEnhance.Color(rgb).enhance(0.4))
    save("mirrored", ImageOps.mirror(source))
    save("palette", rgb.quantize(64))
    save("half size", source.resize((max(1, source.width // 2), max(1, source.height // 2))))
    noisy = Image.effect_noise(rgb.size, 80).convert("RGB")
    save("noise blended", Image.blend(rgb, noisy, 0.5))
    import numpy as np

    array = np.array(rgb)
    array[array.astype(int).sum(axis=2) > 600] = (30, 200, 40)  # near white: the background
    green = Image.fromarray(array)
    save("green background", green)
    array = np.array(rgb)
    array[array.astype(int).sum(axis=2) > 0] = (30, 200, 40)  # every pixel not black
    save("all but black green", Image.fromarray(array))
    return out


def variants(gold: Path, folder: Path) -> list[tuple[str, Path]]:
    folder.mkdir(parents=True, exist_ok=True)
    make = {".xlsx": _xlsx_variants, ".docx": _docx_variants, ".pptx": _pptx_variants,
            ".csv": _text_variants, ".txt": _text_variants, ".png": _image_variants,
            ".jpg": _image_variants, ".jpeg": _image_variants}.get(gold.suffix.lower())  # fmt: skip
    try:
        return make(gold, folder) if make else []
    except Exception as exc:  # a gold our libraries cannot rewrite: no variants, said so
        print(f"  no variants of {gold.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return []


# -- triples -------------------------------------------------------------------------
def task_triples(path: Path, mirror: Path, source: str, folder: Path) -> list[dict[str, Any]]:
    task = load_desktop_task(path)
    if not support(task, mirror).supported:
        return []
    downloads = {str(item.get("path")): str(item.get("url"))
                 for step in task.config if step.get("type") == "download"
                 for item in (step.get("parameters") or {}).get("files") or []}  # fmt: skip
    found = []
    for index, (func, result, expected, options) in enumerate(zip(
            task.funcs, task.specs("result"), task.specs("expected"), task.specs("options"), strict=True)):  # fmt: skip
        if func not in MODULES or not result or result.get("type") != "vm_file":
            continue
        if not expected or expected.get("type") == "rule":
            # A check of the result alone, or against a rule: the initial file and its variants.
            (result_path, _), one = getter_files(result)[0][0], getter_files(result)[1]
            url = downloads.get(result_path)
            initial = mirror_file(mirror, url, task_id=task.id, dest=result_path) if url else None
            if not one or initial is None:
                continue
            base = {"source": source, "task": task.id, "func": func, "options": options or {},
                    "result_name": Path(result_path).name, "expected_name": None, "expected_files": [],
                    "expected_value": expected.get("rules") if expected else None, "has_expected": bool(expected)}  # fmt: skip
            found.append({**base, "case": "initial", "result": initial, "result_files": []})
            for name, variant in variants(initial, folder / f"{task.id}-{index}"):
                found.append(
                    {**base, "case": f"initial, {name}", "result": variant, "result_files": []}
                )
            continue
        if expected.get("type") == "vm_file":
            # Against a file the setup put in the home (GIMP's checks compare with the input
            # image): that file's download is the expected file, its variants the results.
            results, one = getter_files(result)
            inputs, one_input = getter_files(expected)
            url = downloads.get(inputs[0][0])
            original = mirror_file(mirror, url, task_id=task.id, dest=inputs[0][0]) if url else None
            if not (one and one_input) or original is None:
                continue
            name = Path(inputs[0][0]).name
            base = {"source": source, "task": task.id, "func": func, "options": options or {},
                    "result_name": Path(results[0][0]).name, "expected_name": name,
                    "expected_files": [(name, original)], "has_expected": True}  # fmt: skip
            found.append({**base, "case": "input vs input", "result": original, "result_files": []})
            for case, variant in variants(original, folder / f"{task.id}-{index}"):
                found.append(
                    {**base, "case": f"input, {case}", "result": variant, "result_files": []}
                )
            continue
        if expected.get("type") != "cloud_file":
            continue
        results, one = getter_files(result)
        golds, one_gold = getter_files(expected)
        if not (one and one_gold):
            continue
        result_path = results[0][0]
        gold = mirror_file(mirror, golds[0][0], task_id=task.id, dest=golds[0][1], cloud=True)
        if gold is None:
            continue
        # A multi getter's other files go beside the given one, by their names, as OSWorld's cache
        # and the home hold them (sheet_print reads the CSV beside the book): the gold's beside the
        # gold, and beside the result where the result is the gold.
        every_result = [Path(p).name for p, _ in getter_files(result, every=True)[0]]
        every_gold = [(Path(str(d or u)).name, mirror_file(mirror, u, task_id=task.id, dest=d, cloud=True))
                      for u, d in getter_files(expected, every=True)[0]]  # fmt: skip
        gold_name = Path(str(golds[0][1] or gold.name)).name
        expected_files = [(n, f) for n, f in every_gold if f is not None]
        as_result = (
            dict(zip(every_result, [f for _, f in every_gold], strict=False))
            if len(every_result) == len(every_gold)
            else {}
        )
        companions = [
            (n, f) for n, f in as_result.items() if f is not None and n != Path(result_path).name
        ]
        base = {"source": source, "task": task.id, "func": func, "options": options or {},
                "result_name": Path(result_path).name, "expected_name": gold_name, "expected_files": expected_files,
                "has_expected": True}  # fmt: skip
        found.append({**base, "case": "gold vs gold", "result": gold, "result_files": companions})
        url = downloads.get(result_path)
        initial = mirror_file(mirror, url, task_id=task.id, dest=result_path) if url else None
        if initial is not None:
            found.append({**base, "case": "initial vs gold", "result": initial, "result_files": []})
        for name, variant in variants(gold, folder / f"{task.id}-{index}"):
            found.append({**base, "case": name, "result": variant, "result_files": companions})
    return found


# -- the two jails ---------------------------------------------------------------------
def _jailed(argv: tuple[str, ...], ro_paths: tuple[str, ...], copy_in: tuple[tuple[str, str], ...],
            home: Path, expected: Path, payload: Any) -> Any:  # fmt: skip
    uid, lock = reserve_uid()
    try:
        for top in (home, expected):
            for directory, _, files in os.walk(top):
                os.chown(directory, uid, uid)
                for name in files:
                    os.chown(os.path.join(directory, name), uid, uid)
        spec = JailSpec(argv=argv, env={"PATH": "/nonexistent", "HOME": "/tmp/work", "LANG": "C.UTF-8",
                                        "PYTHONDONTWRITEBYTECODE": "1"},
                        uid=uid, ro_paths=ro_paths + system_library_paths(),
                        binds=((str(home), "/home/user"), (str(expected), "/expected")), copy_in=copy_in,
                        limits=JailLimits(memory_limit_bytes=8 << 30, max_processes=64, cpu_limit_s=1800))  # fmt: skip
        done = subprocess.run(spec.command("namespaces+uid"), input=json.dumps(payload).encode(),
                              capture_output=True, timeout=1800, check=False)  # fmt: skip
    finally:
        kill_uid(uid)
        os.close(lock)
    if done.returncode != 0:
        raise SystemExit(
            f"{argv[0]} in its jail exited {done.returncode}: {done.stderr.decode(errors='replace')[-3000:]}"
        )
    return json.loads(done.stdout)


def _osworld_paths() -> tuple[str, ...]:
    import sysconfig

    stdlib = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
    library = os.path.join(
        str(sysconfig.get_config_var("LIBDIR")), str(sysconfig.get_config_var("LDLIBRARY"))
    )
    venv = (
        OSWORLD_VENV / "bin" / "python",
        OSWORLD_VENV / "pyvenv.cfg",
        OSWORLD_VENV / "lib",
    )  # links followed by the jail
    return (*map(str, venv), *sorted(p for p in stdlib if p.startswith(sys.base_prefix)),
            *([library] if os.path.isfile(library) else []))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--osworld", type=Path, help="an OSWorld checkout (evaluation_examples/ inside)"
    )
    parser.add_argument("--cache", type=Path, help="OSWorld's cache directory")
    parser.add_argument(
        "--tasks", type=Path, help="task list (default: evaluation_examples/test_all.json)"
    )
    parser.add_argument("--out", type=Path, default=Path("results/osworld_differential.jsonl"))
    parser.add_argument(
        "--ours", type=Path, default=EVALUATE, help="our _evaluate.py (another tree's, to compare)"
    )
    args = parser.parse_args()
    if not (OSWORLD_VENV / ".installed").is_file():
        raise SystemExit("OSWorld's functions are not installed: make osworld-evals-venv")
    with tempfile.TemporaryDirectory(prefix="agentinfra-differential-") as scratch:
        folder = Path(scratch)
        triples: list[dict[str, Any]] = []
        shipped = ROOT / "examples" / "desktop"
        for path in sorted((shipped / "tasks").glob("*.json")):
            triples += task_triples(path, shipped / "mirror", "shipped", folder / "variants")
        if args.osworld and args.cache:
            selection = args.tasks or args.osworld / "evaluation_examples" / "test_all.json"
            for path in selected_task_files(args.osworld, selection):
                triples += task_triples(path, args.cache, "osworld", folder / "variants")
        home, expected = folder / "home", folder / "expected"
        home.mkdir()
        expected.mkdir()
        for index, triple in enumerate(triples):
            (home / str(index)).mkdir()
            (expected / str(index)).mkdir()
            for side, files in ((home, [(triple["result_name"], triple["result"]), *triple["result_files"]]),
                                (expected, triple["expected_files"])):  # fmt: skip
                for name, source in files:
                    shutil.copyfile(source, side / str(index) / name)
                    os.chmod(side / str(index) / name, 0o644)
            triple["jail_result"] = f"/home/user/{index}/{triple['result_name']}"
            triple["jail_expected"] = (f"/expected/{index}/{triple['expected_name']}" if triple["expected_name"]
                                       else triple.get("expected_value"))  # fmt: skip
        print(f"{len(triples)} triples", flush=True)
        ours = _jailed((sys.executable, "-I", "/tmp/work/evaluate.py"), python_runtime_paths(GRADER_DISTRIBUTIONS),
                       ((str(args.ours), "evaluate.py"),), home, expected, {
                           "funcs": [t["func"] for t in triples],
                           "results": [{"kind": "file", "path": t["jail_result"]} for t in triples],
                           "expected": [({"kind": "file", "path": t["jail_expected"]} if t["expected_name"]
                                         else None if t["jail_expected"] is None
                                         else {"kind": "value", "value": t["jail_expected"]}) for t in triples],
                           "options": [t["options"] for t in triples]})  # fmt: skip
        theirs = _jailed((str(OSWORLD_VENV / "bin" / "python"), "-I", "/tmp/work/runner.py"), _osworld_paths(),
                         ((str(RUNNER), "runner.py"),), home, expected,
                         [{"module": MODULES[t["func"]], "func": t["func"], "result": t["jail_result"],
                           "expected": t["jail_expected"], "has_expected": t["has_expected"],
                           "options": t["options"]} for t in triples])  # fmt: skip
    rows = []
    for index, triple in enumerate(triples):
        our_score, our_error = ours["scores"][index], ours["errors"][index]
        their = theirs[index]
        their_score = their.get("score") or 0.0
        rows.append({"source": triple["source"], "task": triple["task"], "func": triple["func"],
                     "case": triple["case"], "options": triple["options"], "ours": our_score,
                     "ours_error": our_error, "osworld": their.get("score"), "osworld_error": their.get("error", ""),
                     "agree": abs(float(our_score) - float(their_score)) < 1e-6})  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    agree = sum(r["agree"] for r in rows)
    by_func = Counter((r["func"], r["agree"]) for r in rows)
    print(json.dumps({"triples": len(rows), "agree": agree, "agreement": round(agree / max(1, len(rows)), 4),
                      "by_func": {f"{f} {'agree' if a else 'disagree'}": n for (f, a), n in sorted(by_func.items())},
                      "errors_ours": sum(bool(r["ours_error"]) for r in rows),
                      "errors_osworld": sum(bool(r["osworld_error"]) for r in rows)}, indent=1))  # fmt: skip
    for r in rows:
        if not r["agree"]:
            print(f"DISAGREE {r['source']} {r['task']} {r['func']} [{r['case']}] ours {r['ours']} {r['ours_error'][:200]}"
                  f" | osworld {r['osworld']} {r['osworld_error'][:200]}")  # fmt: skip


if __name__ == "__main__":
    main()

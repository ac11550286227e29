"""Our metrics against OSWorld's semantics (desktop-env 1.0.2), on small files made here: what
compare_pptx_files examines by default, compare_csv's exact lines, and every option, rule or
check_cell method we do not implement making a task unsupported rather than graded leniently."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pptx import Presentation
from pptx.dml.color import RGBColor
from pptx.enum.text import PP_ALIGN
from pptx.util import Inches

from agentinfra.environments.desktop import _evaluate as evaluate
from agentinfra.environments.desktop._task import load_desktop_task, support


def _deck(path: Path, *, background: RGBColor | None = None, notes: str = "", colour: RGBColor | None = None,
          align: Any = None, level: int = 0, strike: bool = False, left: int = Inches(1)) -> Any:  # fmt: skip
    deck = Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[6])  # blank
    if background is not None:
        slide.background.fill.solid()
        slide.background.fill.fore_color.rgb = background
    box = slide.shapes.add_textbox(left, Inches(1), Inches(4), Inches(1))
    paragraph = box.text_frame.paragraphs[0]
    run = paragraph.add_run()
    run.text = "Quarterly results"
    paragraph.level = level
    if align is not None:
        paragraph.alignment = align
    if colour is not None:
        run.font.color.rgb = colour
    if strike:
        run.font._element.set("strike", "sngStrike")
    slide.notes_slide.notes_text_frame.text = notes
    deck.save(str(path))
    return evaluate.FileValue(path)


@pytest.mark.parametrize(
    ("change", "option"),
    [
        ({"background": RGBColor(0xFF, 0, 0)}, "examine_background_color"),
        ({"notes": "say this"}, "examine_note"),
        ({"colour": RGBColor(0, 0, 0xFF)}, "examine_color_rgb"),
        ({"align": PP_ALIGN.CENTER}, "examine_alignment"),
        ({"strike": True}, "examine_strike_through"),
        ({"left": Inches(2)}, "examine_shape"),
    ],
)
def test_compare_pptx_examines_what_osworld_examines_by_default(tmp_path: Path, change: dict[str, Any],
                                                                 option: str) -> None:  # fmt: skip
    base = {"colour": RGBColor(0, 0, 0)} if "colour" in change else {}
    ours = _deck(tmp_path / "ours.pptx", **base)
    gold = _deck(tmp_path / "gold.pptx", **{**base, **change})
    assert evaluate.compare_pptx_files(ours, _deck(tmp_path / "same.pptx", **base)) == 1.0
    assert evaluate.compare_pptx_files(ours, gold) == 0.0  # a do-nothing episode: no reward
    assert evaluate.compare_pptx_files(ours, gold, **{option: False}) == 1.0


def test_compare_pptx_leniencies_are_osworlds(tmp_path: Path) -> None:
    """A colour only one side sets, and no alignment against LEFT, compare equal in OSWorld."""
    plain = _deck(tmp_path / "plain.pptx")
    assert (
        evaluate.compare_pptx_files(plain, _deck(tmp_path / "c.pptx", colour=RGBColor(9, 9, 9)))
        == 1.0
    )
    assert (
        evaluate.compare_pptx_files(plain, _deck(tmp_path / "l.pptx", align=PP_ALIGN.LEFT)) == 1.0
    )


def test_compare_pptx_indent_is_checked_by_level_and_by_the_slides_bullets(tmp_path: Path) -> None:
    flat, indented = _deck(tmp_path / "a.pptx"), _deck(tmp_path / "b.pptx", level=1)
    assert evaluate.compare_pptx_files(flat, indented) == 0.0
    assert evaluate.compare_pptx_files(flat, indented, examine_indent=False) == 0.0  # bullets' lvl
    assert (
        evaluate.compare_pptx_files(flat, indented, examine_indent=False, examine_bullets=False)
        == 1.0
    )


def test_compare_csv_compares_lines_exactly_unless_not_strict(tmp_path: Path) -> None:
    (tmp_path / "r.csv").write_text("a,b\n\n1,2 \n")
    (tmp_path / "g.csv").write_text("a,b\n\n1,2\n")
    (tmp_path / "h.csv").write_text("A,B\n\n1,2\n")
    r, g, h = (evaluate.FileValue(tmp_path / n) for n in ("r.csv", "g.csv", "h.csv"))
    assert evaluate.compare_csv(r, g) == 0.0
    assert evaluate.compare_csv(r, g, strict=False) == 1.0
    assert evaluate.compare_csv(r, [h, g], strict=False) == 1.0  # any of several expected files
    assert evaluate.compare_csv(r, h, strict=False) == 0.0
    assert evaluate.compare_csv(r, h, strict=False, ignore_case=True) == 1.0


@pytest.mark.parametrize(
    ("func", "options", "missing"),
    [
        ("compare_pptx_files", {"examine_title_bottom_position": True, "examine_shape": False}, []),
        ("compare_pptx_files", {"_note": "a comment", "note": True}, ["compare_pptx_files option 'note'"]),
        ("compare_docx_files", {"ignore_blanks": False, "fuzzy_match": True}, []),
        ("compare_docx_files", {"compare_styles": True}, ["compare_docx_files option 'compare_styles'"]),
        ("exact_match", {"anything": 1}, ["exact_match option 'anything'"]),
        ("compare_table", {"rules": [{"type": "style", "sheet_idx0": 0, "sheet_idx1": "EI0"}]},
         ["compare_table rule 'style'"]),
        ("compare_table", {"rules": [{"type": "chart", "sheet_idx0": 0, "sheet_idx1": "EI0",
                                      "chart_props": ["type", "colour"]}]}, ["chart property 'colour'"]),
        ("compare_table", {"rules": [{"type": "pivot_table", "sheet_idx0": 0, "sheet_idx1": "EI0",
                                      "pivot_props": ["row_fields", "data_fields", "grand"]}]},
         ["pivot_table property 'grand'"]),
        ("compare_table", {"rules": [{"type": "zoom", "sheet_idx": 0, "method": "about", "ref": 1}]},
         ["zoom method 'about'"]),
        ("compare_table", {"rules": [{"type": "data_validation", "sheet_idx": 0, "dv_props": [
            {"type": {"method": "eq", "ref": "list"}, "colour": {"method": "eq", "ref": 1}}]}]},
         ["data_validation attribute 'colour'"]),
        ("compare_table", {"rules": [{"type": "sheet_data", "sheet_idx0": "RI0", "sheet_idx1": "EI0",
                                      "ignore_case": True}]}, []),
        ("compare_table", {"rules": [{"type": "check_cell", "sheet_idx": 0, "coordinate": "A1", "props": {
            "value": {"method": "approx:0.01", "ref": 1}, "font_bold": {"method": "eq", "ref": True},
            "font_shadow": {"method": "eq", "ref": True}, "bgcolor": {"method": "re.Q", "ref": "F"}}}]},
         ["check_cell property 'font_shadow'", "check_cell method 're.Q'"]),
        ("compare_table", {"rules": [{"type": "check_cell", "sheet_idx": 0, "coordinate": "A1",
                                      "props": {"value": {"method": "approx:x", "ref": 1}}}] * 2},
         ["check_cell method 'approx:x'"]),
        ("compare_table", {"rules": [{"type": "sheet_fuzzy", "sheet_idx0": "RI0", "sheet_idx1": "EI0",
                                      "rules": [{"range": ["A1:A2"], "type": "regex"}]}]},
         ["sheet_fuzzy type 'regex'"]),
    ],
)  # fmt: skip
def test_what_we_do_not_implement_is_named(
    func: str, options: dict[str, Any], missing: list[str]
) -> None:
    assert evaluate.unimplemented_options(func, options) == missing


def test_a_task_asking_for_an_unimplemented_option_is_unsupported(tmp_path: Path) -> None:
    raw = {"id": "t", "instruction": "x", "config": [], "evaluator": {
        "func": ["compare_text_file", "compare_pptx_files"],
        "result": [{"type": "vm_file", "path": "/home/user/a.txt", "dest": "a.txt"},
                   {"type": "vm_file", "path": "/home/user/a.pptx", "dest": "a.pptx"}],
        "expected": [{"type": "vm_file", "path": "/home/user/b.txt", "dest": "b.txt"},
                     {"type": "vm_file", "path": "/home/user/b.pptx", "dest": "b.pptx"}],
        "options": [{}, {"examine_shape": False, "examine_slide_transition": True}]}}  # fmt: skip
    (tmp_path / "t.json").write_text(json.dumps(raw))
    assert support(load_desktop_task(tmp_path / "t.json"), None).reason == (
        "not implemented: compare_pptx_files option 'examine_slide_transition'"
    )
    raw["evaluator"]["options"][1].pop("examine_slide_transition")
    (tmp_path / "t.json").write_text(json.dumps(raw))
    assert support(load_desktop_task(tmp_path / "t.json"), None).supported


def test_the_grading_jail_refuses_an_unimplemented_option_too(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    request = {"funcs": ["compare_text_file"], "results": [{"kind": "value", "value": "a"}],
               "expected": [{"kind": "value", "value": "a"}], "options": [{"ignore_punctuation": True}]}  # fmt: skip
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(request)))
    evaluate.main()
    reply = json.loads(capsys.readouterr().out)
    assert reply["scores"] == [0.0]
    assert reply["errors"] == [
        "compare_text_file: ValueError: not implemented: compare_text_file option 'ignore_punctuation'"
    ]


def test_sheet_print_compares_the_csv_libreoffice_printed_beside_each_book(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """OSWorld's sheet_print reads ``<stem>-<sheet>.csv`` (the task's postconfig converts the book):
    the printed values, decimal commas and all, not the cells' values."""
    import openpyxl

    home, gold_dir = tmp_path / "home", tmp_path / "expected"
    home.mkdir()
    gold_dir.mkdir()
    for folder, printed in ((home, "1.5\n2\n\n"), (gold_dir, "1,5\n2\n")):
        book = openpyxl.Workbook()
        book.active.title = "Sheet1"
        book.active["A1"] = 1.5
        book.save(folder / "book.xlsx")
        (folder / "book-Sheet1.csv").write_text(printed)
    monkeypatch.setattr(
        evaluate, "_file", lambda path: evaluate.FileValue(path) if Path(path).is_file() else None
    )
    rule = {"rules": [{"type": "sheet_print", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1"}]}
    ours, gold = evaluate.FileValue(home / "book.xlsx"), evaluate.FileValue(gold_dir / "book.xlsx")
    assert (
        evaluate.compare_table(ours, gold, **rule) == 0.0
    )  # same cell values, printed differently
    (home / "book-Sheet1.csv").write_text("1,5\n2\n")
    assert evaluate.compare_table(ours, gold, **rule) == 1.0
    (home / "book-Sheet1.csv").unlink()
    assert evaluate.compare_table(ours, gold, **rule) == 0.0  # nothing printed: no pass


def test_sheet_data_rounds_to_osworlds_precision(tmp_path: Path) -> None:
    import openpyxl

    for name, value in (("ours.xlsx", 1.23451), ("gold.xlsx", 1.2345)):
        book = openpyxl.Workbook()
        book.active["A1"] = value
        book.save(tmp_path / name)
    ours, gold = (
        evaluate.FileValue(tmp_path / "ours.xlsx"),
        evaluate.FileValue(tmp_path / "gold.xlsx"),
    )
    rule = {"type": "sheet_data", "sheet_idx0": "RI0", "sheet_idx1": "EI0"}
    assert (
        evaluate.compare_table(ours, gold, rules=[rule]) == 1.0
    )  # 4 decimals by default, as OSWorld
    assert evaluate.compare_table(ours, gold, rules=[{**rule, "precision": 5}]) == 0.0


def test_osworlds_single_purpose_document_checks(tmp_path: Path) -> None:
    from docx import Document
    from docx.enum.text import WD_BREAK, WD_PARAGRAPH_ALIGNMENT
    from docx.shared import Pt

    def doc(name: str, *, centered: bool = False, font: str | None = "Arial", page_break: bool = False,
            subscript: bool = False, italic_pt: int | None = None, cell: str = "a", footer: str = "") -> Any:  # fmt: skip
        document = Document()
        paragraph = document.add_paragraph()
        run = paragraph.add_run("H2O")
        run.font.name = font
        run.font.subscript = subscript
        if italic_pt is not None:
            run.italic = True
            run.font.size = Pt(italic_pt)
        if centered:
            paragraph.alignment = WD_PARAGRAPH_ALIGNMENT.CENTER
        if page_break:
            run.add_break(WD_BREAK.PAGE)
        document.add_table(rows=1, cols=1).cell(0, 0).text = cell
        document.sections[0].footer.paragraphs[0].text = footer
        document.save(str(tmp_path / name))
        return evaluate.FileValue(tmp_path / name)

    plain = doc("plain.docx")
    assert evaluate.is_first_line_centered(doc("c.docx", centered=True)) == 1.0
    assert evaluate.is_first_line_centered(plain) == 0.0
    assert evaluate.compare_font_names(plain, {"font_name": "Arial"}) == 1.0
    assert evaluate.compare_font_names(doc("t.docx", font="Times"), {"font_name": "Arial"}) == 0.0
    broken = doc("b.docx", page_break=True)
    assert evaluate.contains_page_break(broken, {}) == 1.0
    assert evaluate.contains_page_break(broken, {"page_break_count": 2}) == 0.0
    assert evaluate.contains_page_break(plain, {}) == 0.0
    sub = doc("s.docx", subscript=True)
    assert evaluate.compare_subscript_contains(sub, doc("s2.docx", subscript=True)) == 1.0
    assert evaluate.compare_subscript_contains(plain, sub) == 0.0
    assert evaluate.compare_docx_tables(plain, doc("p2.docx")) == 1.0
    assert evaluate.compare_docx_tables(plain, doc("x.docx", cell="b")) == 0.0
    assert evaluate.has_page_numbers_in_footers(doc("f.docx", footer="Page 1")) == 1.0
    assert evaluate.has_page_numbers_in_footers(plain) == 0.0
    fourteen = doc("i14.docx", italic_pt=14)
    assert evaluate.check_italic_font_size_14(fourteen, fourteen) == 1.0
    assert evaluate.check_italic_font_size_14(doc("i12.docx", italic_pt=12), fourteen) == 0.0


def test_portrait_and_writers_default_font(tmp_path: Path) -> None:
    deck = Presentation()
    deck.slide_width, deck.slide_height = Inches(7.5), Inches(10)
    deck.save(str(tmp_path / "p.pptx"))
    assert evaluate.check_slide_orientation_Portrait(evaluate.FileValue(tmp_path / "p.pptx")) == 1.0
    assert evaluate.check_slide_orientation_Portrait(_deck(tmp_path / "l.pptx")) == 0.0
    registry = tmp_path / "registrymodifications.xcu"
    registry.write_text(
        '<?xml version="1.0"?><oor:items xmlns:oor="http://openoffice.org/2001/registry">'
        '<item oor:path="/org.openoffice.Office.Writer/DefaultFont"><prop oor:name="Standard" oor:op="fuse">'
        "<value>Times New Roman</value></prop></item></oor:items>"
    )
    found = evaluate.FileValue(registry)
    assert evaluate.find_default_font(found, {"font_name": "Times New Roman"}) == 1.0
    assert evaluate.find_default_font(found, {"font_name": "Arial"}) == 0.0


def test_osworlds_file_and_registry_checks(tmp_path: Path) -> None:
    (tmp_path / "log.txt").write_text("12:00:01 start\nno time\n23:59:60 leap\n")
    log = evaluate.FileValue(tmp_path / "log.txt")
    assert evaluate.file_contains(log, {"expected": ["start", "leap"]}) == 1.0
    assert evaluate.file_contains(log, {"expected": ["stop"]}) == 0.0
    assert evaluate.check_line_number(log, {"expected": "2"}) == 1.0
    assert evaluate.check_line_number(log, {"expected": 3}) == 0.0
    assert evaluate.check_image_file_size(log, {"max_size": 1000}) == 1.0
    assert evaluate.check_image_file_size(log, {"max_size": 10}) == 0.0
    registry = tmp_path / "registrymodifications.xcu"
    registry.write_text(
        '<?xml version="1.0"?><oor:items xmlns:oor="http://openoffice.org/2001/registry">'
        '<item oor:path="/org.openoffice.Office.Common/Save/Document"><prop oor:name="AutoSaveTimeIntervall" '
        'oor:op="fuse"><value>3</value></prop></item></oor:items>'
    )
    assert evaluate.check_auto_saving_time(evaluate.FileValue(registry), {"minutes": 3}) == 1.0
    assert evaluate.check_auto_saving_time(evaluate.FileValue(registry), {"minutes": 10}) == 0.0
    tree = '<desktop-frame><document-frame name="Slides View"/></desktop-frame>'
    assert evaluate.check_left_panel(tree) == 1.0
    assert evaluate.check_left_panel("<desktop-frame/>") == 0.0


def test_presentation_fill_distance_scores_an_unchanged_background_zero(tmp_path: Path) -> None:
    red, white = RGBColor(0xFF, 0, 0), RGBColor(0xFF, 0xFF, 0xFF)
    rules = {"rgb": [255, 0, 0], "original_rgb": [255, 255, 255]}
    assert (
        evaluate.evaluate_presentation_fill_to_rgb_distance(
            _deck(tmp_path / "r.pptx", background=red), rules
        )
        == 1.0
    )
    assert (
        evaluate.evaluate_presentation_fill_to_rgb_distance(
            _deck(tmp_path / "w.pptx", background=white), rules
        )
        == 0.0
    )


def _book(path: Path, *, chart: str = "bar", title: str = "Sales", zoom: int | None = None,
          hidden: bool = False, choices: str = '"Pass,Fail"', bold: bool = True) -> Path:  # fmt: skip
    import openpyxl
    from openpyxl.chart import BarChart, LineChart, Reference
    from openpyxl.styles import Font, PatternFill
    from openpyxl.worksheet.datavalidation import DataValidation

    book = openpyxl.Workbook()
    sheet = book.active
    for row in [["Month", "Sales"], ["Jan", 3], ["Feb", 5], ["Mar", 4]]:
        sheet.append(row)
    sheet["A1"].font = Font(bold=bold, color="FFFFFFFF")
    sheet["A1"].fill = PatternFill("solid", fgColor="FF0000FF")
    made = BarChart() if chart == "bar" else LineChart()
    made.title = title
    made.add_data(Reference(sheet, min_col=2, min_row=1, max_row=4), titles_from_data=True)
    made.set_categories(Reference(sheet, min_col=1, min_row=2, max_row=4))
    sheet.add_chart(made, "D2")
    if zoom is not None:
        sheet.sheet_view.zoomScale = zoom
    sheet.row_dimensions[3].hidden = hidden
    validation = DataValidation(type="list", formula1=choices)
    validation.add("C2:C20")
    sheet.add_data_validation(validation)
    book.save(path)
    return path


def test_compare_table_reads_charts_zoom_rows_validations_and_cell_styles(tmp_path: Path) -> None:
    gold = _book(tmp_path / "gold.xlsx")

    def score(rule: dict[str, Any], **change: Any) -> float:
        assert evaluate.unimplemented_options("compare_table", {"rules": [rule]}) == []
        other = _book(tmp_path / "other.xlsx", **change) if change else gold
        return evaluate.compare_table(str(other), str(gold), rules=[rule])

    chart = {
        "type": "chart",
        "sheet_idx0": 0,
        "sheet_idx1": "EI0",
        "chart_props": ["type", "title"],
    }
    assert score(chart) == 1.0
    assert score(chart, chart="line") == 0.0
    assert score(chart, title="Costs") == 0.0
    assert (
        score({**chart, "chart_props": ["type"]}, title="Costs") == 1.0
    )  # the title not asked for
    rows = {"type": "row_props", "sheet_idx0": 0, "sheet_idx1": "EI0", "props": ["hidden"]}
    assert (score(rows), score(rows, hidden=True)) == (1.0, 0.0)
    zoom = {"type": "zoom", "sheet_idx": 0, "method": "lt", "ref": 260}
    assert (score(zoom, zoom=90), score(zoom, zoom=300), score(zoom)) == (
        1.0,
        0.0,
        1.0,
    )  # unset: 100
    valid = {"type": "data_validation", "sheet_idx": 0, "dv_props": [{
        "ranges": {"method": "spreadsheet_range", "ref": ["C2:C10", "C2:C1048576"]},
        "type": {"method": "eq", "ref": "list"},
        "formula1": {"method": "str_set_eq", "ref": ["Fail", "Pass"]}}]}  # fmt: skip
    assert (score(valid), score(valid, choices='"Pass,Held"')) == (1.0, 0.0)
    cell = {"type": "check_cell", "sheet_idx": "RI0", "coordinate": "A1", "props": {
        "bgcolor": {"method": "eq", "ref": "FF0000FF"}, "font_color": {"method": "eq", "ref": "FFFFFFFF"},
        "font_bold": {"method": "eq", "ref": True}, "value": {"method": "eq", "ref": "Month"}}}  # fmt: skip
    assert (score(cell), score(cell, bold=False)) == (1.0, 0.0)


def test_pivot_tables_are_keyed_and_counted_as_osworld_does() -> None:
    """OSWorld's load_pivot_tables on openpyxl's pivot objects: the source range shrinks by the
    fields with no items at either end, and field indices count from the first such field."""
    from types import SimpleNamespace as Obj

    def pivot(row: int, data_subtotal: str = "sum") -> Any:
        field = lambda *xs: Obj(items=[Obj(h=None, x=x) for x in xs])  # noqa: E731
        return Obj(
            pivotFields=[Obj(items=[]), field(0, 1), field(0), Obj(items=[])],
            cache=Obj(cacheSource=Obj(type="worksheet", worksheetSource=Obj(ref="A1:D9", sheet="Data"))),
            name="P", visualTotals=True, showEmptyRow=False, showEmptyCol=False, showHeaders=True,
            location=None, pageFields=[], colFields=[], rowFields=[Obj(x=row)],
            dataFields=[Obj(fld=2, name="Sum", subtotal=data_subtotal, showDataAs="normal")],
        )  # fmt: skip

    props = {"col_fields", "filter", "row_fields", "data_fields"}
    found = evaluate._pivots(Obj(_pivots=[pivot(1)]), props)
    assert found == {"worksheet;(1, 2):(9, 3);Data": {
        "selection": [{(None, 0), (None, 1)}, {(None, 0)}], "filter_fields": set(),
        "col_fields": [], "row_fields": [0], "data_fields": ["1;;sum;normal"]}}  # fmt: skip
    assert evaluate._pivots(Obj(_pivots=[pivot(2)]), props) != found
    assert evaluate._pivots(Obj(_pivots=[pivot(1, "average")]), props) != found
    assert evaluate._pivots(None, props) == {}


@pytest.mark.parametrize(
    ("value", "method", "ref", "holds"),
    [(5, "range.te", [0, 5], True), (0, "range.te", [0, 5], False), (0, "range.et", [0, 5], True),
     ("Total: 5", "re.I", "total", True), ("Total", "re", "total", False),
     ('"a,b"', "str_list_eq", ["a", "b"], True), ("b,a", "str_list_eq", ["a", "b"], False),
     ("b,a", "str_set_eq", ["a", "b"], True), ("3.04", "approx:0.05", 3, True), (2, "ge", 2, True)],
)  # fmt: skip
def test_match_methods_are_osworlds(value: Any, method: str, ref: Any, holds: bool) -> None:
    assert evaluate._known_match_method(method)
    assert evaluate._match_rule(value, {"method": method, "ref": ref}) is holds


def _file(path: Path, text: str) -> evaluate.FileValue:
    path.write_text(text)
    return evaluate.FileValue(str(path))


def test_gimp_vlc_and_thunderbird_settings_read_as_osworld_reads_them(tmp_path: Path) -> None:
    gimprc = _file(tmp_path / "gimprc", '# GIMP gimprc\n\n(undo-levels 100)\n(theme "Dark")\n')
    assert evaluate.check_config_status(gimprc, {"key": "undo-levels", "value": "100"}) == 1.0
    assert evaluate.check_config_status(gimprc, {"key": "undo-levels", "value": "5"}) == 0.0
    assert (
        evaluate.check_config_status(gimprc, {"key": ["theme", '"Dark"'], "value": '"Dark"'}) == 1.0
    )
    # VLC writes every default as a comment; OSWorld reads the last line naming the key either way
    vlcrc = _file(tmp_path / "vlcrc", "#qt-max-volume=125\nqt-max-volume=200\n#qt-bgcone=1\n")
    assert evaluate.check_qt_max_volume(vlcrc, {"expected_qt_max_volume": 200}) == 1.0
    assert evaluate.check_qt_bgcone(vlcrc, {"expected_qt_bgcone": 0}) == 0.0
    assert (
        evaluate.check_qt_minimal_view(vlcrc, {"expected_qt_minimal_view": 0}) == 1.0
    )  # unset: default
    assert (
        evaluate.check_qt_slider_colours(vlcrc, {"type": "blackish"}) == 0.0
    )  # VLC's default colours
    dark = _file(tmp_path / "dark", "qt-slider-colours=10;10;10;20;20;20;0;0;0;99;99;99\n")
    assert evaluate.check_qt_slider_colours(dark, {"type": "blackish"}) == 1.0
    record = _file(
        tmp_path / "record", "#input-record-path=\ninput-record-path=/home/user/Desktop\n"
    )
    assert (
        evaluate.is_vlc_recordings_folder(record, {"recording_file_path": "/home/user/Desktop"})
        == 1.0
    )
    assert (
        evaluate.is_vlc_recordings_folder(vlcrc, {"recording_file_path": "/home/user/Desktop"})
        == 0.0
    )
    prefs = _file(tmp_path / "prefs.js", 'user_pref("mail.identity.id1.htmlSigText", "Anonym\\nXYZ Lab");\n'
                  'user_pref("mail.spam.manualMark", true);\n')  # fmt: skip
    expect = {
        "expect": {"mail.identity.id1.htmlSigText": {"method": "re.S", "ref": "Anonym\nXYZ Lab"}}
    }
    assert evaluate.check_thunderbird_prefs(prefs, expect) == 1.0
    assert (
        evaluate.check_thunderbird_prefs(
            prefs, {"expect": {"mail.absent": {"method": "eq", "ref": 1}}}
        )
        == 0.0
    )
    assert (
        evaluate.check_thunderbird_prefs(
            prefs, {**expect, "unexpect": {"mail.spam.manualMark": {"method": "eq", "ref": True}}}
        )
        == 0.0
    )
    rules = _file(tmp_path / "msgFilterRules.dat", 'version="9"\nlogging="no"\nname="Promos"\nenabled="yes"\n'
                  'type="17"\naction="Move to folder"\nactionValue="mailbox://nobody@Local%20Folders/Promotions"\n'
                  'condition="AND (subject,contains,discount)"\n')  # fmt: skip
    wanted = {
        "enabled": "yes",
        "action": "Move to folder",
        "condition": ["AND (subject,contains,discount)"],
    }
    assert evaluate.check_thunderbird_filter(rules, {"expect": [wanted]}) == 1.0
    assert (
        evaluate.check_thunderbird_filter(rules, {"expect": [{**wanted, "enabled": "no"}]}) == 0.0
    )
    assert (
        evaluate.check_thunderbird_filter(
            rules, {"expect": [wanted], "unexpect": [{"name": "Promos"}]}
        )
        == 0.0
    )
    for check in (
        evaluate.check_config_status,
        evaluate.check_qt_max_volume,
        evaluate.check_thunderbird_prefs,
    ):
        assert (
            check(None, {"key": "k", "value": "v", "expected_qt_max_volume": 1}) == 0.0
        )  # no file


def test_app_config_getters_read_fixed_places_in_the_home(tmp_path: Path) -> None:
    from agentinfra.environments.desktop._task import app_config_path

    assert (
        app_config_path({"type": "vlc_config", "dest": "vlcrc"}) == "/home/user/.config/vlc/vlcrc"
    )
    assert app_config_path({"type": "gimp_config_file", "file_name": "gimprc"}) == (
        "/home/user/.config/GIMP/2.10/gimprc"
    )
    raw = {"id": "t", "instruction": "x", "config": [], "evaluator": {
        "func": "check_config_status", "result": {"type": "gimp_config_file", "file_name": "../../../.bashrc"},
        "expected": {"type": "rule", "rules": {"key": "k", "value": "v"}}}}  # fmt: skip
    (tmp_path / "t.json").write_text(json.dumps(raw))
    assert (
        "is not a file under ~/.config/GIMP/2.10"
        in support(load_desktop_task(tmp_path / "t.json"), None).reason
    )


def test_structural_similarity_is_scikit_images_on_known_cases() -> None:
    """Identical images score 1; an image against its negative scores below 0; noise lowers it.
    (The differential benchmark checks it against scikit-image itself, which this venv lacks.)"""
    import numpy as np

    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)
    assert evaluate._ssim(image, image) == pytest.approx(1.0)
    assert evaluate._ssim(image, 255 - image) < 0
    noisy = np.clip(image.astype(int) + rng.integers(-30, 30, image.shape), 0, 255).astype(np.uint8)
    assert 0.5 < evaluate._ssim(image, noisy) < 1.0
    # constant images: the stabilising constants alone decide, as in scikit-image
    flat = np.full((10, 10, 1), 100, np.uint8)
    assert evaluate._ssim(flat, flat) == pytest.approx(1.0)


def _png(path: Path, pixels: Any, mode: str | None = None) -> str:
    from PIL import Image

    Image.fromarray(pixels).convert(mode or "RGB").save(path)
    return str(path)


def test_osworlds_gimp_image_checks(tmp_path: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(2)
    photo = rng.integers(60, 200, (48, 64, 3), dtype=np.uint8)
    original = _png(tmp_path / "photo.png", photo)
    darker = _png(tmp_path / "darker.png", (photo * 0.7).astype(np.uint8))
    assert evaluate.check_brightness_decrease_and_structure_sim(darker, original) == 1.0
    assert (
        evaluate.check_brightness_decrease_and_structure_sim(original, original) == 0.0
    )  # unchanged
    assert evaluate.check_structure_sim(original, original) == 1.0
    assert evaluate.check_structure_sim(_png(tmp_path / "noise.png", rng.integers(0, 256, photo.shape, dtype=np.uint8)),
                                        original) == 0.0  # fmt: skip
    mirrored = _png(tmp_path / "mirror.png", photo[:, ::-1].copy())
    assert (
        evaluate.check_image_mirror(mirrored, original),
        evaluate.check_image_mirror(original, original),
    ) == (1.0, 0.0)
    contrast = np.clip((photo.astype(int) - 128) * 1.5 + 128, 0, 255).astype(np.uint8)
    assert (
        evaluate.check_contrast_increase_and_structure_sim(
            _png(tmp_path / "c.png", contrast), original
        )
        == 1.0
    )
    assert evaluate.check_contrast_increase_and_structure_sim(original, original) == 0.0
    blocks = np.zeros((32, 32, 3), np.uint8)
    blocks[:16, :16], blocks[16:, 16:] = (255, 0, 0), (0, 0, 255)
    rgb = _png(tmp_path / "blocks.png", blocks)
    from PIL import Image

    Image.open(rgb).quantize(4).save(tmp_path / "palette.png")  # 3 colours: quantised exactly
    assert evaluate.check_palette_and_structure_sim(str(tmp_path / "palette.png"), rgb) == 1.0
    assert evaluate.check_palette_and_structure_sim(rgb, rgb) == 0.0  # not palette-based
    assert evaluate.check_image_size(original, {"width": 64, "height": 48}) == 1.0
    assert evaluate.check_image_size(original, {"height": 512}) == 0.0
    # OSWorld takes the second least common colour for the shape: here the yellow block, with one
    # orange pixel fewer (with two colours only it would take the background, centred by nature)
    for where, score in (((45, 55), 1.0), ((5, 15), 0.0)):
        canvas = np.full((100, 100, 3), 255, np.uint8)
        canvas[where[0] : where[1], where[0] : where[1]] = (255, 255, 0)
        canvas[90, 90] = (255, 128, 0)
        assert evaluate.check_triangle_position(_png(tmp_path / f"t{score}.png", canvas)) == score
    text = np.full((50, 100, 3), 255, np.uint8)
    text[20:25, 2:30] = 0
    assert evaluate.check_textbox_on_leftside(_png(tmp_path / "left.png", text)) == 1.0
    text[20:25, 2:10] = 255
    assert evaluate.check_textbox_on_leftside(_png(tmp_path / "right.png", text)) == 0.0
    # a square image (OSWorld reads [x, y]): black object kept, the rest turned green
    white = np.full((20, 20, 3), 255, np.uint8)
    white[8:12, 8:12] = 0
    green = white.copy()
    green[(white != 0).any(axis=2)] = (0, 200, 0)
    assert (
        evaluate.check_green_background(
            _png(tmp_path / "g.png", green), _png(tmp_path / "w.png", white)
        )
        == 1.0
    )
    assert (
        evaluate.check_green_background(
            _png(tmp_path / "w2.png", white), _png(tmp_path / "w3.png", white)
        )
        == 0.0
    )
    for check in (
        evaluate.check_structure_sim,
        evaluate.check_image_mirror,
        evaluate.check_green_background,
    ):
        assert check(None, original) == 0.0

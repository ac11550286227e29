"""Writes the shipped desktop tasks (OSWorld format) and their small input and gold files.

    .venv/bin/python examples/desktop/make_tasks.py

Tasks go to ``examples/desktop/tasks/<id>.json``; every downloaded or expected file
goes to ``examples/desktop/mirror/`` under OSWorld's cache naming
(``<uuid5(NAMESPACE_URL, url)>_<name>``). Each task carries ``"solution"``: a
scripted action list that solves it (the audit runs it). Gold PDFs are made with
the same LibreOffice the desktop runs (``soffice --headless --convert-to pdf``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import openpyxl
from docx import Document
from PIL import Image, ImageDraw
from pptx import Presentation

from agentinfra.environments.desktop import mirror_path

HERE = Path(__file__).resolve().parent
TASKS = HERE / "tasks"
MIRROR = HERE / "mirror"
BASE = "https://files.agentinfra.example/desktop/"
H = "/home/user"


def url(name: str) -> str:
    return BASE + name


def put(name: str, writer: Any) -> str:
    """Writes a mirror file with ``writer(path)``; returns its URL."""
    target = mirror_path(MIRROR, url(name))
    writer(target)
    return url(name)


def put_text(name: str, text: str) -> str:
    return put(name, lambda p: p.write_text(text))


def download(name: str, dest: str) -> dict[str, Any]:
    return {"type": "download", "parameters": {"files": [{"url": url(name), "path": dest}]}}


def open_file(path: str) -> dict[str, Any]:
    return {"type": "open", "parameters": {"path": path}}


XTERM = {
    "type": "launch",
    "parameters": {
        "command": ["xterm", "-fa", "DejaVu Sans Mono", "-fs", "11", "-geometry", "120x36+80+60"]
    },
}


def typing(text: str) -> dict[str, Any]:
    return {"action_type": "TYPING", "parameters": {"text": text}}


def hotkey(*keys: str) -> dict[str, Any]:
    return {"action_type": "HOTKEY", "parameters": {"keys": list(keys)}}


def press(key: str) -> dict[str, Any]:
    return {"action_type": "PRESS", "parameters": {"key": key}}


def c13(*actions: Any) -> dict[str, Any]:
    return {"action_space": "computer_13", "actions": list(actions)}


def shell_solution(*commands: str, waits: int = 1) -> dict[str, Any]:
    """Types each command into the terminal (through the GUI), then waits."""
    return c13(*(typing(c + "\n") for c in commands), *(["WAIT"] * waits))


def vm_file(path: str) -> dict[str, Any]:
    return {"type": "vm_file", "path": path, "dest": Path(path).name}


def cloud(name: str) -> dict[str, Any]:
    return {"type": "cloud_file", "path": url(name), "dest": name}


def rule(**rules: Any) -> dict[str, Any]:
    return {"type": "rule", "rules": rules}


def command(text: str) -> dict[str, Any]:
    return {"type": "vm_command_line", "command": text, "shell": True}


def task(task_id: str, instruction: str, config: list[dict[str, Any]], evaluator: dict[str, Any],
         apps: list[str], solution: dict[str, Any]) -> None:  # fmt: skip
    document = {
        "id": task_id, "snapshot": task_id.split("-")[0], "instruction": instruction, "source": "agentinfra",
        "config": config, "trajectory": "trajectories/", "related_apps": apps, "evaluator": evaluator,
        "proxy": False, "fixed_ip": False, "possibility_of_env_change": "low", "solution": solution,
    }  # fmt: skip
    (TASKS / f"{task_id}.json").write_text(json.dumps(document, indent=2) + "\n")


def workbook(rows: list[tuple[Any, ...]]) -> Any:
    def write(path: Path) -> None:
        book = openpyxl.Workbook()
        sheet = book.active
        sheet.title = "Sheet1"
        for row in rows:
            sheet.append(row)
        book.save(path)

    return write


def docx(paragraphs: list[str], spacing: float | None = None) -> Any:
    def write(path: Path) -> None:
        document = Document()
        for text in paragraphs:
            paragraph = document.add_paragraph(text)
            if spacing is not None:
                paragraph.paragraph_format.line_spacing = spacing
        document.save(str(path))

    return write


def pptx(title: str, subtitle: str) -> Any:
    """A title slide as Impress saves it: made with python-pptx, then saved by the desktop's
    LibreOffice (``--convert-to pptx``), which writes out what python-pptx leaves to the layout
    (alignment, the master's background, run colours). OSWorld's gold decks are Impress's too."""

    def write(path: Path) -> None:
        with tempfile.TemporaryDirectory() as folder:
            made = Path(folder) / "made" / path.name
            made.parent.mkdir()
            deck = Presentation()
            slide = deck.slides.add_slide(deck.slide_layouts[0])
            slide.shapes.title.text = title
            slide.placeholders[1].text = subtitle
            deck.save(str(made))
            subprocess.run(["soffice", "--headless", f"-env:UserInstallation=file://{folder}/profile",
                            "--convert-to", "pptx", "--outdir", folder, str(made)], check=True,
                           capture_output=True, timeout=120)  # fmt: skip
            shutil.copyfile(Path(folder) / path.name, path)

    return write


COSTS = [("Item", "Cost"), ("Paper", 3), ("Ink", 12), ("Pens", 5), ("Tape", 2)]


def calc_tasks() -> None:
    xlsx = f"{H}/Desktop/costs.xlsx"
    setup = [download("costs.xlsx", xlsx), open_file(xlsx)]
    put("costs.xlsx", workbook(COSTS))
    to_b6 = [hotkey("ctrl", "Home"), press("right"), *[press("down")] * 5]

    def cell_check(coordinate: str, method: str, ref: Any) -> dict[str, Any]:
        return {"func": "compare_table", "result": vm_file(xlsx), "options": {"rules": [
            {"type": "check_cell", "sheet_idx": "RI0", "coordinate": coordinate,
             "props": {"value": {"method": method, "ref": ref}}}]}}  # fmt: skip

    save = [hotkey("ctrl", "s"), "WAIT"]
    task(
        "calc-total",
        "In costs.xlsx on the Desktop, put the total of the costs (B2:B5) in B6, then save the file.",
        setup,
        cell_check("B6", "eq", 22),
        ["libreoffice_calc"],
        c13(*to_b6, typing("=SUM(B2:B5)\n"), *save),
    )
    task(
        "calc-average",
        "In costs.xlsx, put the average cost of B2:B5 in cell B7 and save the file.",
        setup,
        cell_check("B7", "approx", 5.5),
        ["libreoffice_calc"],
        c13(*to_b6, press("down"), typing("=AVERAGE(B2:B5)\n"), *save),
    )
    task(
        "calc-max",
        "In costs.xlsx, write the largest cost of B2:B5 into D1 and save the file.",
        setup,
        cell_check("D1", "eq", 12),
        ["libreoffice_calc"],
        {
            "action_space": "pyautogui",
            "actions": [
                "pyautogui.hotkey('ctrl', 'Home')\npyautogui.press('right', presses=3)",
                "pyautogui.typewrite('=MAX(B2:B5)\\n')",
                "pyautogui.hotkey('ctrl', 's')",
                "WAIT",
            ],
        },
    )
    task(
        "calc-header",
        "In costs.xlsx, label column C by writing Total in cell C1, then save.",
        setup,
        cell_check("C1", "str_eq", "Total"),
        ["libreoffice_calc"],
        c13(hotkey("ctrl", "Home"), press("right"), press("right"), typing("Total\n"), *save),
    )
    put("costs-glue.xlsx", workbook([*COSTS, ("Glue", 4)]))
    task(
        "calc-add-row",
        "In costs.xlsx, add a new item Glue costing 4 as the next row (A6:B6) and save.",
        setup,
        {
            "func": "compare_table",
            "result": vm_file(xlsx),
            "expected": cloud("costs-glue.xlsx"),
            "options": {
                "rules": [{"type": "sheet_data", "sheet_idx0": "RI0", "sheet_idx1": "EI0"}]
            },
        },
        ["libreoffice_calc"],
        c13(*to_b6[:1], *[press("down")] * 5, typing("Glue\t4\n"), *save),
    )
    card = [("Item", "Cost"), ("Card", 3), *COSTS[2:]]
    put("costs-card.xlsx", workbook(card))
    # sheet_print compares the sheets as LibreOffice prints them, as OSWorld's tasks do: the
    # postconfig prints the result beside it, and the gold's print lies beside the gold.
    put_text("costs-card.csv", "".join(f"{item},{cost}\n" for item, cost in card))
    printed = f"{H}/Desktop/costs-Sheet1.csv"
    task(
        "calc-rename-item",
        "In costs.xlsx, the item Paper is now called Card: change A2 and save the file.",
        setup,
        {
            "postconfig": [{"type": "execute", "parameters": {"command": [
                "libreoffice", "--convert-to",
                "csv:Text - txt - csv (StarCalc):44,34,UTF-8,,,,false,true,true,false,false,1",
                "--outdir", f"{H}/Desktop", xlsx]}}],  # fmt: skip
            "func": "compare_table",
            "result": {"type": "vm_file", "path": [xlsx, printed], "dest": ["costs.xlsx", "costs-Sheet1.csv"],
                       "multi": True},  # fmt: skip
            "expected": {"type": "cloud_file", "path": [url("costs-card.xlsx"), url("costs-card.csv")],
                         "dest": ["costs-card.xlsx", "costs-card-Sheet1.csv"], "multi": True},  # fmt: skip
            "options": {
                "rules": [{"type": "sheet_print", "sheet_idx0": "RI0", "sheet_idx1": "EI0"}]
            },
        },
        ["libreoffice_calc"],
        c13(hotkey("ctrl", "Home"), press("down"), typing("Card\n"), *save),
    )
    put("costs-note.xlsx", workbook([*COSTS, (None, None), ("checked by finance",)]))
    task(
        "calc-note",
        "In costs.xlsx, write the note 'checked by finance' in cell A7 and save.",
        setup,
        {
            "func": "compare_table",
            "result": vm_file(xlsx),
            "expected": cloud("costs-note.xlsx"),
            "options": {
                "rules": [
                    {
                        "type": "sheet_fuzzy",
                        "sheet_idx0": "RI0",
                        "sheet_idx1": "EI0",
                        "rules": [
                            {
                                "range": ["A7:A7"],
                                "type": "fuzzy_match",
                                "threshold": 90,
                                "ignore_case": True,
                            }
                        ],
                    }
                ]
            },
        },
        ["libreoffice_calc"],
        c13(hotkey("ctrl", "Home"), *[press("down")] * 6, typing("Checked by finance\n"), *save),
    )


def writer_tasks() -> None:
    path = f"{H}/Documents/notes.docx"
    setup = [download("notes.docx", path), open_file(path)]
    base = ["First paragraph.", "Second paragraph."]
    put("notes.docx", docx(base))
    save = [hotkey("ctrl", "s"), "WAIT"]
    put("notes-third.docx", docx([*base, "Third paragraph."]))
    task(
        "writer-append",
        "In notes.docx, add a third paragraph that reads 'Third paragraph.' and save the file.",
        setup,
        {
            "func": "compare_docx_files",
            "result": vm_file(path),
            "expected": cloud("notes-third.docx"),
        },
        ["libreoffice_writer"],
        c13(hotkey("ctrl", "End"), press("enter"), typing("Third paragraph."), *save),
    )
    put("notes-title.docx", docx(["Report", *base]))
    task(
        "writer-title",
        "In notes.docx, insert a first paragraph 'Report' above the existing text and save.",
        setup,
        {
            "func": "compare_docx_files",
            "result": vm_file(path),
            "expected": cloud("notes-title.docx"),
        },
        ["libreoffice_writer"],
        {
            "action_space": "computer_use",
            "actions": [
                {"action": "key", "text": "ctrl+Home"},
                {"action": "type", "text": "Report\n"},
                {"action": "key", "text": "ctrl+s"},
                {"action": "wait", "duration": 2},
            ],
        },
    )
    put("notes-more.docx", docx(["First paragraph.", "Second paragraph, extended."]))
    task(
        "writer-extend",
        "In notes.docx, change the second paragraph to 'Second paragraph, extended.' and save.",
        setup,
        {
            "func": "compare_docx_files",
            "result": vm_file(path),
            "expected": cloud("notes-more.docx"),
            "options": {"ignore_blanks": True},
        },
        ["libreoffice_writer"],
        c13(hotkey("ctrl", "End"), press("backspace"), typing(", extended."), *save),
    )
    letter = f"{H}/Desktop/letter.docx"
    put("letter.docx", docx(["Dear reader,", "This letter becomes a PDF.", "Regards"]))

    def gold_pdf(target: Path) -> None:
        with tempfile.TemporaryDirectory() as folder:
            source = Path(folder) / "letter.docx"
            shutil.copyfile(mirror_path(MIRROR, url("letter.docx")), source)
            subprocess.run(["soffice", "--headless", f"-env:UserInstallation=file://{folder}/profile",
                            "--convert-to", "pdf", "--outdir", folder, str(source)], check=True,
                           capture_output=True, timeout=120)  # fmt: skip
            shutil.copyfile(Path(folder) / "letter.pdf", target)

    put("letter.pdf", gold_pdf)
    task(
        "os-docx-to-pdf",
        "Convert letter.docx on the Desktop to a PDF named letter.pdf in the same folder.",
        [download("letter.docx", letter), XTERM],
        {
            "func": "compare_pdfs",
            "result": vm_file(f"{H}/Desktop/letter.pdf"),
            "expected": cloud("letter.pdf"),
        },
        ["terminal", "libreoffice_writer"],
        shell_solution("cd ~/Desktop && soffice --headless --convert-to pdf letter.docx", waits=5),
    )


def impress_tasks() -> None:
    path = f"{H}/Desktop/deck.pptx"
    # Impress takes input a while after its window maps (slower under load): OSWorld's tasks sleep here too.
    setup = [
        download("deck.pptx", path),
        open_file(path),
        {"type": "sleep", "parameters": {"seconds": 2}},
    ]
    put("deck.pptx", pptx("Old title", "Draft"))
    put("deck-title.pptx", pptx("Quarterly Results", "Draft"))
    loose = {"examine_shape": False, "examine_font_name": False, "examine_font_size": False,
             "examine_font_bold": False, "examine_font_italic": False, "examine_font_underline": False}  # fmt: skip
    save = [hotkey("ctrl", "s"), "WAIT"]
    # Impress needs a moment between selecting an object and editing it (a key sent at once was lost
    # about one time in five under load): the solutions wait there, as a person would.
    edit_first = [press("tab"), "WAIT", press("enter"), hotkey("ctrl", "a")]
    task(
        "impress-title",
        "In deck.pptx, change the slide's title to 'Quarterly Results' and save the file.",
        setup,
        {
            "func": "compare_pptx_files",
            "result": vm_file(path),
            "expected": cloud("deck-title.pptx"),
            "options": loose,
        },
        ["libreoffice_impress"],
        c13(*edit_first, typing("Quarterly Results"), press("esc"), press("esc"), *save),
    )
    put("deck-final.pptx", pptx("Old title", "Final"))
    task(
        "impress-subtitle",
        "In deck.pptx, change the subtitle from 'Draft' to 'Final' and save the file.",
        setup,
        {
            "func": "compare_pptx_files",
            "result": vm_file(path),
            "expected": cloud("deck-final.pptx"),
            "options": loose,
        },
        ["libreoffice_impress"],
        c13(
            press("tab"),
            press("tab"),
            "WAIT",
            press("enter"),
            hotkey("ctrl", "a"),
            typing("Final"),
            press("esc"),
            press("esc"),
            *save,
        ),
    )
    task(
        "impress-infeasible-video",
        "In deck.pptx, embed the live YouTube stream of today's keynote on the slide.",
        setup,
        {"func": "infeasible"},
        ["libreoffice_impress"],
        c13("FAIL"),
    )


def terminal_tasks() -> None:
    task(
        "os-mkdir",
        "Create a folder named Projects inside the Documents folder of your home.",
        [XTERM],
        {
            "func": "exact_match",
            "result": command("test -d /home/user/Documents/Projects && echo yes || echo no"),
            "expected": rule(expected="yes"),
        },
        ["terminal"],
        shell_solution("mkdir ~/Documents/Projects"),
    )
    put_text("hello.txt", "hello world\n")
    task(
        "os-write-file",
        "Create the file hello.txt on the Desktop containing the single line: hello world",
        [XTERM],
        {
            "func": "compare_text_file",
            "result": vm_file(f"{H}/Desktop/hello.txt"),
            "expected": cloud("hello.txt"),
        },
        ["terminal"],
        shell_solution("echo 'hello world' > ~/Desktop/hello.txt"),
    )
    names = ["delta", "alpha", "charlie", "bravo", "echo"]
    put_text("names.txt", "\n".join(names) + "\n")
    put_text("names-sorted.txt", "\n".join(sorted(names)) + "\n")
    task(
        "os-sort",
        "Sort the lines of names.txt in Documents alphabetically into a new file sorted.txt there.",
        [download("names.txt", f"{H}/Documents/names.txt"), XTERM],
        {
            "func": "compare_text_file",
            "result": vm_file(f"{H}/Documents/sorted.txt"),
            "expected": cloud("names-sorted.txt"),
        },
        ["terminal"],
        shell_solution("sort ~/Documents/names.txt > ~/Documents/sorted.txt"),
    )
    log = [("INFO" if i % 3 else "ERROR") + f" event {i}" for i in range(42)]
    put_text("app.log", "\n".join(log) + "\n")
    task(
        "os-count-lines",
        "Write the number of lines in Documents/app.log (just the number) into Documents/count.txt.",
        [download("app.log", f"{H}/Documents/app.log"), XTERM],
        {
            "func": "exact_match",
            "result": vm_file(f"{H}/Documents/count.txt"),
            "expected": rule(expected="42"),
        },
        ["terminal"],
        shell_solution("wc -l < ~/Documents/app.log > ~/Documents/count.txt"),
    )
    task(
        "os-errors",
        "Put only the ERROR lines of Documents/app.log into Documents/errors.txt.",
        [download("app.log", f"{H}/Documents/app.log"), XTERM],
        {
            "func": "check_list",
            "result": vm_file(f"{H}/Documents/errors.txt"),
            "expected": rule(expect=["^ERROR event 0$", "^ERROR event 39$"], unexpect=["^INFO"]),
        },
        ["terminal"],
        shell_solution("grep ^ERROR ~/Documents/app.log > ~/Documents/errors.txt"),
    )
    put_text("backup.sh", "#!/bin/sh\necho backing up\n")
    task(
        "os-chmod",
        "Make backup.sh in your home executable by its owner (mode 755).",
        [download("backup.sh", f"{H}/backup.sh"), XTERM],
        {
            "func": "exact_match",
            "result": command("stat -c %a /home/user/backup.sh"),
            "expected": rule(expected="755"),
        },
        ["terminal"],
        shell_solution("chmod 755 ~/backup.sh"),
    )
    put_text("settings.json", json.dumps({"theme": "light", "font_size": 12}) + "\n")
    task(
        "os-json-setting",
        'In ~/.config/app/settings.json, set theme to "dark" and leave font_size at 12.',
        [download("settings.json", f"{H}/.config/app/settings.json"), XTERM],
        {
            "func": "check_direct_json_object",
            "result": vm_file(f"{H}/.config/app/settings.json"),
            "expected": rule(expected={"theme": "dark", "font_size": 12}),
        },
        ["terminal"],
        shell_solution('sed -i \'s/"light"/"dark"/\' ~/.config/app/settings.json'),
    )
    put_text("sales.csv", "region;units\nnorth;10\nsouth;7\n")
    put_text("sales-comma.csv", "region,units\nnorth,10\nsouth,7\n")
    task(
        "os-csv-commas",
        "Documents/sales.csv uses semicolons; make it comma-separated in place.",
        [download("sales.csv", f"{H}/Documents/sales.csv"), XTERM],
        {
            "func": "compare_csv",
            "result": vm_file(f"{H}/Documents/sales.csv"),
            "expected": cloud("sales-comma.csv"),
        },
        ["terminal"],
        shell_solution("sed -i 's/;/,/g' ~/Documents/sales.csv"),
    )
    put_text("report-draft.txt", "quarterly report\n")
    task(
        "os-rename",
        "Rename Documents/report-draft.txt to report-final.txt.",
        [download("report-draft.txt", f"{H}/Documents/report-draft.txt"), XTERM],
        {
            "func": "check_include_exclude",
            "result": command("ls /home/user/Documents"),
            "expected": rule(include=["report-final.txt"], exclude=["report-draft.txt"]),
        },
        ["terminal"],
        shell_solution("mv ~/Documents/report-draft.txt ~/Documents/report-final.txt"),
    )

    # OSWorld's thunderbird/a10b69e1 and 15c3b339 shape: postconfig steps whose stdout a cache_file
    # getter reads (checks: they run in the probe, on the snapshot), with check_list and check_csv
    listing = {"type": "command", "parameters": {"command": ["ls", "-R", f"{H}/Mail"], "stdout": "mail.ls"}}
    index = {"type": "command", "parameters": {"command": ["cat", f"{H}/Mail/folders.csv"], "stdout": "folders.csv"}}
    folders = [{"name": "Work", "purpose": "job"}, {"name": "Home", "purpose": "family"}]
    task(
        "os-mail-folders",
        "In a new folder Mail in your home, make the folders Work and Home, and write Mail/folders.csv with "
        "the header name,purpose and one row for each folder: Work is for job, Home is for family.",
        [XTERM],
        {
            "postconfig": [listing, index],
            "func": ["check_list", "check_csv"],
            "result": [{"type": "cache_file", "path": "mail.ls"}, {"type": "cache_file", "path": "folders.csv"}],
            "expected": [rule(expect=["^Work$", "^Home$"]), rule(expect=folders)],
        },
        ["terminal"],
        shell_solution(
            "mkdir -p ~/Mail/Work ~/Mail/Home",
            "printf 'name,purpose\\nWork,job\\nHome,family\\n' > ~/Mail/folders.csv",
        ),
    )

    # OSWorld's os/4d117223 shape: a checker downloaded in postconfig to a relative path (the home),
    # made executable by a postconfig chmod (applied to the snapshot with it), run by the check
    put_text(
        "eval-backups.sh",
        "#!/bin/bash\n# every .txt under notes has a .bak copy beside it, with the same contents\n"
        "ok=1\nfor f in notes/*.txt; do\n  cmp -s \"$f\" \"${f%.txt}.bak\" || { echo \"missing: $f\"; ok=0; }\ndone\n"
        "[ \"$ok\" = 1 ] && echo 'Success: every note is backed up.'\n",
    )
    put_text("note-a.txt", "buy milk\n")
    put_text("note-b.txt", "call the bank\n")
    task(
        "os-backup-notes",
        "Make a backup copy of each .txt file in the notes folder of your home, beside it, with the same name "
        "ending in .bak instead of .txt.",
        [download("note-a.txt", f"{H}/notes/a.txt"), download("note-b.txt", f"{H}/notes/b.txt"), XTERM],
        {
            "postconfig": [download("eval-backups.sh", "eval.sh"),
                           {"type": "execute", "parameters": {"command": "chmod +x eval.sh", "shell": True}}],
            "func": "check_include_exclude",
            "result": command("./eval.sh"),
            "expected": rule(include=["Success: every note is backed up."], exclude=["missing"]),
        },
        ["terminal"],
        shell_solution("cd ~/notes && for f in *.txt; do cp \"$f\" \"${f%.txt}.bak\"; done"),
    )

    def photo(path: Path, rotate: bool = False) -> None:
        image = Image.new("RGB", (64, 48), (240, 240, 240))
        ImageDraw.Draw(image).rectangle((4, 4, 30, 20), fill=(200, 30, 30))
        (image.rotate(180) if rotate else image).save(path, format="PNG")

    put("photo.png", photo)
    put("photo-rotated.png", lambda p: photo(p, rotate=True))
    task(
        "os-rotate-image",
        "Rotate Pictures/photo.png by 180 degrees and save it as Pictures/rotated.png.",
        [download("photo.png", f"{H}/Pictures/photo.png"), XTERM],
        {
            "func": "compare_images",
            "result": vm_file(f"{H}/Pictures/rotated.png"),
            "expected": cloud("photo-rotated.png"),
        },
        ["terminal"],
        shell_solution(
            "python3 -c \"from PIL import Image; Image.open('/home/user/Pictures/photo.png')"
            ".rotate(180).save('/home/user/Pictures/rotated.png')\"",
            waits=2,
        ),
    )
    task(
        "os-infeasible-photoshop",
        "Open photo.png in Adobe Photoshop and apply its Neural Filters.",
        [download("photo.png", f"{H}/Pictures/photo.png"), XTERM],
        {"func": "infeasible"},
        ["terminal"],
        c13("FAIL"),
    )


def editor_tasks() -> None:
    path = f"{H}/Documents/todo.txt"
    setup = [download("todo.txt", path), open_file(path)]
    put_text("todo.txt", "- write report\n")
    put_text("todo-milk.txt", "- write report\n- buy milk\n")
    task(
        "editor-append",
        "In the open todo.txt, add a line '- buy milk' after the existing one and save.",
        setup,
        {"func": "compare_text_file", "result": vm_file(path), "expected": cloud("todo-milk.txt")},
        ["mousepad"],
        c13(hotkey("ctrl", "End"), typing("- buy milk\n"), hotkey("ctrl", "s"), "WAIT"),
    )
    put_text("todo-done.txt", "nothing left to do\n")
    task(
        "editor-replace",
        "Replace the whole content of todo.txt with the single line 'nothing left to do' and save.",
        setup,
        {
            "func": "compare_text_file",
            "result": vm_file(path),
            "expected": cloud("todo-done.txt"),
            "options": {"ignore_blanks": True},
        },
        ["mousepad"],
        {
            "action_space": "computer_use",
            "actions": [
                {"action": "key", "text": "ctrl+a"},
                {"action": "type", "text": "nothing left to do\n"},
                {"action": "key", "text": "ctrl+s"},
                {"action": "wait", "duration": 2},
            ],
        },
    )


def main() -> None:
    shutil.rmtree(TASKS, ignore_errors=True)
    shutil.rmtree(MIRROR, ignore_errors=True)
    TASKS.mkdir(parents=True)
    MIRROR.mkdir(parents=True)
    calc_tasks()
    writer_tasks()
    impress_tasks()
    terminal_tasks()
    editor_tasks()
    print(
        f"{len(list(TASKS.glob('*.json')))} tasks in {TASKS}, {len(list(MIRROR.iterdir()))} files in {MIRROR}"
    )


if __name__ == "__main__":
    main()

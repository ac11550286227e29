"""Our Chrome profile getters and checks against desktop-env 1.0.2's own, on the same profiles (issue 32).

    make osworld-evals-venv
    .venv/bin/python benchmarks/desktop/osworld_chrome_differential.py \
        [--osworld OSWORLD_DIR] [--profile DIR] [--out results/osworld_chrome_differential.jsonl]

Profiles: a real one (``--profile``: a ``~/.config/google-chrome`` folder, say from an episode's
snapshot; else one this machine's Chromium makes, headless, in a temporary folder), and variants
of it, each setting what a Chrome task asks for (Do Not Track, Bing, a font size, a profile name,
the startup page, experiments, an unpacked extension, bookmark folders and URLs), or breaking a
file (JSON cut short, an empty bookmarks file, no profile at all).

On each profile, both sides compute every profile getter (its value compared as JSON) and, with
``--osworld``, every supported task of ``test_all.json`` whose result is a profile getter (the
task's check with its rule; the score compared). Both sides run in jails (ours one per profile,
since our getters read the one home; OSWorld's with a stand-in controller that reads the files).
A getter agrees when both values are equal or both sides raise; a check when the scores are equal
(an exception counts as 0).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from osworld_differential import EVALUATE, OSWORLD_VENV, RUNNER, _jailed, _osworld_paths

from agentinfra.environments.desktop._evaluate import CHROME_GETTERS
from agentinfra.environments.desktop._grading import GRADER_DISTRIBUTIONS
from agentinfra.environments.desktop._task import load_desktop_task, selected_task_files, support
from agentinfra.sandbox import python_runtime_paths

CHROMIUM = Path("/usr/lib/chromium/chromium")
MODULES = {"match_in_list": "general", "is_in_list": "general", "exact_match": "general",
           "is_expected_bookmarks": "chrome", "check_enabled_experiments": "chrome",
           "check_font_size": "chrome", "is_expected_installed_extensions": "chrome"}  # fmt: skip


def real_profile(folder: Path) -> Path:
    """A profile this machine's Chromium wrote (headless, on about:blank; our own binary and page)."""
    target = folder / "chromium"
    subprocess.run([str(CHROMIUM), "--headless=new", "--no-sandbox", f"--user-data-dir={target}",
                    "--no-first-run", "--dump-dom", "about:blank"],
                   capture_output=True, timeout=60, check=True)  # fmt: skip
    return target


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else {}


def profiles(real: Path, folder: Path) -> dict[str, Path]:
    """name -> a ``.config/google-chrome`` folder: the real one and its variants."""
    made: dict[str, Path] = {}

    def variant(name: str, change: Any) -> None:
        target = folder / name / ".config" / "google-chrome"
        shutil.copytree(real, target, symlinks=True, ignore=shutil.ignore_patterns("Singleton*"))
        (target / "Default").mkdir(exist_ok=True)
        change(target)
        made[name] = target

    def prefs(edit: Any) -> Any:
        def change(root: Path) -> None:
            data = _json(root / "Default" / "Preferences")
            edit(data)
            (root / "Default" / "Preferences").write_text(json.dumps(data))

        return change

    def local_state(edit: Any) -> Any:
        def change(root: Path) -> None:
            data = _json(root / "Local State")
            edit(data)
            (root / "Local State").write_text(json.dumps(data))

        return change

    def bookmarks(children: list[dict[str, Any]]) -> Any:
        def change(root: Path) -> None:
            (root / "Default" / "Bookmarks").write_text(json.dumps({"roots": {
                "bookmark_bar": {"children": children, "type": "folder", "name": "Bookmarks bar"},
                "other": {"children": [], "type": "folder"}}}))  # fmt: skip

        return change

    variant("real", lambda root: None)
    variant("do not track", prefs(lambda d: d.update(enable_do_not_track=True)))
    variant("bing", prefs(lambda d: d.setdefault("default_search_provider_data", {})
                          .setdefault("template_url_data", {}).update(short_name="Bing")))  # fmt: skip
    variant("font 20", prefs(lambda d: d.setdefault("webkit", {}).setdefault("webprefs", {})
                             .update(default_font_size=20)))  # fmt: skip
    variant(
        "webprefs without a default size",
        prefs(lambda d: d.setdefault("webkit", {}).update(webprefs={"minimum_font_size": 9})),
    )
    variant("profile Thomas", prefs(lambda d: d.setdefault("profile", {}).update(name="Thomas")))
    variant("restore 5", prefs(lambda d: d.update(session={"restore_on_startup": 5})))
    variant("restore 4", prefs(lambda d: d.update(session={"restore_on_startup": 4})))
    variant(
        "enhanced safe browsing",
        prefs(lambda d: d.setdefault("safebrowsing", {}).update(enhanced=True)),
    )
    variant("unpacked extension", prefs(lambda d: d.setdefault("extensions", {}).setdefault("settings", {})
                                        .update(x={"path": "/home/user/Desktop/helloExtension",
                                                   "manifest": {"name": "Hello Extensions"}})))  # fmt: skip
    variant("content settings removed", prefs(lambda d: d.get("profile", {}).pop(
        "default_content_setting_values", None)))  # fmt: skip
    variant("experiments", local_state(lambda d: d.setdefault("browser", {}).update(
        enabled_labs_experiments=["calculator@1", "smooth-scrolling@2"])))  # fmt: skip
    variant("locale", local_state(lambda d: d.setdefault("intl", {}).update(app_locale="xx")))
    variant("bookmark folder", bookmarks([{"type": "folder", "name": "Favorites", "children": []}]))
    variant("bookmark urls", bookmarks([{"type": "url", "name": "a", "url": "https://a.example/"}]))
    variant("liked authors", bookmarks([{"type": "folder", "name": "Liked Authors", "children": [
        {"type": "url", "url": "https://jmlr.org/"}]}]))  # fmt: skip
    variant(
        "preferences cut short",
        lambda root: (root / "Default" / "Preferences").write_text('{"a": '),
    )
    variant("bookmarks empty", lambda root: (root / "Default" / "Bookmarks").write_text(""))
    variant("bookmarks cut short", lambda root: (root / "Default" / "Bookmarks").write_text("{"))
    empty = folder / "no profile" / ".config" / "google-chrome"
    empty.mkdir(parents=True)
    made["no profile"] = empty
    return made


def chrome_tasks(osworld: Path | None) -> list[dict[str, Any]]:
    """The supported real tasks whose one check reads a profile getter, with its rule."""
    if osworld is None:
        return []
    found = []
    for path in selected_task_files(osworld, osworld / "evaluation_examples" / "test_all.json"):
        task = load_desktop_task(path)
        verdict = support(task, None)  # no mirror: a task refused only for its files counts
        if not verdict.supported and "not in the mirror" not in verdict.reason:
            continue
        for func, result, expected, options in zip(task.funcs, task.specs("result"), task.specs("expected"),
                                                   task.specs("options"), strict=True):  # fmt: skip
            if result and result["type"] in CHROME_GETTERS and func in MODULES:
                found.append({"task": task.id, "func": func, "getter": result["type"],
                              "rule": (expected or {}).get("rules"), "options": options or {}})  # fmt: skip
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--osworld", type=Path, help="an OSWorld checkout (its Chrome tasks' checks)"
    )
    parser.add_argument("--profile", type=Path, help="a real ~/.config/google-chrome folder")
    parser.add_argument(
        "--out", type=Path, default=Path("results/osworld_chrome_differential.jsonl")
    )
    args = parser.parse_args()
    if not (OSWORLD_VENV / ".installed").is_file():
        raise SystemExit("OSWorld's functions are not installed: make osworld-evals-venv")
    tasks = chrome_tasks(args.osworld)
    getters = sorted(CHROME_GETTERS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="agentinfra-chrome-differential-") as scratch:
        folder = Path(scratch)
        real = args.profile or real_profile(folder)
        made = profiles(real, folder / "profiles")
        theirs_home = folder / "theirs"
        theirs_home.mkdir()
        asked: list[dict[str, Any]] = []
        for index, (name, root) in enumerate(made.items()):
            shutil.copytree(
                root, theirs_home / str(index) / ".config" / "google-chrome", symlinks=True
            )
            home = f"/home/user/{index}"
            asked += [{"profile": name, "getter": g, "home": home, "func": None} for g in getters]
            asked += [{"profile": name, "getter": t["getter"], "home": home, "func": t["func"], "task": t["task"],
                       "module": MODULES[t["func"]], "expected": t["rule"], "has_expected": True,
                       "options": t["options"]} for t in tasks]  # fmt: skip
        empty = folder / "empty"
        empty.mkdir()
        theirs = _jailed((str(OSWORLD_VENV / "bin" / "python"), "-I", "/tmp/work/runner.py"), _osworld_paths(),
                         ((str(RUNNER), "runner.py"),), theirs_home, empty, asked)  # fmt: skip
        ours: list[Any] = []
        for name, root in made.items():  # our getters read the one home: a jail per profile
            home = folder / "ours" / name
            shutil.copytree(root.parents[1], home, symlinks=True)
            here = [a for a in asked if a["profile"] == name]
            request = {"funcs": [a["func"] or "exact_match" for a in here],
                       "results": [{"kind": "chrome", "getter": a["getter"]} for a in here],
                       "expected": [{"kind": "value", "value": a.get("expected") or {"expected": None}}
                                    for a in here], "options": [a.get("options") or {} for a in here],
                       "values": True}  # fmt: skip
            reply = _jailed((sys.executable, "-I", "/tmp/work/evaluate.py"),
                            python_runtime_paths(GRADER_DISTRIBUTIONS), ((str(EVALUATE), "evaluate.py"),),
                            home, empty, request)  # fmt: skip
            ours += [
                {"value": v, "score": s, "error": e}
                for v, s, e in zip(reply["values"], reply["scores"], reply["errors"], strict=True)
            ]
    for a, mine, their in zip(asked, ours, theirs, strict=True):
        if a["func"] is None:
            both_raise = bool(mine["error"]) and "error" in their  # a broken file, on both sides
            agree = both_raise or ("error" not in their and mine["value"] == their.get("value"))
            row = {"profile": a["profile"], "getter": a["getter"], "ours": mine["value"],
                   "osworld": their.get("value", their.get("error")), "agree": agree}  # fmt: skip
        else:
            ours_score = 0.0 if mine["error"] else mine["score"]
            their_score = their.get("score") or 0.0
            row = {"profile": a["profile"], "task": a["task"], "func": a["func"], "getter": a["getter"],
                   "ours": ours_score, "ours_error": mine["error"], "osworld": their.get("score"),
                   "osworld_error": their.get("error", ""), "agree": abs(ours_score - their_score) < 1e-6}  # fmt: skip
        rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    agree = sum(r["agree"] for r in rows)
    kinds = Counter(("getter" if "task" not in r else "task check", r["agree"]) for r in rows)
    print(json.dumps({"profiles": len(made), "tasks": len(tasks), "comparisons": len(rows), "agree": agree,
                      "by_kind": {f"{k} {'agree' if a else 'disagree'}": n for (k, a), n in sorted(kinds.items())},
                      "scored_1": sum(1 for r in rows if "task" in r and r["osworld"] == 1.0)}, indent=1))  # fmt: skip
    for r in rows:
        if not r["agree"]:
            print("DISAGREE", json.dumps(r, default=str)[:400])


if __name__ == "__main__":
    main()

"""Runs OSWorld's own metric functions (desktop-env 1.0.2) on triples, inside a jail.

Copied into the jail by `osworld_differential.py` and started with the
``.venv/osworld-evals`` interpreter. Reads ``[{"module", "func", "result", "expected",
"options"}]`` on stdin and writes ``[{"score"} | {"error"}]`` on stdout; a triple with a
``getter`` (and its ``home``) runs desktop-env's Chrome profile getter first, and answers
``{"value"}`` when it names no ``func``. Each metric module
is loaded from its file with the ``desktop_env`` packages stood up empty, so that the
package's ``__init__`` (which imports every metric module, easyocr and torch among their
dependencies) does not run; ``easyocr`` is a module that fails on use, since the metrics
compared here never call it. Whatever the functions print goes to stderr.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import sys
import types


class _Absent(types.ModuleType):
    """A module not installed here whose names are only imported, never used by what is compared
    (bs4, PyMuPDF, borb and imagehash in the Chrome metrics; playwright and pydrive in its getters)."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


def _stand_up_packages() -> str:
    spec = importlib.util.find_spec("desktop_env")
    assert spec is not None
    assert spec.submodule_search_locations
    root = next(iter(spec.submodule_search_locations))
    for name, folder in (("desktop_env", root), ("desktop_env.evaluators", f"{root}/evaluators"),
                         ("desktop_env.evaluators.metrics", f"{root}/evaluators/metrics"),
                         ("desktop_env.evaluators.getters", f"{root}/evaluators/getters")):  # fmt: skip
        package = types.ModuleType(name)
        package.__path__ = [folder]
        sys.modules[name] = package
    sys.modules["easyocr"] = types.ModuleType(
        "easyocr"
    )  # used by OCR metrics only, not compared here
    absent = {top for top in ("bs4", "fitz", "borb", "imagehash", "playwright", "pydrive")
              if importlib.util.find_spec(top) is None}  # fmt: skip
    for name in ("bs4", "fitz", "borb", "borb.pdf", "imagehash", "playwright",
                 "playwright.sync_api", "pydrive", "pydrive.auth", "pydrive.drive"):  # fmt: skip
        if name.split(".")[0] in absent:
            sys.modules[name] = _Absent(name)
    return f"{root}/evaluators/metrics"


class _Controller:
    """What desktop-env's profile getters ask of the VM's controller, answered from the jail's
    files: the path their Python prints (with ``HOME`` the triple's home), a file's bytes or None."""

    def execute_python_command(self, command: str) -> dict[str, str]:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(command, {})  # desktop-env's own one-line path computations
        return {"output": printed.getvalue()}

    def get_file(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except OSError:
            return None


def _get(folder: str, triple: dict[str, object]) -> object:
    """desktop-env's getter ``get_<name>`` on a stand-in environment whose home is the triple's."""
    os.environ["HOME"] = str(triple["home"])
    getters = _load(folder.replace("/metrics", "/getters"), "chrome", "getters")
    env = types.SimpleNamespace(
        vm_platform="Linux", controller=_Controller(), cache_dir="/tmp/work"
    )
    return getattr(getters, f"get_{triple['getter']}")(env, {})


def _load(folder: str, module: str, kind: str = "metrics") -> types.ModuleType:
    name = f"desktop_env.evaluators.{kind}.{module}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(folder, f"{module}.py"))
        assert spec is not None
        assert spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded
        spec.loader.exec_module(loaded)
    return sys.modules[name]


def main() -> None:
    triples = json.loads(sys.stdin.read())
    out = sys.stdout
    replies = []
    with contextlib.redirect_stdout(sys.stderr):
        folder = _stand_up_packages()
        for triple in triples:
            try:
                if triple.get("getter"):  # a profile getter, then its check when one is named
                    value = _get(folder, triple)
                    if not triple.get("func"):
                        replies.append({"value": json.loads(json.dumps(value))})
                        continue
                    triple = {**triple, "result": value}
                function = getattr(_load(folder, triple["module"]), triple["func"])
                options = triple["options"] or {}
                if triple.get(
                    "has_expected", True
                ):  # as desktop-env calls a metric with no expected getter
                    score = function(triple["result"], triple["expected"], **options)
                else:
                    score = function(triple["result"], **options)
                replies.append({"score": float(score) if score is not None else None})
            except BaseException as exc:  # OSWorld's function failed: that is its answer
                replies.append({"error": f"{type(exc).__name__}: {exc}"[:500]})
    out.write(json.dumps(replies))


if __name__ == "__main__":
    main()

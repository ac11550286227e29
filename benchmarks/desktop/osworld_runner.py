"""Runs OSWorld's own metric functions (desktop-env 1.0.2) on triples, inside a jail.

Copied into the jail by `osworld_differential.py` and started with the
``.venv/osworld-evals`` interpreter. Reads ``[{"module", "func", "result", "expected",
"options"}]`` on stdin and writes ``[{"score"} | {"error"}]`` on stdout. Each metric module
is loaded from its file with the ``desktop_env`` packages stood up empty, so that the
package's ``__init__`` (which imports every metric module, easyocr and torch among their
dependencies) does not run; ``easyocr`` is a module that fails on use, since the metrics
compared here never call it. Whatever the functions print goes to stderr.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import types


def _stand_up_packages() -> str:
    spec = importlib.util.find_spec("desktop_env")
    assert spec is not None
    assert spec.submodule_search_locations
    root = next(iter(spec.submodule_search_locations))
    for name, folder in (("desktop_env", root), ("desktop_env.evaluators", f"{root}/evaluators"),
                         ("desktop_env.evaluators.metrics", f"{root}/evaluators/metrics")):  # fmt: skip
        package = types.ModuleType(name)
        package.__path__ = [folder]
        sys.modules[name] = package
    sys.modules["easyocr"] = types.ModuleType(
        "easyocr"
    )  # used by OCR metrics only, not compared here
    return f"{root}/evaluators/metrics"


def _load(folder: str, module: str) -> types.ModuleType:
    name = f"desktop_env.evaluators.metrics.{module}"
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

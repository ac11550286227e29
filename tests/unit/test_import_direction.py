"""Walks every import in src/ and fails on one that points the wrong way.

The allowed direction (docs/architecture.md): shared modules (the package root,
`errors`, `_settings`) import no component; `kvcache` and `agent` import only shared
modules; `sandbox` imports none, and of the shared modules only `errors` (its
exception tree); `engines` may use `kvcache`; `environments` may use `agent` and
`sandbox`; `harness` uses `environments` and `agent`; `rollouts` uses `harness` and what it uses;
`trainers` uses `rollouts` and what it uses;
`cli` uses everything.
Nothing in src/ but `cli` imports `engines`.

One module lives in another component's folder: `agentinfra.kvcache.vllm`, the old
``kv_connector_module_path`` of the vLLM connector, is a one-line alias of
`agentinfra.engines.vllm` and counts as part of `engines` (`RELOCATED`).

Two more rules: a private module (``_name``) is imported only from inside its
own package (others use the package's public names), and `harness` never
imports a particular environment (it reaches them by name through the registry).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "agentinfra"
SHARED = "<shared>"
ALLOWED: dict[str, set[str]] = {
    SHARED: set(),
    "kvcache": set(),
    "agent": set(),
    "sandbox": set(),
    "environments": {"agent", "sandbox"},
    "harness": {"environments", "agent", "sandbox"},
    "rollouts": {"harness", "environments", "agent", "sandbox"},
    "trainers": {"rollouts", "harness", "environments", "agent", "sandbox"},
    "engines": {"kvcache"},
    "cli": {
        "kvcache",
        "engines",
        "agent",
        "environments",
        "harness",
        "rollouts",
        "trainers",
        "sandbox",
    },
}
RELOCATED = {"agentinfra.kvcache.vllm": "agentinfra.engines.vllm"}
"""Modules kept at an old path for compatibility -> the module they alias (its component is theirs)."""


def _component(module: str) -> str:
    parts = module.split(".")
    if module == "agentinfra.__main__":
        return "cli"
    if module in RELOCATED:
        return RELOCATED[module].split(".")[1]
    if len(parts) >= 2 and parts[1] in ALLOWED:
        return parts[1]
    return SHARED


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, text: str | None = None) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
    here = _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((node.lineno, target))
    return [(line, name) for line, name in found if name.split(".")[0] == "agentinfra"]


def test_every_component_is_known() -> None:
    for child in SRC.iterdir():
        if child.is_dir() and (child / "__init__.py").exists():
            assert child.name in ALLOWED, (
                f"new component {child.name}: add it to ALLOWED and the docs"
            )


def test_imports_point_one_way() -> None:
    wrong: list[str] = []
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 5
    for path in files:
        source = _component(_module_name(path))
        for line, target in _imports(path):
            dest = _component(target)
            if dest not in (source, SHARED) and dest not in ALLOWED[source]:
                wrong.append(f"{path.relative_to(SRC)}:{line} {source} -> {target}")
    assert not wrong, "wrong-way imports:\n" + "\n".join(wrong)


def test_a_relocated_module_only_aliases_its_new_home() -> None:
    for old, new in RELOCATED.items():
        path = SRC.parent / (old.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text())
        statements = [node for node in tree.body if not isinstance(node, ast.Expr)]  # the docstring
        assert len(statements) == 1, f"{old} must be one import of {new}"
        assert [name for _, name in _imports(path)] == [new]


def test_only_cli_imports_engines() -> None:
    users = sorted(source for source, allowed in ALLOWED.items() if "engines" in allowed)
    assert users == ["cli"]


def test_walker_resolves_relative_imports() -> None:
    source = "from ..harness import x\nfrom . import _y\nimport agentinfra.agent\nimport os\n"
    names = [name for _, name in _imports(SRC / "kvcache" / "_store.py", source)]
    assert names == ["agentinfra.harness", "agentinfra.kvcache", "agentinfra.agent"]
    bad = [n for n in names if _component(n) not in ("kvcache", SHARED)]
    assert bad == ["agentinfra.harness", "agentinfra.agent"]


def _private_target(target: str) -> str | None:
    """The package owning the first private module in ``target``, or None."""
    parts = target.split(".")
    for index, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:index])
    return None


def test_private_modules_are_imported_only_from_their_own_package() -> None:
    wrong: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for line, target in _imports(path):
            owner = _private_target(target)
            if owner is not None and owner != package and owner != "agentinfra":
                wrong.append(f"{path.relative_to(SRC)}:{line} imports {target}")
    assert not wrong, "imports of another package's private modules:\n" + "\n".join(wrong)


def test_private_rule_catches_a_foreign_private_import() -> None:
    assert _private_target("agentinfra.harness._agent_run") == "agentinfra.harness"
    assert _private_target("agentinfra.harness") is None
    assert _private_target("agentinfra._settings") == "agentinfra"


def test_harness_imports_no_environment() -> None:
    wrong = [
        f"{path.relative_to(SRC)}:{line} {target}"
        for path in sorted((SRC / "harness").rglob("*.py"))
        for line, target in _imports(path)
        if target.startswith("agentinfra.environments.")
    ]
    assert not wrong, "harness must reach environments through the registry:\n" + "\n".join(wrong)
    code = "import sys, agentinfra.harness; print('agentinfra.environments.kernels' in sys.modules)"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "False"


def test_the_sandbox_imports_only_errors_and_its_jail_side_nothing() -> None:
    """The sandbox -> errors edge, and nothing more: its modules import of agentinfra only
    `agentinfra.errors` and each other; the files that run outside the package (the jail
    builder, the fork server's zygote, loaded from their files) import nothing of agentinfra."""
    wrong: list[str] = []
    for path in sorted((SRC / "sandbox").glob("*.py")):
        for line, target in _imports(path):
            allowed = path.name not in ("_jail.py", "_zygote.py") and (
                target == "agentinfra.errors" or target.startswith("agentinfra.sandbox")
            )
            if not allowed:
                wrong.append(f"sandbox/{path.name}:{line} {target}")
    assert not wrong, "the sandbox imports more than errors:\n" + "\n".join(wrong)
    code = (
        "import sys, agentinfra.sandbox; "
        "print(sorted(m for m in sys.modules if m.startswith('agentinfra') "
        "and not m.startswith('agentinfra.sandbox')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "['agentinfra', 'agentinfra.errors']"

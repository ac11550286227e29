"""Static checks on a submission's source: named, with evidence, ``block`` or ``warn``.

Only unambiguous constructs block (patching torch, timers or the grader; frame
and heap introspection; signalling other processes; hard exits); everything that
honest code may legitimately do (threads, ctypes, files, lower precision,
calling PyTorch) only warns and is judged by the runtime checks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from agentinfra import _pyast
from agentinfra.environments.kernels._verdict import Finding, Severity

__all__ = ["static_findings"]

_PROTECTED_ROOTS = frozenset(
    {
        "torch",
        "time",
        "builtins",
        "numpy",
        "sys",
        "os",
        "agentinfra",
        "xxhash",
        "gc",
        "inspect",
        "math",
    }
)
_BLOCK_CALLS: dict[str, tuple[str, str]] = {
    "os.kill": ("signals", "sends signals to other processes"),
    "os.killpg": ("signals", "sends signals to process groups"),
    "os.getppid": ("signals", "looks up the parent (grader) process"),
    "signal.signal": ("signals", "installs signal handlers"),
    "signal.pthread_kill": ("signals", "sends signals to threads"),
    "os._exit": ("early_exit", "exits the process without returning"),
    "sys._getframe": ("frame_inspection", "reads interpreter frames"),
    "inspect.stack": ("frame_inspection", "reads the call stack"),
    "inspect.currentframe": ("frame_inspection", "reads interpreter frames"),
    "inspect.getouterframes": ("frame_inspection", "reads the call stack"),
    "traceback.extract_stack": ("frame_inspection", "reads the call stack"),
    "gc.get_objects": ("gc_introspection", "walks every live object"),
    "gc.get_referrers": ("gc_introspection", "walks object referrers"),
    "gc.get_referents": ("gc_introspection", "walks object referents"),
}
_WARN_CALLS: dict[str, tuple[str, str]] = {
    "sys.exit": ("early_exit", "calls sys.exit"),
    "os.fork": ("threads_processes", "forks a process"),
    "os.system": ("threads_processes", "runs a shell command"),
    "os.popen": ("threads_processes", "runs a shell command"),
    "open": ("filesystem_env", "opens a file"),
    "os.getenv": ("filesystem_env", "reads the environment"),
    "os.listdir": ("filesystem_env", "lists a directory"),
    "torch.set_num_threads": ("threads_processes", "changes the torch thread count"),
    "torch.set_num_interop_threads": ("threads_processes", "changes the torch thread count"),
    "os.sched_setaffinity": ("threads_processes", "changes its CPU affinity"),
    "torch.cuda.Stream": ("cuda_streams", "creates a CUDA stream"),
    "torch.cuda.stream": ("cuda_streams", "switches CUDA stream"),
    "torch.autocast": ("precision_downgrade", "uses autocast"),
    "torch.set_float32_matmul_precision": ("precision_downgrade", "lowers matmul precision"),
    "time.perf_counter": ("timer_access", "reads a timer"),
    "time.time": ("timer_access", "reads a timer"),
    "time.monotonic": ("timer_access", "reads a timer"),
}
_WARN_IMPORTS: dict[str, tuple[str, str]] = {
    "ctypes": ("ctypes", "imports ctypes"),
    "cffi": ("ctypes", "imports cffi"),
    "threading": ("threads_processes", "imports threading"),
    "_thread": ("threads_processes", "imports _thread"),
    "multiprocessing": ("threads_processes", "imports multiprocessing"),
    "subprocess": ("threads_processes", "imports subprocess"),
    "concurrent": ("threads_processes", "imports concurrent"),
    "torch.multiprocessing": ("threads_processes", "imports torch.multiprocessing"),
    "pathlib": ("filesystem_env", "imports pathlib"),
    "shutil": ("filesystem_env", "imports shutil"),
    "socket": ("filesystem_env", "imports socket"),
    "gc": ("gc_introspection", "imports gc"),
    "inspect": ("frame_inspection", "imports inspect"),
    "importlib": ("filesystem_env", "imports importlib"),
}
_LOW_PRECISION_ATTRS = frozenset(
    {"half", "bfloat16", "float16", "allow_tf32", "allow_fp16_reduced_precision_reduction"}
)
_FRAME_ATTRS = frozenset(
    {"f_back", "f_globals", "f_locals", "gi_frame", "tb_frame", "__globals__", "__closure__"}
)


class _Scanner(ast.NodeVisitor):
    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.aliases: dict[str, str] = {}
        self.found: list[Finding] = []

    def add(self, node: ast.AST, check: str, severity: Severity, message: str) -> None:
        line = getattr(node, "lineno", 0)
        self.found.append(
            Finding(
                check=check,
                severity=severity,
                message=message,
                evidence=f"{self.filename}:{line}: {ast.unparse(node)[:160]}",
            )
        )

    def dotted(self, node: ast.AST) -> str | None:
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        root = self.aliases.get(node.id, node.id)
        return ".".join([root, *reversed(parts)])

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.aliases[alias.asname or alias.name.split(".")[0]] = (
                alias.name if alias.asname else alias.name.split(".")[0]
            )
            self._import(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for alias in node.names:
            self.aliases[alias.asname or alias.name] = (
                f"{module}.{alias.name}" if module else alias.name
            )
            self._import(node, f"{module}.{alias.name}" if module else alias.name)
        if node.level or module.split(".")[0] not in {
            "torch",
            "math",
            "typing",
            "__future__",
            "numpy",
            "functools",
            "itertools",
            "collections",
            "dataclasses",
        }:
            self._import(node, module)

    def _import(self, node: ast.AST, name: str) -> None:
        for prefix, (check, message) in _WARN_IMPORTS.items():
            if name == prefix or name.startswith(prefix + "."):
                self.add(node, check, "warn", message)
                return

    def _patched_target(self, target: ast.AST) -> str | None:
        name = self.dotted(target) if isinstance(target, ast.Attribute) else None
        if name and name.split(".")[0] in _PROTECTED_ROOTS:
            return name
        return None

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(node, target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node, node.target)
        self.generic_visit(node)

    def _check_target(self, node: ast.AST, target: ast.AST) -> None:
        patched = self._patched_target(target)
        if patched:
            self.add(node, "monkeypatch", "block", f"assigns to {patched}")

    def visit_Call(self, node: ast.Call) -> None:
        name = self.dotted(node.func)
        if name in ("setattr", "builtins.setattr") and node.args:
            root = self.dotted(node.args[0])
            if root and root.split(".")[0] in _PROTECTED_ROOTS:
                self.add(node, "monkeypatch", "block", f"setattr on {root}")
        if name in _BLOCK_CALLS:
            check, message = _BLOCK_CALLS[name]
            self.add(node, check, "block", message)
        elif name in _WARN_CALLS:
            check, message = _WARN_CALLS[name]
            self.add(node, check, "warn", message)
        if (
            name
            and name.split(".")[-1] in ("Model", "get_inputs", "get_init_inputs")
            and name.split(".")[0] != "self"
        ):
            self.add(node, "reference_model", "warn", f"calls {name} (the reference's name)")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in _LOW_PRECISION_ATTRS:
            self.add(node, "precision_downgrade", "warn", f"uses {node.attr}")
        if node.attr in _FRAME_ATTRS:
            self.add(node, "frame_inspection", "block", f"reads {node.attr}")
        name = self.dotted(node)
        if name in ("os.environ", "sys.modules", "sys.argv"):
            self.add(node, "filesystem_env", "warn", f"reads {name}")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id in ("__builtins__", "__file__", "__loader__"):
            self.add(node, "filesystem_env", "warn", f"reads {node.id}")
        self.generic_visit(node)


def _dedupe(findings: list[Finding]) -> Iterator[Finding]:
    seen: set[tuple[str, str]] = set()
    for finding in findings:
        key = (finding.check, finding.evidence)
        if key not in seen:
            seen.add(key)
            yield finding


def static_findings(source: str, filename: str = "submission.py") -> list[Finding]:
    """Findings for ``source``; a syntax error is the caller's business (``ast.parse`` raises)."""
    scanner = _Scanner(filename)
    scanner.visit(_pyast.parse(source, filename=filename))
    return list(_dedupe(scanner.found))

"""Tools the model can call, and a private workspace's file tools.

A tool is a name, a description, a JSON schema for its arguments (key order is
kept as written: it is what the model sees) and an async handler. A handler
raises `ToolError` for a mistake the model made (a missing file, a bad path);
the loop sends the message back as the tool's result, and the run goes on.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentinfra.agent._content import ToolResult
from agentinfra.errors import ToolError

__all__ = ["Tool", "ToolError", "tool_schemas", "workspace_tools"]

Handler = Callable[[dict[str, Any]], Awaitable[ToolResult]]
"""Returns text, or content parts (`TextPart`, `ImagePart`) for a result with images."""


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    handler: Handler
    ends_run: bool = False
    """When the call succeeds, the agent stops after it (a desktop's ``done``/``fail``)."""


def tool_schemas(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """The OpenAI ``tools`` list, in the given order, schemas as written."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def _object(properties: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


def _arg(args: dict[str, Any], name: str, kind: type) -> Any:
    value = args.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ToolError(f"argument {name!r} must be a {kind.__name__}, got {value!r}")
    return value


class _Workspace:
    def __init__(self, root: Path, max_file_bytes: int) -> None:
        self.root = root.resolve()
        self.max_file_bytes = max_file_bytes
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, relative: str) -> Path:
        if not relative or os.path.isabs(relative) or "\0" in relative:
            raise ToolError(f"path {relative!r} must be relative to the workspace")
        path = (self.root / relative).resolve()
        if path != self.root and self.root not in path.parents:
            raise ToolError(f"path {relative!r} leaves the workspace")
        return path

    async def list_files(self, args: dict[str, Any]) -> str:
        files = sorted(
            str(p.relative_to(self.root))
            for p in self.root.rglob("*")
            if p.is_file() and not p.is_symlink()
        )
        return "\n".join(files) if files else "(the workspace is empty)"

    async def read_file(self, args: dict[str, Any]) -> str:
        path = self.path(_arg(args, "path", str))
        if not path.is_file():
            raise ToolError(
                f"no file {args['path']!r} in the workspace (list_files shows what exists)"
            )
        return path.read_text(errors="replace")

    async def write_file(self, args: dict[str, Any]) -> str:
        path = self.path(_arg(args, "path", str))
        content = _arg(args, "content", str)
        if len(content.encode()) > self.max_file_bytes:
            raise ToolError(
                f"content of {len(content.encode())} bytes is over the {self.max_file_bytes}-byte limit"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(content)
        os.replace(tmp, path)
        return f"wrote {len(content.encode())} bytes to {args['path']}"

    async def edit_file(self, args: dict[str, Any]) -> str:
        path = self.path(_arg(args, "path", str))
        old, new = _arg(args, "old", str), _arg(args, "new", str)
        if not path.is_file():
            raise ToolError(f"no file {args['path']!r} in the workspace")
        text = path.read_text()
        count = text.count(old) if old else 0
        if count != 1:
            raise ToolError(
                f"'old' must occur exactly once in {args['path']}; it occurs {count} times"
            )
        return await self.write_file({"path": args["path"], "content": text.replace(old, new, 1)})


def workspace_tools(root: Path, *, max_file_bytes: int = 1 << 20) -> list[Tool]:
    """list_files, read_file, write_file and edit_file, confined to ``root``."""
    ws = _Workspace(root, max_file_bytes)
    path = {"path": {"type": "string", "description": "Path relative to the workspace."}}
    return [
        Tool("list_files", "List the files in your workspace.", _object({}, []), ws.list_files),
        Tool(
            "read_file", "Read a file from your workspace.", _object(path, ["path"]), ws.read_file
        ),
        Tool(
            "write_file",
            "Create or overwrite a file in your workspace.",
            _object(
                {**path, "content": {"type": "string", "description": "The whole file."}},
                ["path", "content"],
            ),
            ws.write_file,
        ),
        Tool(
            "edit_file",
            "Replace one exact occurrence of 'old' with 'new' in a workspace file.",
            _object(
                {**path, "old": {"type": "string"}, "new": {"type": "string"}},
                ["path", "old", "new"],
            ),
            ws.edit_file,
        ),
    ]

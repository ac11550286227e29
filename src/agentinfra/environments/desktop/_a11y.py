"""The accessibility tree as agents read it: OSWorld's XML, flattened to a table and trimmed.

The table has one tab-separated row per node an agent can act on or read:
``tag, name, text, class, description, position (top-left x&y), size (w&h)``,
kept when the node is showing and visible, has a name or text, has a positive
size on screen, and is a role agents use (buttons, cells, menus, text, ...).
It is trimmed to a token budget (about 4 characters per token), whole rows only,
with a last line saying how many rows were cut.
"""

from __future__ import annotations

from xml.etree import ElementTree

__all__ = ["HEADER", "MAX_XML_BYTES", "flatten_accessibility"]

HEADER = "tag\tname\ttext\tclass\tdescription\tposition (top-left x&y)\tsize (w&h)"
MAX_XML_BYTES = 16 << 20
_STATE = "{https://accessibility.ubuntu.example.org/ns/state}"
_COMPONENT = "{https://accessibility.ubuntu.example.org/ns/component}"
_ATTRIBUTE = "{https://accessibility.ubuntu.example.org/ns/attributes}"
_ROLES = {
    "push-button", "toggle-button", "check-box", "radio-button", "menu", "menu-item", "check-menu-item",
    "radio-menu-item", "page-tab", "combo-box", "text", "entry", "paragraph", "heading", "label",
    "table-cell", "list-item", "link", "icon", "slider", "spin-button", "tree-item", "document-text",
    "document-spreadsheet", "document-presentation", "terminal", "split-button", "tool-item",
    "static", "section", "image", "canvas",
}  # fmt: skip
_CHARS_PER_TOKEN = 4


def _pair(text: str | None) -> tuple[int, int] | None:
    try:
        a, b = (int(v) for v in (text or "").strip("()").split(","))
    except ValueError:
        return None
    return a, b


def flatten_accessibility(xml: str, *, max_tokens: int = 10_000) -> str:
    """OSWorld's XML (from the desktop, untrusted) as the agents' table, within ``max_tokens``."""
    if len(xml) > MAX_XML_BYTES:
        xml = xml[:0]
    try:
        root = ElementTree.fromstring(xml) if xml else ElementTree.Element("desktop-frame")
    except ElementTree.ParseError:
        return HEADER + "\n(accessibility tree unreadable)"
    rows: list[str] = []
    for node in root.iter():
        tag = node.tag if isinstance(node.tag, str) else ""
        if tag not in _ROLES:
            continue
        showing = node.get(f"{_STATE}showing") == "true" or tag == "table-cell"
        name, text = node.get("name", ""), (node.text or "").strip()
        position, size = (
            _pair(node.get(f"{_COMPONENT}screencoord")),
            _pair(node.get(f"{_COMPONENT}size")),
        )
        if (
            not showing
            or not (text if tag == "table-cell" else name or text)
            or position is None
            or size is None
        ):
            continue
        if size[0] <= 0 or size[1] <= 0 or position[0] < 0 or position[1] < 0:
            continue
        fields = (tag, name, text, node.get(f"{_ATTRIBUTE}class", ""), node.get("description", ""),
                  f"({position[0]}, {position[1]})", f"({size[0]}, {size[1]})")  # fmt: skip
        rows.append("\t".join(f.replace("\t", " ").replace("\n", "\\n")[:200] for f in fields))
    budget = max_tokens * _CHARS_PER_TOKEN - len(HEADER)
    kept: list[str] = []
    used = 0
    for row in rows:
        if used + len(row) + 1 > budget:
            break
        kept.append(row)
        used += len(row) + 1
    cut = len(rows) - len(kept)
    tail = [f"({cut} more rows cut to stay within {max_tokens} tokens)"] if cut else []
    return "\n".join([HEADER, *kept, *tail])

from __future__ import annotations

import json

from django import template

register = template.Library()

# Arguments shown as code blocks rather than JSON values.
CODE_ARGUMENTS = {"code", "command", "script", "source"}
# Plain-text glyphs: they render without any emoji font installed.
ICONS = {"python": "py", "terminal": ">_", "web_fetch": "www"}


@register.filter
def display_arguments(arguments: object) -> list[dict]:
    if not isinstance(arguments, dict):
        return [{"name": "arguments", "value": json.dumps(arguments, indent=2), "code": False}]
    rows = []
    for name, value in arguments.items():
        if isinstance(value, str):
            rows.append({"name": name, "value": value, "code": name in CODE_ARGUMENTS})
        else:
            text = json.dumps(value, indent=2, ensure_ascii=False)
            rows.append({"name": name, "value": text, "code": False})
    return rows


@register.filter
def tool_icon(tool_name: str) -> str:
    if "__" in (tool_name or ""):
        return "mcp"
    return ICONS.get(tool_name, "fn")


@register.filter
def tool_label(tool_name: str) -> str:
    """``server__tool`` (an MCP server's tool) as "server › tool"."""
    server, sep, tool = (tool_name or "").partition("__")
    return f"{server} › {tool}" if sep else tool_name

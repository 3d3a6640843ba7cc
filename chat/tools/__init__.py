"""The tool registry: one module per tool, each exporting ``TOOL``."""

from __future__ import annotations

from chat.tools import python, terminal, web_fetch
from chat.tools.base import Tool

REGISTRY: dict[str, Tool] = {t.TOOL.name: t.TOOL for t in (python, terminal, web_fetch)}


def tool_names() -> list[str]:
    return list(REGISTRY)

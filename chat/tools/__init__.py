"""Built-in tools: one module per tool, each exporting ``TOOL``.

``builtin_tools()`` is what a process offers now: ``web_search`` only when a
search engine is configured. MCP servers' tools join them per run
(``chat.toolbox``).
"""

from __future__ import annotations

from django.conf import settings

from chat.tools import python, terminal, web_fetch, web_search
from chat.tools.base import Tool

ALWAYS = (python.TOOL, terminal.TOOL, web_fetch.TOOL)


def builtin_tools() -> dict[str, Tool]:
    tools = {tool.name: tool for tool in ALWAYS}
    if tools.get("python") is python.TOOL:
        tools["python"] = python.tool()  # its description says whether calls share state
    if settings.STUDIO_SEARXNG_URL:
        tools[web_search.TOOL.name] = web_search.TOOL
    return tools

"""The tools one run may use: the built-ins and the MCP servers' tools."""

from __future__ import annotations

from dataclasses import dataclass

from chat.models import Conversation
from chat.tools import builtin_tools
from chat.tools.base import Tool
from studio.shell import Reading, read_arguments


@dataclass(frozen=True)
class Toolbox:
    """Every tool the process knows, and the ones this conversation switched on."""

    tools: dict[str, Tool]
    enabled: tuple[str, ...]
    # Some MCP server was reached for the first time to build it: the
    # settings panels showing "connects on first use" are out of date.
    learned: bool = False

    def get(self, name: str) -> Tool | None:
        """The tool, if it is enabled for this run."""
        return self.tools.get(name) if name in self.enabled else None

    def schemas(self) -> list[dict]:
        return [self.tools[name].schema() for name in self.enabled]

    def describe(self) -> str:
        return ", ".join(f"{n} ({self.tools[n].description})" for n in self.enabled)


def toolbox_for(
    conversation: Conversation,
    *,
    enabled: list[str] | None = None,
    connect: bool = False,
    mcp_version: tuple | None = None,
) -> Toolbox:
    """The tools of a run in ``conversation`` (``connect``: open MCP sessions not yet
    open; ``mcp_version``: the MCP servers' version read with the run's claim)."""
    from chat.mcp import enabled_servers, mcp_tools, never_reached

    builtins = builtin_tools()
    servers = enabled_servers(mcp_version)
    learned = connect and never_reached(servers)
    remote = mcp_tools(connect=connect, servers=servers)
    tools = {**builtins, **remote}
    if enabled is None:
        enabled = [name for name in conversation.enabled_tools if name in builtins]
        enabled += [name for name in remote if name not in conversation.disabled_tools]
    return Toolbox(
        tools=tools, enabled=tuple(name for name in enabled if name in tools), learned=learned
    )


def tool_names() -> list[str]:
    """Every tool a rule may name: the built-ins (configured or not) and the MCP tools."""
    from chat.mcp import known_tool_names
    from chat.tools import ALWAYS, web_search

    return [*(tool.name for tool in (*ALWAYS, web_search.TOOL)), *known_tool_names()]


def builtin_schema(tool_name: str) -> dict | None:
    """A built-in tool's parameters (API calls of it are checked and read as the chat's)."""
    tool = builtin_tools().get(tool_name)
    return tool.parameters if tool is not None else None


def call_reading(tool_name: str, arguments: dict, schema: dict | None) -> tuple[str, Reading]:
    """How rules read a call: a built-in's own way (a command line as bash reads
    it), and any other tool's argument by argument, against its schema."""
    tool = builtin_tools().get(tool_name)
    if tool is not None:
        return tool.reading(arguments)
    return read_arguments(arguments, schema)

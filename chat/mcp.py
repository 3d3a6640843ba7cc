"""The MCP servers admins configure: their rows, this process's hub, their tools for a run.

Page loads only read the rows (the tools each server last listed, and
whether it was reachable), so a server that is down never blocks a page. A
run asks the hub for a server's tools only when the server was never
reached yet (the session opens lazily); a call to a server that went down
returns a clear tool error.
"""

from __future__ import annotations

import logging
import shlex

from django.conf import settings
from django.db import connection
from django.db.models import DateTimeField, IntegerField
from django.db.models.expressions import RawSQL
from django.utils import timezone

from chat.models import McpServer, parse_pairs
from chat.tools.base import Tool
from chat.tools.mcp import (
    McpHub,
    McpUnavailable,
    RemoteTool,
    Report,
    ServerSpec,
    clashing,
    remote_tool,
    tool_name,
)
from studio.runtime import Runtime, runtime

logger = logging.getLogger(__name__)


HUB = "chat.mcp"  # its name among the runtime's parts
SERVERS = "chat.mcp.servers"


def hub() -> McpHub:
    """This process's MCP hub (made on first use; closed when the process stops)."""
    return runtime().part(
        HUB, lambda: McpHub(on_report=_record, connect_timeout=settings.STUDIO_MCP_CONNECT_TIMEOUT)
    )


def close_hub(rt: Runtime) -> None:
    """As the process exits: close every MCP session of this process."""
    made = rt.part_made(HUB)
    if made is not None:
        made.close()


def _record(report: Report) -> None:
    """Keep what the hub learned on the server's row (off the hub's own loop)."""
    runtime().io_pool.submit(_save_report, report)


def _save_report(report: Report) -> None:
    from studio.runtime import release_connection

    now = timezone.now()
    try:
        rows = McpServer.objects.filter(name=report.server)
        # Each write moves ``updated_at``: the servers' version (``servers_version``).
        if report.connected:
            rows.update(
                last_connected_at=now, tools=[t.as_dict() for t in report.tools], updated_at=now
            )
        else:
            rows.update(last_error=report.error[:2000], last_error_at=now, updated_at=now)
    except Exception:
        logger.exception("could not record the state of MCP server %s", report.server)
    finally:
        release_connection()


def spec_for(server: McpServer) -> ServerSpec:
    return ServerSpec(
        name=server.name,
        command=tuple(shlex.split(server.command)) if server.command.strip() else (),
        url=server.url.strip(),
        env=tuple(sorted(parse_pairs(server.environment, what="Environment").items())),
        headers=tuple(sorted(parse_pairs(server.headers, what="Headers").items())),
        network=server.network,
    )


def server_tools(server: McpServer, *, connect: bool) -> list[Tool]:
    """One server's tools as Studio tools: from its row, or (``connect``) by asking it."""
    spec = spec_for(server)
    remote = [RemoteTool.from_dict(t) for t in server.tools]
    if connect and server.available is None:
        try:
            remote = list(hub().tools(spec))
        except McpUnavailable as exc:
            logger.warning("%s", exc)
            return []
    elif server.available is False:
        return []  # shown as unavailable; the model is not offered them
    refused = clashing(server.name, [tool.name for tool in remote])
    return [
        remote_tool(hub(), spec, tool, description_prefix=f"(MCP server {server.name}) ")
        for tool in remote
        if tool_name(server.name, tool.name) not in refused
    ]


def servers_version() -> dict:
    """Annotations for a query of one row (a run's claim) that change whenever the
    enabled servers' rows do: how many, and the latest ``updated_at`` (every
    write of a server's row sets it). A step reads the servers only then.

    Raw SQL, two plain aggregates: the same as ``Subquery`` of an aggregate
    queryset, whose compiling cost twice the servers' own read (bench/RESULTS.md).
    """
    quote = connection.ops.quote_name
    enabled = f"FROM {quote(McpServer._meta.db_table)} WHERE {quote('enabled')}"
    # Constant SQL: names of Studio's own table and columns, no input.
    count = RawSQL(f"SELECT COUNT(*) {enabled}", (), output_field=IntegerField())  # noqa: S611
    at = f"SELECT MAX({quote('updated_at')}) {enabled}"
    latest = RawSQL(at, (), output_field=DateTimeField())  # noqa: S611
    return {"mcp_servers": count, "mcp_servers_at": latest}


class EnabledServers:
    """The enabled servers' rows as this process last read them, with their version."""

    def __init__(self) -> None:
        self.read: tuple[tuple, list[McpServer]] | None = None  # replaced whole, never changed

    def rows(self, version: tuple | None = None) -> list[McpServer]:
        """The rows; read again unless ``version`` is the one they were read at."""
        read = self.read
        if version is not None and read is not None and read[0] == version:
            return read[1]
        rows = list(McpServer.objects.filter(enabled=True))
        if version is not None:
            # Read after the version: at worst newer than it, so read again next time.
            self.read = (version, rows)
        return rows


def enabled_servers(version: tuple | None = None) -> list[McpServer]:
    """The enabled servers' rows (this process's last read when ``version`` says
    they have not changed since; see ``servers_version``)."""
    return runtime().part(SERVERS, EnabledServers).rows(version)


def never_reached(servers: list[McpServer]) -> bool:
    """Some of ``servers`` had not been connected to (by any process) when they were read."""
    return any(s.last_connected_at is None and s.last_error_at is None for s in servers)


def mcp_tools(*, connect: bool = False, servers: list[McpServer] | None = None) -> dict[str, Tool]:
    """Every enabled server's tools (of ``servers`` if given), by the name the model uses."""
    tools: dict[str, Tool] = {}
    for server in enabled_servers() if servers is None else servers:
        for tool in server_tools(server, connect=connect):
            tools[tool.name] = tool
    return tools


def refresh_tools(server: McpServer) -> int:
    """Ask the server for its tools now (admin action); returns how many it has."""
    tools = hub().refresh(spec_for(server))
    now = timezone.now()
    McpServer.objects.filter(pk=server.pk).update(
        last_connected_at=now, tools=[t.as_dict() for t in tools], updated_at=now
    )
    return len(tools)


def panel(conversation) -> list[dict]:
    """The settings panel's MCP section, from the rows alone (never blocks on a server)."""
    from chat.tools.mcp import tool_name

    servers = []
    for server in McpServer.objects.filter(enabled=True):
        tools = [
            {
                "name": tool_name(server.name, t["name"]),
                "label": t["name"],
                "description": t.get("description", ""),
                "hints": t.get("hints", []),
                "enabled": tool_name(server.name, t["name"]) not in conversation.disabled_tools,
            }
            for t in server.tools
        ]
        servers.append(
            {"name": server.name, "available": server.available, "error": server.last_error,
             "tools": tools}
        )  # fmt: skip
    return servers


def known_tool_names() -> list[str]:
    """The names of every enabled server's last-listed tools."""
    from chat.tools.mcp import tool_name

    return [
        tool_name(server.name, t["name"])
        for server in McpServer.objects.filter(enabled=True)
        for t in server.tools
    ]

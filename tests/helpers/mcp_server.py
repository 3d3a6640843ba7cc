"""A real MCP server for the tests, written with the SDK's own MCPServer.

    python tests/helpers/mcp_server.py stdio
    python tests/helpers/mcp_server.py http PORT

Tools: ``echo`` (read-only, idempotent), ``remove`` (destructive, open world),
``slow`` (sleeps), ``count`` (reports its progress as it goes), ``fail`` (an
error result), ``picture`` (an image), ``stats`` (structured content),
``crash`` (the process dies mid-call), ``peek`` (reads a file, to show what
its sandbox hides) and ``connect`` (opens a TCP connection to 127.0.0.1, to
show whether it may reach the network).
"""

from __future__ import annotations

import base64
import os
import sys
import time

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import ToolAnnotations

# A 1x1 red PNG.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)

server = MCPServer("test-tools")
PROCESS = int.from_bytes(os.urandom(4), "big")


@server.tool(
    annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
)
def echo(text: str) -> str:
    """Return the text, from the server's process (named by a number of its own:
    in its sandbox every server is pid 2)."""
    return f"echo from pid {PROCESS}: {text}"


@server.tool(annotations=ToolAnnotations(destructive_hint=True, open_world_hint=True))
def remove(path: str) -> str:
    """Pretend to delete a file."""
    return f"removed {path}"


@server.tool()
def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
async def count(to: int, ctx: Context) -> str:
    """Count to ``to``, a step every 0.3 s, telling the client how far it got."""
    import asyncio

    for n in range(1, to + 1):
        await ctx.report_progress(n, to, f"counted {n}")
        await asyncio.sleep(0.3)
    return f"counted to {to}"


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the reason."""
    raise ToolError(f"it failed: {reason}")


@server.tool()
def picture() -> Image:
    """A tiny image."""
    return Image(data=PIXEL, format="png")


@server.tool(structured_output=True)
def stats(values: list[float]) -> dict[str, float]:
    """Count and sum as structured content."""
    return {"count": len(values), "total": sum(values)}


@server.tool()
def peek(path: str) -> str:
    """The first bytes of a file, or why they cannot be read."""
    try:
        with open(path, "rb") as f:
            return f"read: {f.read(64)!r}"
    except OSError as exc:
        return f"cannot read: {type(exc).__name__}"


@server.tool()
def connect(port: int) -> str:
    """Whether a TCP connection to 127.0.0.1:port opens."""
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError as exc:
        return f"no connection: {type(exc).__name__}"
    return "connected"


@server.tool()
def crash() -> str:
    """The server dies in the middle of the call."""
    sys.stdout.flush()
    os._exit(3)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")

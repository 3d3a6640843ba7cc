"""A real MCP server for the tests, written with the SDK's own MCPServer.

    python tests/helpers/mcp_server.py stdio
    python tests/helpers/mcp_server.py http PORT

Tools: ``echo`` (read-only, idempotent), ``remove`` (destructive, open world),
``slow`` (sleeps), ``fail`` (an error result), ``picture`` (an image),
``stats`` (structured content), ``crash`` (the process dies mid-call).
"""

from __future__ import annotations

import base64
import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import ToolAnnotations

# A 1x1 red PNG.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)

server = MCPServer("test-tools")


@server.tool(
    annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
)
def echo(text: str) -> str:
    """Return the text, from the server's process."""
    return f"echo from pid {os.getpid()}: {text}"


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
def crash() -> str:
    """The server dies in the middle of the call."""
    sys.stdout.flush()
    os._exit(3)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")

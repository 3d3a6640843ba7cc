"""Child process: call an MCP server's echo tool through this process's own hub.

Usage: mcp_call_proc.py SERVER_NAME — prints the tool's answer (it names the
server process's pid: each Studio process has a session of its own).
"""

from __future__ import annotations

import sys

import django

django.setup()

from chat.mcp import hub, spec_for  # noqa: E402
from chat.models import McpServer  # noqa: E402
from chat.tools.mcp import result_of  # noqa: E402
from studio.cancel import CancelToken  # noqa: E402


def main() -> None:
    spec = spec_for(McpServer.objects.get(name=sys.argv[1]))
    result = hub().call(spec, "echo", {"text": "child"}, timeout=20, cancel=CancelToken())
    print(result_of(result, workspace=None, tool="echo").text, flush=True)
    hub().close()


if __name__ == "__main__":
    main()

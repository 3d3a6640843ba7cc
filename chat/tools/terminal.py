"""The ``terminal`` tool: run a shell command in the sandbox."""

from __future__ import annotations

from pathlib import Path

from chat.tools.base import Tool, ToolResult
from chat.tools.sandbox import SandboxUnavailable, run_sandboxed
from studio.cancel import CancelToken


def run(arguments: dict, *, cancel: CancelToken, timeout: float, workspace: Path) -> ToolResult:
    try:
        result = run_sandboxed(
            ["/bin/bash", "-c", arguments["command"]],
            workspace=workspace,
            timeout=timeout,
            cancel=cancel,
        )
    except SandboxUnavailable as exc:
        return ToolResult(str(exc), ok=False)
    return result.as_result(timeout=timeout)


TOOL = Tool(
    name="terminal",
    description=(
        "Run a shell command (bash) in this conversation's working folder and return its "
        "output. There is no network."
    ),
    parameters={
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The command line to run."}},
        "required": ["command"],
    },
    run=run,
)

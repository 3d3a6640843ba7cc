"""The ``terminal`` tool: run a shell command in the sandbox."""

from __future__ import annotations

from pathlib import Path

from chat.tools.base import Progress, Tool, ToolResult
from chat.tools.sandbox import run_tool
from studio.cancel import CancelToken
from studio.shell import read_command_line


def run(
    arguments: dict,
    *,
    cancel: CancelToken,
    timeout: float,
    workspace: Path,
    progress: Progress | None = None,
) -> ToolResult:
    return run_tool(
        ["/bin/bash", "-c", arguments["command"]],
        workspace=workspace,
        timeout=timeout,
        cancel=cancel,
        progress=progress,
    )


TOOL = Tool(
    name="terminal",
    description=(
        "Run a shell command (bash) in this conversation's working folder and return its "
        "output. There is no network."
    ),
    parameters={
        "type": "object",
        "properties": {
            "command": {"type": "string", "minLength": 1, "description": "The command line to run."}
        },
        "required": ["command"],
        "additionalProperties": False,
    },
    run=run,
    live=True,
    subject_argument="command",
    read_subject=read_command_line,
)

"""The ``terminal`` tool: run a shell command in the sandbox."""

from __future__ import annotations

import shutil
from pathlib import Path

from approvals.gate import CancelToken
from chat.tools.base import Tool
from chat.tools.sandbox import run_sandboxed


def run(arguments: dict, *, cancel: CancelToken, timeout: float, workspace: Path) -> str:
    shell = shutil.which("bash") or "/bin/sh"
    result = run_sandboxed(
        [shell, "-c", arguments["command"]], workspace=workspace, timeout=timeout, cancel=cancel
    )
    return result.as_text(timeout=timeout)


TOOL = Tool(
    name="terminal",
    description=(
        "Run a shell command (bash) in this conversation's working folder and return its output."
    ),
    parameters={
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The command line to run."}},
        "required": ["command"],
    },
    side_effects=True,
    run=run,
)

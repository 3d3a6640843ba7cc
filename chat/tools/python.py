"""The ``python`` tool: run code with ``python -I`` in the sandbox."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from chat.tools.base import Tool, ToolResult
from chat.tools.sandbox import SandboxUnavailable, run_sandboxed
from studio.cancel import CancelToken


def sandbox_python() -> str:
    """The interpreter of the ``python`` tool (STUDIO_SANDBOX_PYTHON).

    The system's by default: the sandbox shows it read-only at its own path,
    and it is readable by the tool's uid (the server's own interpreter may
    live in a private home such as /root/.pyenv).
    """
    configured = os.environ.get("STUDIO_SANDBOX_PYTHON")
    if configured:
        return configured
    if os.access("/usr/bin/python3", os.X_OK):
        return "/usr/bin/python3"
    return sys.executable


def run(arguments: dict, *, cancel: CancelToken, timeout: float, workspace: Path) -> ToolResult:
    try:
        result = run_sandboxed(
            [sandbox_python(), "-I", "-"],
            workspace=workspace,
            timeout=timeout,
            cancel=cancel,
            stdin=arguments["code"],
        )
    except SandboxUnavailable as exc:
        return ToolResult(str(exc), ok=False)
    return result.as_result(timeout=timeout)


TOOL = Tool(
    name="python",
    description=(
        "Run a Python 3 program and return what it prints (stdout and stderr). "
        "The working folder persists for this conversation; there is no network."
    ),
    parameters={
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The Python source to run."}},
        "required": ["code"],
    },
    run=run,
)

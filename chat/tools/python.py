"""The ``python`` tool: run code with ``python -I`` in the sandbox."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from approvals.gate import CancelToken
from chat.tools.base import Tool
from chat.tools.sandbox import can_drop_privileges, run_sandboxed


def sandbox_python() -> str:
    # When we drop privileges, the interpreter must be readable by the
    # sandbox uid; the server's own may live in a private home (/root/.pyenv).
    configured = os.environ.get("STUDIO_SANDBOX_PYTHON")
    if configured:
        return configured
    if can_drop_privileges() and os.access("/usr/bin/python3", os.X_OK):
        return "/usr/bin/python3"
    return sys.executable


def run(arguments: dict, *, cancel: CancelToken, timeout: float, workspace: Path) -> str:
    result = run_sandboxed(
        [sandbox_python(), "-I", "-"],
        workspace=workspace,
        timeout=timeout,
        cancel=cancel,
        stdin=arguments["code"],
    )
    return result.as_text(timeout=timeout)


TOOL = Tool(
    name="python",
    description=(
        "Run a Python 3 program and return what it prints (stdout and stderr). "
        "The working folder persists for this conversation."
    ),
    parameters={
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The Python source to run."}},
        "required": ["code"],
    },
    side_effects=True,
    run=run,
)

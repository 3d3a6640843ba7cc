"""The ``python`` tool: run code with ``python -I`` in the sandbox."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from chat.tools.base import Tool, ToolResult
from chat.tools.sandbox import run_tool
from studio.cancel import CancelToken

# Runs first in the sandbox, then the member's code read from stdin (as
# "<stdin>", so its tracebacks keep their line numbers). There is no display:
# matplotlib's plt.show() saves the open figures into the workspace instead
# (figure-N.png, never overwriting one), and so does the end of the program
# for figures never shown; the chat then shows them under the output.
PRELUDE = """
import sys

def _studio_save_figures(plt):
    import os
    n = 1
    for number in plt.get_fignums():
        while os.path.exists(f"figure-{n}.png"):
            n += 1
        plt.figure(number).savefig(f"figure-{n}.png")
    plt.close("all")

class _StudioPyplot:
    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            module.show = lambda *args, **kwargs: _studio_save_figures(module)
            # After pyplot's own exit handler, so this one runs first.
            import atexit
            atexit.register(_studio_save_figures, module)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _StudioPyplot())
_studio_code = sys.stdin.read()
exec(compile(_studio_code, "<stdin>", "exec"), {"__name__": "__main__"})
"""


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
    return run_tool(
        [sandbox_python(), "-I", "-c", PRELUDE],
        workspace=workspace,
        timeout=timeout,
        cancel=cancel,
        stdin=arguments["code"],
    )


TOOL = Tool(
    name="python",
    description=(
        "Run a Python 3 program and return what it prints (stdout and stderr). "
        "The working folder persists for this conversation; there is no network. "
        "Matplotlib figures (plt.show()) are saved and shown to the user."
    ),
    parameters={
        "type": "object",
        "properties": {
            "code": {"type": "string", "minLength": 1, "description": "The Python source to run."}
        },
        "required": ["code"],
        "additionalProperties": False,
    },
    run=run,
    subject_argument="code",
)

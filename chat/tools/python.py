"""The ``python`` tool: run code with ``python -I`` in the sandbox."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from django.conf import settings

from chat.tools.base import Progress, Tool, ToolResult
from chat.tools.sandbox import run_tool, sandbox_python
from chat.tools.sessions import SESSIONS
from studio.cancel import CancelToken

# Runs first in the sandbox, then the member's code read from stdin (as
# "<stdin>", so its tracebacks keep their line numbers). There is no display:
# matplotlib's plt.show() saves the open figures into the workspace instead
# (figure-N.png, never overwriting one), and so does the end of the program
# for figures never shown; the chat then shows them under the output.
FIGURES = """
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
"""
PRELUDE = (
    FIGURES
    + """
_studio_code = sys.stdin.read()
exec(compile(_studio_code, "<stdin>", "exec"), {"__name__": "__main__"})
"""
)
# A python session (chat.tools.sessions): one namespace for every call. The
# first line on stdin is the session's secret marker; then each call arrives
# as its length in bytes, a newline and the source. Its output is framed by
# the marker: "<marker>start <n>" before it, "<marker>end <n> <status>" after,
# so what threads print between calls is nobody's output. The marker lives in
# the serving function's frame only: not in __main__, argv or the command
# line, where the model's code could read it by name. The call's own stdin
# reads nothing (the requests stream is kept aside).
KERNEL = (
    FIGURES
    + """
def _studio_serve():
    import io, os, traceback
    requests = os.fdopen(os.dup(0), "rb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)
    marker = requests.readline().rstrip(b"\\n")
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    number = 0
    while True:
        header = requests.readline()
        if not header:
            break
        code = requests.read(int(header)).decode("utf-8", "replace")
        number += 1
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(1, marker + b"start %d\\n" % number)
        status = 0
        try:
            exec(compile(code, "<stdin>", "exec"), namespace)
        except SystemExit as exit_:
            if exit_.code is None or isinstance(exit_.code, int):
                status = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
                status = 1
        except BaseException:
            status = 1
            kind, value, trace = sys.exc_info()
            traceback.print_exception(kind, value, trace.tb_next)
            del kind, value, trace
        if "matplotlib.pyplot" in sys.modules:
            _studio_save_figures(sys.modules["matplotlib.pyplot"])
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(1, marker + b"end %d %d\\n" % (number, status))

sys.argv = [""]
_studio_serve()
"""
)


def run(
    arguments: dict,
    *,
    cancel: CancelToken,
    timeout: float,
    workspace: Path,
    progress: Progress | None = None,
) -> ToolResult:
    if settings.STUDIO_PYTHON_SESSIONS:
        return SESSIONS.run(
            arguments["code"],
            workspace=workspace,
            timeout=timeout,
            cancel=cancel,
            argv=[sandbox_python(), "-I", "-u", "-c", KERNEL],
            progress=progress,
        )
    return run_alone(
        arguments, cancel=cancel, timeout=timeout, workspace=workspace, progress=progress
    )


def run_alone(
    arguments: dict,
    *,
    cancel: CancelToken,
    timeout: float,
    workspace: Path,
    progress: Progress | None = None,
) -> ToolResult:
    """In an interpreter of its own: no earlier call shaped it (the chat's session lives on)."""
    return run_tool(
        # Unbuffered: what it prints shows on its card as it prints it.
        [sandbox_python(), "-I", "-u", "-c", PRELUDE],
        workspace=workspace,
        timeout=timeout,
        cancel=cancel,
        stdin=arguments["code"],
        progress=progress,
    )


TOOL = Tool(
    name="python",
    description=(
        "Run Python 3 code and return what it prints (stdout and stderr). The working "
        "folder persists for this conversation; there is no network. Matplotlib figures "
        "(plt.show()) are saved and shown to the user."
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
    run_fresh=run_alone,
    live=True,
    subject_argument="code",
)

SESSION_NOTE = (
    " Calls share one interpreter, like a notebook: variables, imports and data from "
    "earlier calls are still there, unless Studio says a new session started."
)


def tool() -> Tool:
    """The python tool as this deployment runs it (with sessions or without)."""
    if settings.STUDIO_PYTHON_SESSIONS:
        return replace(TOOL, description=TOOL.description + SESSION_NOTE)
    return TOOL

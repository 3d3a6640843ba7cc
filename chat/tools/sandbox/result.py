"""What a finished call gave back, in the words the model and the member read."""

from __future__ import annotations

import logging
import re
import secrets
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from django.conf import settings

from chat.tools.base import ToolResult
from chat.tools.images import keep, notice_for, produced
from chat.tools.sandbox.files import workspace_usage, write_beneath
from chat.tools.sandbox.limits import MB
from studio.metrics import SANDBOX_FAILURES

logger = logging.getLogger(__name__)

WHOLE_OUTPUT_DIR = "tool-output"


@dataclass
class SandboxResult:
    output: str
    exit_code: int | None
    timed_out: bool = False
    cancelled: bool = False
    truncated_bytes: int = 0
    # The whole output (a temporary file), when it was cut at OUTPUT_CAP.
    whole: IO[bytes] | None = None
    out_of_memory: bool = False
    over_quota: bool = False
    quota_bytes: int = 0

    def as_text(self, *, timeout: float) -> str:
        return self.as_result(timeout=timeout).text

    def as_result(self, *, timeout: float) -> ToolResult:
        text = self.output
        if self.truncated_bytes:
            text += f"\n[output truncated: {self.truncated_bytes} more bytes not shown]"
        failure = ""
        if self.timed_out:
            problem, failure = f"timed out after {timeout:g} s and was killed.", "timeout"
        elif self.cancelled:
            problem = "stopped by the user."
        elif self.over_quota:
            problem = (
                f"the workspace passed its quota of {self.quota_bytes // MB} MB and the "
                "call was killed; delete files to free space."
            )
            failure = "quota"
        elif self.out_of_memory:
            problem, failure = "killed: the call used more than its memory limit.", "memory"
        elif self.exit_code:
            problem = f"exited with {_describe_exit(self.exit_code)}."
            if _NO_NETWORK.search(text):
                problem += f" {NO_NETWORK_NOTE}"
                failure = "network"
        else:
            return ToolResult(text if text.strip() else "(no output)")
        if failure:
            SANDBOX_FAILURES.labels(failure).inc()
        return replace(ToolResult.error(f"{problem}\n{text}".rstrip()), stopped=self.cancelled)


# What programs print when a name does not resolve or nothing answers: in the
# sandbox, that is because there is no network at all.
_NO_NETWORK = re.compile(
    r"Could not resolve host|Temporary failure in name resolution|Name or service not known"
    r"|No address associated with hostname|Network is unreachable|getaddrinfo failed"
    r"|Failed to establish a new connection|Failed to connect to|Connection refused"
    r"|unable to resolve host",
    re.IGNORECASE,
)


NO_NETWORK_NOTE = (
    "Tools run without a network (no internet, no local services), so this call could not "
    "reach what it asked for; use web_fetch for a web page."
)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    if code > 128:
        # bwrap reports a program killed by a signal as 128 + signal.
        try:
            return f"signal {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"status {code}"


def tool_result(ran: SandboxResult, *, workspace: Path, before: dict, timeout: float) -> ToolResult:
    """What a call gave back, with the images it made (since ``before``, a
    ``snapshot``) and, for a cut output, the workspace file holding all of it."""
    result = ran.as_result(timeout=timeout)
    made = keep(workspace, produced(workspace, before))
    files = tuple(image.as_dict() for image in made)
    text = result.text + notice_for(made)
    if ran.whole is not None:
        with ran.whole:
            kept = keep_whole_output(workspace, ran.whole)
        if kept is not None:
            files += (kept,)
            text += f"\n[The whole output is in the workspace as {kept['name']}.]"
    return ToolResult(text, ok=result.ok, images=files, stopped=result.stopped)


def keep_whole_output(workspace: Path, whole: IO[bytes]) -> dict | None:
    """Save a cut output whole as a workspace file (the tools' uid owns it), so the
    member can download it and the model can read it; None if it does not fit."""
    size = whole.tell()
    quota_left = settings.STUDIO_WORKSPACE_QUOTA_MB * MB - workspace_usage(workspace)
    if size > quota_left:
        return None
    name = f"{WHOLE_OUTPUT_DIR}/{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}.txt"
    whole.seek(0)
    try:
        write_beneath(workspace, name, iter(lambda: whole.read(1 << 16), b""))
    except OSError:
        logger.warning("could not keep a tool's whole output in %s", workspace, exc_info=True)
        return None
    return {"name": name, "size": size, "mime": "text/plain", "shown": False, "output": True}

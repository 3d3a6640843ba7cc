"""Running a tool's program isolated: prepare the command, run it, release what it held."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from chat.tools.base import Progress, ToolResult
from chat.tools.images import snapshot
from chat.tools.sandbox.cgroups import JOIN_CGROUPS, CallCgroup
from chat.tools.sandbox.command import bwrap_argv, plain_argv
from chat.tools.sandbox.files import prepare_workspace, sandbox_ids, workspace_usage
from chat.tools.sandbox.host import SandboxUnavailable, cgroup_root, check_available, sandbox_mode
from chat.tools.sandbox.limits import Limits, default_limits
from chat.tools.sandbox.process import run_process
from chat.tools.sandbox.result import SandboxResult, tool_result
from chat.tools.sandbox.seccomp import seccomp_fd
from studio.cancel import CancelToken


def run_sandboxed(
    argv: list[str],
    *,
    workspace: Path,
    timeout: float,
    cancel: CancelToken | None = None,
    stdin: str | None = None,
    limits: Limits | None = None,
    progress: Progress | None = None,
) -> SandboxResult:
    """Run ``argv`` isolated; raises ``SandboxUnavailable`` when it cannot be.
    ``progress`` hears its latest output while it runs."""
    limits = limits or default_limits()
    prepared = prepare(argv, workspace=workspace, limits=limits, cpu_seconds=int(timeout) + 1)
    try:
        return run_process(
            prepared.command,
            pass_fds=prepared.pass_fds,
            workspace=workspace,
            timeout=timeout,
            cancel=cancel,
            stdin=stdin,
            limits=limits,
            cgroup=prepared.cgroup,
            used=prepared.used,
            progress=progress,
        )
    finally:
        prepared.release()


@dataclass
class Prepared:
    """A sandboxed command line and what it holds until its process is gone."""

    command: list[str]
    pass_fds: tuple[int, ...]
    cgroup: CallCgroup | None
    used: int  # the workspace's bytes when it was prepared

    def release(self) -> None:
        for fd in self.pass_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.pass_fds = ()
        if self.cgroup is not None:
            self.cgroup.remove()


def prepare(argv: list[str], *, workspace: Path, limits: Limits, cpu_seconds: int) -> Prepared:
    """The command that runs ``argv`` isolated, its cgroups made; raises
    ``SandboxUnavailable`` when it cannot be. ``release()`` it after."""
    check_available()
    prepare_workspace(workspace)
    # All of it, not only up to the quota: the watch lets a workspace already
    # over it shrink, not grow.
    used = workspace_usage(workspace)
    # No single file may grow past what is left of the quota; over it, the
    # call can still read and delete, not grow anything.
    file_bytes = max(0, min(limits.file_bytes, limits.workspace_bytes - used))
    cpu_seconds = max(1, cpu_seconds)
    if sandbox_mode() == "none":
        command = plain_argv(argv, limits=limits, cpu_seconds=cpu_seconds, file_bytes=file_bytes)
        return Prepared(command=command, pass_fds=(), cgroup=None, used=used)
    cgroup = None
    prefix: list[str] = []
    root = cgroup_root()
    if root is not None:
        cgroup = CallCgroup(root=root, limits=limits)
        procs = cgroup.create()
        prefix = ["/bin/sh", "-c", JOIN_CGROUPS, "studio-sandbox", *map(str, procs), "--"]
    filter_fd = seccomp_fd()
    command = bwrap_argv(
        argv,
        workspace=workspace,
        limits=limits,
        cpu_seconds=cpu_seconds,
        file_bytes=file_bytes,
        ids=sandbox_ids(workspace),
        memory_rlimit=cgroup is None,
        seccomp=filter_fd,
    )
    return Prepared(
        command=[*prefix, *command],
        pass_fds=() if filter_fd is None else (filter_fd,),
        cgroup=cgroup,
        used=used,
    )


def run_tool(argv: list[str], *, workspace: Path, **kwargs) -> ToolResult:
    """Run ``argv`` in the sandbox as a tool call: its result, with the images it made."""
    workspace.mkdir(parents=True, exist_ok=True)
    before = snapshot(workspace)
    try:
        ran = run_sandboxed(argv, workspace=workspace, **kwargs)
    except SandboxUnavailable as exc:
        return ToolResult(str(exc), ok=False)
    return tool_result(ran, workspace=workspace, before=before, timeout=kwargs["timeout"])

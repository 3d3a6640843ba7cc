"""What this machine offers the sandbox: bubblewrap, a cgroup subtree, a uid to drop to."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

logger = logging.getLogger(__name__)


INSTALL_HINT = (
    "Error: tools cannot run: the sandbox tool bubblewrap (bwrap) is not installed. "
    "Ask an admin to install it (Debian/Ubuntu: apt-get install bubblewrap) or, knowingly, "
    "to run tools without isolation (STUDIO_SANDBOX=none)."
)


class SandboxUnavailable(Exception):
    """The isolation layer cannot be set up; the message tells the user why."""


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


def sandbox_mode() -> str:
    """``bwrap`` (the default) or ``none`` (STUDIO_SANDBOX=none: no isolation)."""
    from django.conf import settings

    return settings.STUDIO_SANDBOX


def can_drop_privileges() -> bool:
    return os.geteuid() == 0


@cache
def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@dataclass(frozen=True)
class CgroupRoot:
    """Where per-call cgroups are made: one directory per controller."""

    version: int
    memory: Path
    pids: Path | None


@cache
def cgroup_root() -> CgroupRoot | None:
    """A writable place for per-call memory (and pids) cgroups, or None.

    ``STUDIO_TOOL_CGROUP``: a subtree a small privileged helper prepared and
    handed to this process's user (``deploy/systemd/studio-cgroups.service``),
    as the memory and pids controllers' ``<name>`` (cgroup v1). Otherwise,
    cgroup v1: below this process's own memory and pids cgroups. cgroup v2:
    below this process's cgroup when it delegates the memory controller to
    its children (e.g. a systemd unit with ``Delegate=yes``).
    """
    from django.conf import settings

    if settings.STUDIO_TOOL_CGROUP:
        memory = _probe_dir(Path("/sys/fs/cgroup/memory") / settings.STUDIO_TOOL_CGROUP, "")
        if memory is None:
            return None
        pids = _probe_dir(Path("/sys/fs/cgroup/pids") / settings.STUDIO_TOOL_CGROUP, "")
        return CgroupRoot(version=1, memory=memory, pids=pids)
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    own: dict[str, str] = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    if "memory" in own:
        memory = _probe_dir(Path("/sys/fs/cgroup/memory") / own["memory"].lstrip("/"))
        if memory is None:
            return None
        pids = None
        if "pids" in own:
            pids = _probe_dir(Path("/sys/fs/cgroup/pids") / own["pids"].lstrip("/"))
        return CgroupRoot(version=1, memory=memory, pids=pids)
    if "" in own:
        base = Path("/sys/fs/cgroup") / own[""].lstrip("/")
        try:
            delegated = (base / "cgroup.subtree_control").read_text().split()
        except OSError:
            return None
        if "memory" not in delegated:
            return None
        root = _probe_dir(base)
        if root is None:
            return None
        return CgroupRoot(version=2, memory=root, pids=root if "pids" in delegated else None)
    return None


def _probe_dir(parent: Path, name: str = "studio-tools") -> Path | None:
    """``parent/name`` if we may create cgroups there (``name`` "": ``parent``,
    which must exist: a helper made it)."""
    root = parent / name if name else parent
    try:
        if name:
            root.mkdir(exist_ok=True)
        probe = root / f"probe-{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return None
    return root


def check_available() -> None:
    """Raise ``SandboxUnavailable`` when tools must refuse to run."""
    if sandbox_mode() == "none":
        return
    if bwrap_path() is None:
        raise SandboxUnavailable(INSTALL_HINT)


def describe() -> str:
    """One line for the start-up log: what isolation tools get here."""
    if sandbox_mode() == "none":
        return "NO ISOLATION (STUDIO_SANDBOX=none): tools run as plain subprocesses"
    if bwrap_path() is None:
        return "bubblewrap is missing: tools refuse to run until it is installed"
    root = cgroup_root()
    memory = f"per-call cgroup v{root.version}" if root else "per-process RLIMIT_AS (no cgroup)"
    uid = "own uid per conversation" if can_drop_privileges() else "the server's uid"
    return f"bubblewrap at {bwrap_path()}; memory: {memory}; {uid}"

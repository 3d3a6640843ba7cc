"""The command line a call runs as: namespaces, mounts, uid, rlimits, environment."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from functools import cache
from pathlib import Path

from chat.tools.sandbox.host import bwrap_path, can_drop_privileges, sandbox_python
from chat.tools.sandbox.limits import MB, Limits
from studio.shell import PROGRAM_PATH

logger = logging.getLogger(__name__)

# The host paths a call sees read-only; the rest of the host does not exist in it.
_SYSTEM_BINDS = ("/usr", "/etc")


# Debian's merged /usr: these are symlinks on the host and in the sandbox.
_USR_LINKS = {"/bin": "usr/bin", "/sbin": "usr/sbin", "/lib": "usr/lib", "/lib64": "usr/lib64"}


# git reads programs to run from a workspace's .git/config, which any earlier
# call may have written: these settings win over it (as ``git -c`` would), so
# an approved ``git status`` is git status, not a hook or a monitor.
GIT_PINNED = {
    "core.fsmonitor": "false",
    "core.hooksPath": "/dev/null",
    "core.pager": "cat",
    "core.editor": "false",
    "core.sshCommand": "false",
}


def clean_env(workspace: Path) -> dict[str, str]:
    """Built from nothing, never copied from the server's environment."""
    env = {
        "PATH": PROGRAM_PATH,
        "HOME": str(workspace),
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "MPLBACKEND": "Agg",
        # Caches in the call's own tmpfs mounts, never the member's workspace (where
        # they cluttered the files and warned with the host's path); the font
        # lists come warmed (``font_caches``).
        "MPLCONFIGDIR": MPL_DIR,
        "XDG_CACHE_HOME": "/tmp/.cache",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_COUNT": str(len(GIT_PINNED)),
    }
    for n, (key, value) in enumerate(GIT_PINNED.items()):
        env[f"GIT_CONFIG_KEY_{n}"] = key
        env[f"GIT_CONFIG_VALUE_{n}"] = value
    return env


# The namespaces of every sandbox (tool calls and MCP servers): its own
# processes, IPC and host name; it dies with whoever started it.
NAMESPACES = (
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--die-with-parent",
    "--new-session",
)


def drop_to(uid: int, gid: int) -> list[str]:
    """The command prefix that leaves root for ``uid`` with no capability left."""
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def system_view() -> list[str]:
    """bubblewrap's arguments for the read-only system every sandbox sees."""
    view: list[str] = []
    for path in _SYSTEM_BINDS:
        view += ["--ro-bind", path, path]
    for link, target in _USR_LINKS.items():
        if os.path.islink(link):
            view += ["--symlink", target, link]
        elif os.path.isdir(link):
            view += ["--ro-bind", link, link]
    return view


def _interpreter_binds(argv: list[str]) -> list[str]:
    """A configured interpreter outside /usr is bound read-only with its prefix."""
    program = Path(argv[0])
    if not program.is_absolute():
        return []
    resolved = program.resolve()
    if any(str(resolved).startswith(p + "/") for p in _SYSTEM_BINDS):
        return []
    prefix = resolved.parent.parent
    if str(prefix) in ("/", ""):
        return []
    return ["--ro-bind", str(prefix), str(prefix)]


# Where matplotlib keeps its config and font list in a call: a small tmpfs of
# the call's own, apart from its /tmp (which the call finds empty).
MPL_DIR = "/run/matplotlib"


@cache
def font_caches() -> list[str]:
    """bubblewrap's arguments that show a call the system's fontconfig cache and
    a matplotlib font list built once, so a plot neither rebuilds them (seconds)
    nor prints fontconfig's and matplotlib's complaints about where to write.

    The font list is built by the tools' interpreter on the host (Debian's
    matplotlib over the same read-only fonts the calls see), once per host,
    kept beside the workspaces; none when that interpreter has no matplotlib.
    """
    from django.conf import settings

    found: list[str] = ["--ro-bind-try", "/var/cache/fontconfig", "/var/cache/fontconfig"]
    found += ["--size", str(8 * MB), "--perms", "1777", "--tmpfs", MPL_DIR]
    folder = settings.STUDIO_WORKSPACE_ROOT.parent / "tool-cache" / "matplotlib"
    lists = sorted(folder.glob("fontlist-v*.json"))
    if not lists:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [sandbox_python(), "-I", "-c", "import matplotlib.font_manager"],
                env={"PATH": "/usr/bin:/bin", "MPLCONFIGDIR": str(folder), "HOME": str(folder)},
                capture_output=True,
                timeout=120,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            # No matplotlib there, or no folder we may write: plots build their own.
            logger.info("no matplotlib font list for the tools: plots build their own")
        lists = sorted(folder.glob("fontlist-v*.json"))
    if lists:
        with contextlib.suppress(OSError):  # (made by another user: readable already)
            folder.chmod(0o755)
            lists[-1].chmod(0o644)
        found += ["--ro-bind", str(lists[-1]), f"{MPL_DIR}/{lists[-1].name}"]
    return found


# Each call gets its own, empty and size-capped. A workspace (or interpreter)
# below one of them would show its path there: keep them elsewhere.
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def under_private_dir(path: Path) -> bool:
    resolved = str(Path(path).resolve())
    return any(resolved == d or resolved.startswith(d + "/") for d in PRIVATE_DIRS)


def bwrap_argv(
    argv: list[str],
    *,
    workspace: Path,
    limits: Limits,
    cpu_seconds: int,
    file_bytes: int,
    ids: tuple[int, int] | None,
    memory_rlimit: bool,
    seccomp: int | None = None,
) -> list[str]:
    bwrap = bwrap_path()
    assert bwrap is not None
    command = [bwrap, "--unshare-net", *NAMESPACES, "--hostname", "sandbox"]
    if not can_drop_privileges():
        # Unprivileged: bubblewrap needs a user namespace of its own.
        command.append("--unshare-user")
    command += system_view()
    command += _interpreter_binds(argv)
    command += ["--proc", "/proc", "--dev", "/dev"]
    for tmp in PRIVATE_DIRS:
        command += ["--size", str(limits.tmp_bytes), "--perms", "1777", "--tmpfs", tmp]
    command += font_caches()
    # The workspace's parents exist in the sandbox only as the way to it:
    # traversable, as on the host, so programs that resolve their folder's
    # real path (git) work as the tool's uid.
    for parent in reversed(workspace.parents[:-1]):
        command += ["--perms", "0711", "--dir", str(parent)]
    command += ["--bind", str(workspace), str(workspace), "--chdir", str(workspace)]
    if seccomp is not None:
        command += ["--seccomp", str(seccomp)]
    command.append("--clearenv")
    for name, value in clean_env(workspace).items():
        command += ["--setenv", name, value]
    command.append("--")
    if ids is not None:
        command += drop_to(*ids)
    command += [
        "prlimit",
        f"--cpu={cpu_seconds}:{cpu_seconds + 1}",
        f"--fsize={file_bytes}",
        f"--nofile={limits.open_files}",
        "--core=0",
    ]
    if memory_rlimit:
        command.append(f"--as={limits.memory_bytes}")
    if ids is not None:
        # Without a pids cgroup this is the cap; per uid, so per conversation.
        command.append(f"--nproc={limits.processes}")
    return [*command, "--", *argv]


def plain_argv(argv: list[str], *, limits: Limits, cpu_seconds: int, file_bytes: int) -> list[str]:
    """STUDIO_SANDBOX=none: rlimits only (``run_process`` gives it a session of its own)."""
    return [
        "prlimit",
        f"--cpu={cpu_seconds}:{cpu_seconds + 1}",
        f"--fsize={file_bytes}",
        f"--nofile={limits.open_files}",
        f"--as={limits.memory_bytes}",
        "--core=0",
        "--",
        *argv,
    ]

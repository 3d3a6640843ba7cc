"""MCP stdio servers run sandboxed too.

An admin names a command; Studio starts it under bubblewrap, as it starts a
tool call: its own PID, IPC and UTS namespaces; no network unless the
server's entry allows it; the read-only system; a private ``/tmp``; a home
of its own (writable, kept between starts, in the workspace root); and,
read-only, the folders its command line names (its program, a script, a
virtualenv), never one that holds Studio's own files (the database, the
secret key, the workspaces, the media). As root it drops to a uid of its
own. So what Studio holds does not exist in it, whatever the server does.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from chat.tools.sandbox import (
    INSTALL_HINT,
    NAMESPACES,
    SANDBOX_UID_BASE,
    SandboxUnavailable,
    bwrap_path,
    can_drop_privileges,
    drop_to,
    sandbox_mode,
    system_view,
)

# The uid MCP servers run as when Studio runs as root: below the tools' range.
MCP_UID = SANDBOX_UID_BASE - 1


class ServerRefused(SandboxUnavailable):
    """The server's command line names a folder that holds Studio's own files."""


def server_argv(command: tuple[str, ...], *, name: str, network: bool) -> list[str]:
    """The command line that starts an MCP stdio server in its sandbox."""
    if sandbox_mode() == "none":
        return list(command)  # the admin's explicit choice: no isolation anywhere
    bwrap = bwrap_path()
    if bwrap is None:
        raise SandboxUnavailable(INSTALL_HINT)
    home = _home(name)
    argv = [bwrap, *NAMESPACES]
    if not network:
        argv.append("--unshare-net")
    if not can_drop_privileges():
        argv.append("--unshare-user")
    argv += system_view()
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # noqa: S108 - its own
    for path in readable(command):
        argv += _way_to(path, "0755") + ["--ro-bind", str(path), str(path)]
    argv += _way_to(home, "0711") + ["--bind", str(home), str(home)]
    argv += ["--chdir", str(home), "--setenv", "HOME", str(home), "--"]
    if can_drop_privileges():
        argv += drop_to(MCP_UID, MCP_UID)
    return [*argv, *command]


def readable(command: tuple[str, ...]) -> list[Path]:
    """The folders the command line names, read-only in the sandbox; raises
    ``ServerRefused`` for one that holds or lies within Studio's own files."""
    folders: list[Path] = []
    for index, word in enumerate(command):
        path = Path(word)
        if not path.is_absolute() or not path.exists():
            continue
        if path.is_dir():
            folders.append(path)
            continue
        folders.append(path.parent)
        if index == 0:
            folders += _interpreter(path)
    kept: list[Path] = []
    for folder in dict.fromkeys(f.resolve() for f in folders):
        if any(folder == Path(s) or folder.is_relative_to(s) for s in ("/usr", "/etc")):
            continue  # the read-only system is there already
        for own in _studio_files():
            if own == folder or own.is_relative_to(folder) or folder.is_relative_to(own):
                raise ServerRefused(
                    f"the command names {folder}, which holds Studio's own files ({own}): "
                    "move the server's files elsewhere"
                )
        kept.append(folder)
    return kept


def _interpreter(program: Path) -> list[Path]:
    """A program in a virtualenv needs the virtualenv and its base interpreter's prefix."""
    found: list[Path] = []
    venv = program.parent.parent
    if (venv / "pyvenv.cfg").exists():
        found.append(venv)
    real = program.resolve()
    if real != program:
        found.append(real.parent.parent)  # e.g. /opt/python3.11 for bin/python3.11
    return found


def _studio_files() -> list[Path]:
    """What no MCP server may see: the database file, the secret key, workspaces, media."""
    own = [settings.STUDIO_WORKSPACE_ROOT, Path(settings.MEDIA_ROOT)]
    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        own.append(Path(database["NAME"]))
    own.append(settings.SECRET_KEY_FILE)
    return [Path(p).resolve() for p in own]


def _home(name: str) -> Path:
    """The server's own folder, kept between its starts."""
    home = settings.STUDIO_WORKSPACE_ROOT.parent / "mcp-homes" / name
    home.mkdir(parents=True, exist_ok=True)
    if can_drop_privileges():
        os.chown(home, MCP_UID, MCP_UID)
        home.chmod(0o700)
    return home


def _way_to(path: Path, mode: str) -> list[str]:
    """The folders above ``path`` as bare, traversable directories in the sandbox."""
    way: list[str] = []
    for parent in reversed(path.parents[:-1]):
        way += ["--perms", mode, "--dir", str(parent)]
    return way

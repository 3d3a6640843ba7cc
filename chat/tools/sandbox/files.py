"""A workspace on disk, as the sandbox prepares, measures and writes it (no ORM)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from chat.tools.sandbox.host import can_drop_privileges

SANDBOX_UID_BASE = 200_000


_CONVERSATION_DIR = re.compile(r"^conversation-(\d+)$")


def sandbox_ids(workspace: Path) -> tuple[int, int] | None:
    """The uid/gid a tool of this workspace runs as, or None without root."""
    if not can_drop_privileges():
        return None
    match = _CONVERSATION_DIR.match(workspace.name)
    if match:
        offset = int(match.group(1)) % 1_000_000_000
    else:
        offset = 1_000_000_000 + zlib.crc32(str(workspace).encode()) % 100_000_000
    uid = SANDBOX_UID_BASE + offset
    return uid, uid


def prepare_workspace(path: Path) -> Path:
    """Create the working folder, private to the uid its tools run as."""
    path.mkdir(parents=True, exist_ok=True)
    ids = sandbox_ids(path)
    if ids is not None:
        os.chown(path, *ids)
        path.chmod(0o700)
        # The root of all workspaces must be traversable (not listable).
        path.parent.chmod((path.parent.stat().st_mode | 0o111) & ~0o066)
    return path


def walk_beneath(path: Path, *, max_depth: int | None = None) -> Iterator[tuple[os.DirEntry, str]]:
    """Every entry under ``path`` that is not a folder, never through a symlink,
    with its name relative to ``path``; folders deeper than ``max_depth`` are
    not entered, and what cannot be read is passed over."""
    stack = [(str(path), "", 0)]
    while stack:
        folder, prefix, depth = stack.pop()
        try:
            entries = os.scandir(folder)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                if not is_dir:
                    yield entry, prefix + entry.name
                elif max_depth is None or depth < max_depth:
                    stack.append((entry.path, f"{prefix}{entry.name}/", depth + 1))


def workspace_usage(path: Path, *, stop_above: int | None = None) -> int:
    """Bytes used under ``path`` (stops counting once past ``stop_above``)."""
    total = 0
    for entry, _ in walk_beneath(path):
        try:
            # Allocated blocks, so sparse files count as what they cost.
            total += entry.stat(follow_symlinks=False).st_blocks * 512
        except OSError:
            continue
        if stop_above is not None and total > stop_above:
            return total
    return total


def write_beneath(root: Path, name: str, chunks) -> None:
    """Write ``chunks`` as ``name`` under ``root`` (folders made as needed),
    never through a symlink, replacing what had that name; owned by the
    uid the root's tools run as."""
    parts = PurePosixPath(name).parts
    if not parts or PurePosixPath(name).is_absolute() or any(p in (".", "..") for p in parts):
        raise OSError(f"not a name under the workspace: {name}")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_DIRECTORY
    ids = sandbox_ids(root)
    fds = [os.open(root, flags)]
    try:
        for folder in parts[:-1]:
            try:
                os.mkdir(folder, 0o700, dir_fd=fds[-1])
                if ids is not None:
                    os.chown(folder, *ids, dir_fd=fds[-1], follow_symlinks=False)
            except FileExistsError:
                pass
            fds.append(os.open(folder, flags, dir_fd=fds[-1]))
        folder = fds[-1]
        temporary = f".studio-{secrets.token_hex(8)}"
        fd = os.open(
            temporary,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=folder,
        )
        try:
            with os.fdopen(fd, "wb", closefd=False) as out:
                for chunk in chunks:
                    out.write(chunk)
            if ids is not None:
                os.fchown(fd, *ids)
            os.close(fd)
            # rename replaces a symlink of that name itself, never its target.
            os.replace(temporary, parts[-1], src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=folder)
            raise
    finally:
        for fd in reversed(fds):
            os.close(fd)

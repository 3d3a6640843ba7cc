"""Images a tool call leaves in its workspace, to be shown under its output.

A call's images are the image files (by name) that are new or changed in
the workspace when it ends. Each, up to STUDIO_IMAGE_MAX_MB, is copied into
Studio's own storage before the conversation's next call can run, and
pages serve that copy (``key``): a page never reads a workspace, where a
tool may swap any folder for a link. Larger ones are only listed. The
model is told names and sizes, never sent the bytes.
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".svg": "image/svg+xml",
}
# A workspace walked for images stops after this many entries (a huge tree
# costs a bounded look, never a stalled run).
MAX_ENTRIES = 5000
# At most this many images of one call are copied and shown; the rest are listed.
MAX_KEPT = 20
# Where the copies live in the default storage, one folder per workspace.
STORAGE_DIR = "tool-images"


def max_bytes() -> int:
    from django.conf import settings

    return int(settings.STUDIO_IMAGE_MAX_MB * 1024 * 1024)


def snapshot(workspace: Path) -> dict[str, tuple[int, int]]:
    """(mtime, size) of every image file under ``workspace``, by relative path."""
    found: dict[str, tuple[int, int]] = {}
    seen = 0
    stack = [workspace]
    while stack and seen < MAX_ENTRIES:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    if Path(entry.name).suffix.lower() in IMAGE_TYPES:
                        info = entry.stat(follow_symlinks=False)
                        relative = os.path.relpath(entry.path, workspace)
                        found[relative] = (info.st_mtime_ns, info.st_size)
            except OSError:
                continue
    return found


@dataclass(frozen=True)
class Produced:
    name: str  # relative to the workspace
    size: int
    mime: str
    shown: bool
    key: str = ""  # the copy's name under its workspace's storage folder ("" if none)

    def as_dict(self) -> dict:
        found = {"name": self.name, "size": self.size, "mime": self.mime, "shown": self.shown}
        return {**found, "key": self.key} if self.key else found


def produced(workspace: Path, before: dict[str, tuple[int, int]]) -> list[Produced]:
    """Image files new or changed since ``before``, in name order."""
    limit = max_bytes()
    after = snapshot(workspace)
    return [
        Produced(
            name=name,
            size=size,
            mime=IMAGE_TYPES[Path(name).suffix.lower()],
            shown=size <= limit,
        )
        for name, (mtime, size) in sorted(after.items())
        if before.get(name) != (mtime, size)
    ]


def keep(workspace: Path, images: list[Produced]) -> list[Produced]:
    """Copy what is shown of ``images`` into Studio's storage; each copy's ``key`` set.

    An image that cannot be read safely (a link anywhere on its path, not a
    regular file, grown past the cap) is only listed.
    """
    kept = []
    for number, image in enumerate(images):
        data = None
        if image.shown and number < MAX_KEPT:
            data = read_beneath(workspace, image.name, limit=max_bytes())
        if data is None:
            kept.append(replace(image, shown=False))
            continue
        key = store(workspace=workspace, name=image.name, data=data)
        kept.append(replace(image, size=len(data), key=key))
    return kept


def store(*, workspace: Path, name: str, data: bytes) -> str:
    """Save ``data`` as an image of ``workspace`` in the default storage; returns its key."""
    wanted = storage_name(workspace.name, f"{secrets.token_urlsafe(9)}/{PurePosixPath(name).name}")
    # A storage may save under another name than the one asked for (a name
    # taken, another backend's rules): the key is the name it saved under.
    saved = default_storage.save(wanted, ContentFile(data))
    return saved.removeprefix(storage_name(workspace.name, ""))


def storage_name(folder: str, key: str) -> str:
    return f"{STORAGE_DIR}/{folder}/{key}"


def open_beneath(root: Path, name: str) -> int | None:
    """A descriptor of the regular file ``name`` under ``root``, reached without
    following any link; None for anything else. The caller closes it.

    Each path component is opened relative to the one before it with
    ``O_NOFOLLOW``, so a tool that swaps a folder for a symlink meanwhile
    makes the open fail instead of leading it out of the workspace.
    """
    path = PurePosixPath(name)
    parts = path.parts
    if not parts or path.is_absolute() or any(p in ("", ".", "..") for p in parts):
        return None
    if "\x00" in name:
        return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    folders: list[int] = []
    try:
        folders.append(os.open(root, flags | os.O_DIRECTORY))
        for folder in parts[:-1]:
            folders.append(os.open(folder, flags | os.O_DIRECTORY, dir_fd=folders[-1]))
        # O_NONBLOCK: a FIFO named like a file must not hang the open.
        fd = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=folders[-1])
    except OSError:
        return None
    finally:
        for folder in reversed(folders):
            os.close(folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return fd


def read_beneath(root: Path, name: str, *, limit: int) -> bytes | None:
    """The bytes of the regular file ``name`` under ``root``, never through a
    link (``open_beneath``); None for anything odd, or a file over ``limit`` bytes."""
    fd = open_beneath(root, name)
    if fd is None:
        return None
    try:
        if os.fstat(fd).st_size > limit:
            return None
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 16):
            total += len(chunk)
            if total > limit:
                return None  # it grew while we read
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def notice_for(images: list[Produced]) -> str:
    """The line the model reads about them."""
    if not images:
        return ""
    listed = ", ".join(f"{i.name} ({human_size(i.size)})" for i in images)
    return f"\n[Files created: {listed}. They are shown to the user.]"


def human_size(size: int) -> str:
    for unit in ("B", "KB", "MB"):
        if size < 1024 or unit == "MB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"

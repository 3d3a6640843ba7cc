"""Images a tool call leaves in its workspace, to be shown under its output.

A call's images are the image files (by name) that are new or changed in
the workspace when it ends. Each is shown inline up to STUDIO_IMAGE_MAX_MB;
larger ones are only listed. The model is told names and sizes, never sent
the bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

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

    def as_dict(self) -> dict:
        return {"name": self.name, "size": self.size, "mime": self.mime, "shown": self.shown}


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

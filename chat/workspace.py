"""A conversation's workspace as its member sees it: files in, a listing, files out.

The workspace is also where its tools run, as a uid of their own, so
anything in it may have been made by a hostile model: a name may be a
symlink to a server file, a folder may be swapped for one meanwhile. Every
open here goes component by component with ``O_NOFOLLOW`` from the
workspace's own descriptor, and an upload replaces a name with ``rename``
(which replaces a symlink itself, never what it points to).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings

from chat.models import Conversation
from chat.tools.images import human_size, open_beneath
from chat.tools.sandbox import MB, prepare_workspace, workspace_usage, write_beneath

# The listing stops here: a tool that made a million files costs a bounded look.
MAX_LISTED = 200
MAX_DEPTH = 6
NAME_LENGTH = 200
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class UploadRefused(Exception):
    """An upload Studio will not write; the message says why, for the member."""


@dataclass(frozen=True)
class WorkspaceFile:
    name: str  # relative to the workspace, with "/" between folders
    size: int
    modified: datetime

    @property
    def size_text(self) -> str:
        return human_size(self.size)


def workspace_files(conversation: Conversation) -> tuple[list[WorkspaceFile], bool]:
    """Its regular files, newest first (never through a symlink), and whether
    the listing stopped at ``MAX_LISTED``."""
    found: list[WorkspaceFile] = []
    stack = [(str(conversation.workspace), "", 0)]
    while stack:
        path, prefix, depth = stack.pop()
        try:
            entries = os.scandir(path)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if depth < MAX_DEPTH:
                            stack.append((entry.path, f"{prefix}{entry.name}/", depth + 1))
                        continue
                    if not entry.is_file(follow_symlinks=False):
                        continue  # a symlink, a FIFO, a socket: not a file to hand out
                    if entry.name.startswith(".studio"):
                        continue  # Studio's own (a session's mark, a write under way)
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                found.append(
                    WorkspaceFile(
                        name=prefix + entry.name,
                        size=info.st_size,
                        modified=datetime.fromtimestamp(info.st_mtime, tz=UTC),
                    )
                )
                if len(found) >= MAX_LISTED:
                    return _newest_first(found), True
    return _newest_first(found), False


def _newest_first(files: list[WorkspaceFile]) -> list[WorkspaceFile]:
    return sorted(files, key=lambda f: (f.modified, f.name), reverse=True)


def workspace_summary(conversation: Conversation, *, limit: int = 30) -> str:
    """The files, as the model is told of them each turn."""
    files, more = workspace_files(conversation)
    if not files:
        return "none yet"
    listed = ", ".join(f"{f.name} ({f.size_text})" for f in files[:limit])
    return listed + (" and more" if more or len(files) > limit else "")


def upload_limit() -> int:
    return int(settings.STUDIO_UPLOAD_MAX_MB * MB)


def clean_upload_name(name: str) -> str:
    """A browser's file name as a plain name in the workspace's top folder."""
    # Browsers send a base name; some older ones sent a whole path.
    name = name.replace("\\", "/").rsplit("/", 1)[-1].strip()
    if not name or name in (".", "..") or "\x00" in name or name.startswith("."):
        raise UploadRefused(f"“{name or '(no name)'}” is not a file name Studio keeps.")
    if len(name) > NAME_LENGTH:
        raise UploadRefused(f"File names are limited to {NAME_LENGTH} characters.")
    return name


def workspace_upload(conversation: Conversation, uploads) -> list[WorkspaceFile]:
    """Save the member's uploaded files (Django ``UploadedFile``s): all of them,
    or (``UploadRefused``, saying why) none when any cannot be kept."""
    if not uploads:
        raise UploadRefused("Choose a file to upload.")
    names = [clean_upload_name(upload.name) for upload in uploads]
    if len(set(names)) != len(names):
        raise UploadRefused("Two of those files have the same name.")
    for name, upload in zip(names, uploads, strict=True):
        _fits_alone(name, upload.size)
    workspace = prepare_workspace(conversation.workspace)
    _fits_in(conversation, "Those files", sum(upload.size for upload in uploads))
    return [
        _save(workspace, name, upload.chunks(), upload.size)
        for name, upload in zip(names, uploads, strict=True)
    ]


def _fits_alone(name: str, size: int) -> None:
    if size > upload_limit():
        raise UploadRefused(
            f"{name} is {human_size(size)}; uploads are limited to "
            f"{settings.STUDIO_UPLOAD_MAX_MB:g} MB each."
        )


def _fits_in(conversation: Conversation, what: str, size: int) -> None:
    quota = settings.STUDIO_WORKSPACE_QUOTA_MB * MB
    used = workspace_usage(conversation.workspace, stop_above=quota)
    if used + size > quota:
        raise UploadRefused(
            f"{what} ({human_size(size)}) would not fit: the workspace holds {human_size(used)} "
            f"of its {settings.STUDIO_WORKSPACE_QUOTA_MB} MB. Delete files first."
        )


def _save(workspace: Path, name: str, chunks, size: int) -> WorkspaceFile:
    """Write a checked upload into the workspace's top folder under ``name``,
    replacing a file (or a symlink) of that name; the tools' uid owns it."""

    def bounded():
        written = 0
        for chunk in chunks:
            written += len(chunk)
            if written > size:
                raise UploadRefused(f"{name} grew while it was uploaded.")
            yield chunk

    write_beneath(workspace, name, bounded())
    return WorkspaceFile(name=name, size=size, modified=datetime.now(tz=UTC))


def workspace_open(conversation: Conversation, name: str):
    """(open binary file, size) of the regular file ``name`` in the workspace,
    reached without following any symlink; None for anything else."""
    fd = open_beneath(conversation.workspace, name)
    if fd is None:
        return None
    return os.fdopen(fd, "rb"), os.fstat(fd).st_size

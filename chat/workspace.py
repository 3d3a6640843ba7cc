"""A conversation's workspace as its member sees it: files in, a listing, files out.

The workspace is also where its tools run, as a uid of their own, so
anything in it may have been made by a hostile model: a name may be a
symlink to a server file, a folder may be swapped for one meanwhile. Every
open here goes component by component with ``O_NOFOLLOW`` from the
workspace's own descriptor, and an upload replaces a name with ``rename``
(which replaces a symlink itself, never what it points to).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import F

from chat.models import Conversation
from chat.tools.images import human_size, open_beneath
from chat.tools.sandbox import (
    MB,
    prepare_workspace,
    walk_beneath,
    workspace_usage,
    write_beneath,
)

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
    for entry, name in walk_beneath(conversation.workspace, max_depth=MAX_DEPTH):
        try:
            if not entry.is_file(follow_symlinks=False):
                continue  # a symlink, a FIFO, a socket: not a file to hand out
            if entry.name.startswith(".studio"):
                continue  # Studio's own (a session's mark, a write under way)
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        found.append(
            WorkspaceFile(
                name=name,
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
    """A browser's file name as a plain name in the workspace's top folder, in
    Unicode's composed form (``café`` typed or pasted is one name)."""
    # Browsers send a base name; some older ones sent a whole path.
    name = unicodedata.normalize("NFC", name.replace("\\", "/").rsplit("/", 1)[-1].strip())
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
    with _room(conversation, "Those files", sum(upload.size for upload in uploads)):
        return _save_all(workspace, names, uploads)


# Files sent with a message: how many it may name, and how it names them.
MAX_ATTACHED = 20
ATTACHED_TEXT = "Files added to the working folder with this message: {names}."


def attached_note(conversation: Conversation, names: object) -> str | None:
    """The line a message gets for the files sent with it (uploaded a moment
    before), or None when ``names`` is not a short list of this workspace's
    files: the model is never told of a file that is not there."""
    if not isinstance(names, list) or not names or len(names) > MAX_ATTACHED:
        return None
    folder = conversation.workspace
    clean = []
    for name in names:
        if not isinstance(name, str) or len(name) > NAME_LENGTH:
            return None
        try:
            if clean_upload_name(name) != name or not (folder / name).is_file():
                return None
        except UploadRefused:
            return None
        clean.append(name)
    return ATTACHED_TEXT.format(names=", ".join(dict.fromkeys(clean)))


def with_attached(text: str, note: str) -> str:
    return f"{text.rstrip()}\n\n{note}" if text.strip() else note


def _fits_alone(name: str, size: int) -> None:
    if size > upload_limit():
        raise UploadRefused(
            f"{name} is {human_size(size)}; uploads are limited to "
            f"{settings.STUDIO_UPLOAD_MAX_MB:g} MB each."
        )


@contextlib.contextmanager
def _room(conversation: Conversation, what: str, size: int):
    """Hold ``size`` bytes of the workspace's quota while the upload is written.

    The room is reserved on the conversation's row, which the check locks,
    so uploads in flight in any process count: a file is either reserved or
    on disk (or both, counted twice: never less) when the next one looks.
    """
    quota = settings.STUDIO_WORKSPACE_QUOTA_MB * MB
    with transaction.atomic():
        reserved = (
            Conversation.objects.select_for_update()
            .filter(pk=conversation.pk)
            .values_list("upload_reserved_bytes", flat=True)
            .get()
        )
        used = workspace_usage(conversation.workspace, stop_above=quota)
        if used + reserved + size > quota:
            raise UploadRefused(
                f"{what} ({human_size(size)}) would not fit: the workspace holds "
                f"{human_size(used + reserved)} of its {settings.STUDIO_WORKSPACE_QUOTA_MB} MB"
                f"{' (with uploads in progress)' if reserved else ''}. Delete files first."
            )
        Conversation.objects.filter(pk=conversation.pk).update(
            upload_reserved_bytes=F("upload_reserved_bytes") + size
        )
    try:
        yield
    finally:
        Conversation.objects.filter(pk=conversation.pk).update(
            upload_reserved_bytes=F("upload_reserved_bytes") - size
        )


def _save_all(workspace: Path, names: list[str], uploads) -> list[WorkspaceFile]:
    """Write every upload under a temporary name, then put each in place: a
    name that is a folder refuses them all before anything is written."""
    folder = os.open(workspace, _FLAGS | os.O_DIRECTORY)
    staged: list[tuple[str, str]] = []
    try:
        present = _top_entries(folder)
        for name in names:
            for existing in present.get(name, []):
                if stat.S_ISDIR(os.lstat(existing, dir_fd=folder).st_mode):
                    raise UploadRefused(
                        f"{name} is a folder in the workspace: rename one of them first."
                    )
        token = secrets.token_hex(6)
        for n, (name, upload) in enumerate(zip(names, uploads, strict=True)):
            temporary = f".upload-{token}-{n}"
            write_beneath(workspace, temporary, _bounded(name, upload.chunks(), upload.size))
            staged.append((temporary, name))
        for temporary, name in staged:
            # The same name written another way (café decomposed) is replaced too.
            for existing in present.get(name, []):
                if existing != name:
                    os.unlink(existing, dir_fd=folder)
            os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
    except OSError as exc:
        raise UploadRefused(f"Studio could not write those files ({exc.strerror}).") from None
    finally:
        for temporary, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=folder)
        os.close(folder)
    now = datetime.now(tz=UTC)
    return [
        WorkspaceFile(name=name, size=upload.size, modified=now)
        for name, upload in zip(names, uploads, strict=True)
    ]


def _top_entries(folder: int) -> dict[str, list[str]]:
    """The top folder's names, by their composed form."""
    found: dict[str, list[str]] = {}
    for entry in os.listdir(folder):
        found.setdefault(unicodedata.normalize("NFC", entry), []).append(entry)
    return found


def _bounded(name: str, chunks, size: int):
    written = 0
    for chunk in chunks:
        written += len(chunk)
        if written > size:
            raise UploadRefused(f"{name} grew while it was uploaded.")
        yield chunk


def workspace_open(conversation: Conversation, name: str):
    """(open binary file, size) of the regular file ``name`` in the workspace,
    reached without following any symlink; None for anything else."""
    fd = open_beneath(conversation.workspace, name)
    if fd is None:
        return None
    return os.fdopen(fd, "rb"), os.fstat(fd).st_size

"""The workspace quota holds while uploads overlap (issue 55).

Twelve parallel 24 MB uploads split over two processes were all kept: each
checked the disk before any other had written. Here two uploads overlap
for certain: the first is held mid-write (its chunks wait on an event)
while the second checks the quota, each on its own database connection as
two processes would be. The room the first reserved on the row counts.
"""

from __future__ import annotations

import threading

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connections

from chat.workspace import UploadRefused, workspace_upload
from tests.factories import make_conversation

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anydb]

BOUND = 10.0
MB = 1024 * 1024


class HeldUpload(SimpleUploadedFile):
    """An upload whose writing waits until ``release`` is set (after ``writing``)."""

    def __init__(self, name: str, size: int) -> None:
        super().__init__(name, b"x" * size)
        self.writing, self.release = threading.Event(), threading.Event()

    def chunks(self, chunk_size=None):
        self.writing.set()
        assert self.release.wait(BOUND)
        yield from super().chunks(chunk_size)


def test_an_upload_being_written_holds_its_room(alice, settings, tmp_path):
    settings.STUDIO_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.STUDIO_WORKSPACE_ROOT.mkdir()
    settings.STUDIO_WORKSPACE_QUOTA_MB = 3
    conversation = make_conversation(alice)
    first = HeldUpload("first.bin", 2 * MB)
    outcome: dict = {}

    def upload_first() -> None:
        try:
            outcome["first"] = workspace_upload(conversation, [first])
        finally:
            connections.close_all()

    writer = threading.Thread(target=upload_first)
    writer.start()
    try:
        assert first.writing.wait(BOUND)  # checked and writing, nothing on disk yet
        with pytest.raises(UploadRefused, match="uploads in progress"):
            workspace_upload(conversation, [SimpleUploadedFile("second.bin", b"y" * 2 * MB)])
    finally:
        first.release.set()
        writer.join(BOUND)
    assert not writer.is_alive() and [f.name for f in outcome["first"]] == ["first.bin"]
    assert sorted(p.name for p in conversation.workspace.iterdir()) == ["first.bin"]
    conversation.refresh_from_db()
    assert conversation.upload_reserved_bytes == 0
    # Once written, the room is the file's: a second one still does not fit.
    with pytest.raises(UploadRefused, match="would not fit"):
        workspace_upload(conversation, [SimpleUploadedFile("second.bin", b"y" * 2 * MB)])

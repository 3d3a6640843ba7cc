"""A chat too long for one WebSocket message, through a real daphne."""

from __future__ import annotations

import re

import pytest

from chat import display, render
from chat.models import Message
from tests.factories import make_conversation
from tests.helpers.clients import Tab, session_cookie
from tests.helpers.live import LiveServer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(workspace_root, tmp_path):
    live = LiveServer(
        log_path=tmp_path / "daphne.log", STUDIO_WORKSPACE_ROOT=str(workspace_root)
    ).start()
    yield live
    live.stop()


def test_a_transcript_over_a_mebibyte_still_catches_the_tab_up(server, alice):
    """daphne sends no message over 1 MiB: one catch-up frame used to fail on
    every connect, and the tab reconnected for ever."""
    conversation = make_conversation(alice)
    for n in range(150):
        Message.objects.create(conversation=conversation, role="user", content=f"ask-{n}")
        Message.objects.create(
            conversation=conversation, role="assistant", content=f"reply-{n} " + "words " * 1300
        )
    frames = render.transcript_frames(conversation, display.transcript_items(conversation))
    assert sum(len(frame.encode()) for frame in frames) > 1 << 20

    tab = Tab(server.ws_url, conversation.pk, session_cookie(alice), origin=server.url)
    try:
        caught_up = tab.until('id="run-controls"')
        assert tab.reconnects == 0
        assert re.search(r"\breply-149\b", caught_up)
        tab.send("hello")  # the socket is live: the member's message comes back
        tab.until("hello")
    finally:
        tab.close()

"""A member's socket gives its channel back when it closes (a real daphne on Redis)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from channels.layers import get_channel_layer
from redis import Redis

from tests.factories import make_conversation
from tests.helpers.clients import Tab, session_cookie
from tests.helpers.live import LiveServer

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

BOUND = 20


@pytest.fixture
def server(workspace_root, tmp_path, settings):
    live = LiveServer(
        log_path=tmp_path / "daphne.log",
        REDIS_URL=settings.REDIS_URL,
        STUDIO_WORKSPACE_ROOT=str(workspace_root),
    ).start()
    yield live
    live.stop()


def _socket_channels(redis: Redis) -> int:
    """Channels subscribed in Redis for a consumer or a process (``…specific.<hex>``)."""
    return len(redis.pubsub_channels("*specific.*"))


def _until_at_most(redis: Redis, count: int) -> int:
    deadline = time.monotonic() + BOUND
    while (now := _socket_channels(redis)) > count and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


def test_sockets_closed_while_their_group_is_busy_leave_no_channel(server, alice, settings):
    """Channels' loop used to end a consumer right after a message reached its
    channel, and channels-redis then kept that channel subscribed for good."""
    conversation = make_conversation(alice)
    session = session_cookie(alice)
    redis = Redis.from_url(settings.REDIS_URL)
    first = Tab(server.ws_url, conversation.pk, session, origin=server.url)
    first.until('id="transcript"')
    open_ = _socket_channels(redis)
    first.close()
    before = _until_at_most(redis, open_ - 1)  # the process's own channels stay

    # Fragments stream into the conversation's group all along, so each
    # socket below has messages arriving while it closes.
    stop = threading.Event()

    async def busy_group() -> None:
        layer = get_channel_layer()
        while not stop.is_set():
            await layer.group_send(conversation.group_name, {"type": "chat.fragment", "html": ""})
            await asyncio.sleep(0.001)

    pump = threading.Thread(target=asyncio.run, args=(busy_group(),), daemon=True)
    pump.start()
    try:
        for _ in range(10):
            tab = Tab(server.ws_url, conversation.pk, session, origin=server.url)
            tab.until('id="transcript"')
            tab.close()
    finally:
        stop.set()
        pump.join(BOUND)
    assert _until_at_most(redis, before) == before

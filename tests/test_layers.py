"""studio.layers: a single process's channel layer delivers as Channels' in-memory one does."""

from __future__ import annotations

import asyncio

from channels.layers import InMemoryChannelLayer, get_channel_layer

from studio import layers
from studio.layers import LocalChannelLayer

BOUND = 2.0  # seconds: no receive here may wait longer


async def receive(layer, channel) -> dict:
    return await asyncio.wait_for(layer.receive(channel), BOUND)


def test_a_process_without_redis_uses_it(settings):
    # (This module runs in the pass without services: no REDIS_URL.)
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "studio.layers.LocalChannelLayer"
    assert isinstance(get_channel_layer(), LocalChannelLayer)


async def test_a_group_send_reaches_its_members_and_no_one_else():
    layer = LocalChannelLayer()
    first, second, outsider = [await layer.new_channel() for _ in range(3)]
    await layer.group_add("chat-1", first)
    await layer.group_add("chat-1", second)
    await layer.group_add("chat-2", outsider)

    message = {"type": "chat.fragment", "html": "<p>hi</p>"}
    await layer.group_send("chat-1", message)

    assert await receive(layer, first) == message
    assert await receive(layer, second) == message
    # Each member has its own copy, as upstream's send gives it.
    assert layer.channels == {}
    await layer.group_send("chat-2", {"type": "chat.fragment", "html": "other"})
    assert (await receive(layer, outsider))["html"] == "other"


async def test_a_group_nobody_joined_takes_the_message_quietly():
    layer = LocalChannelLayer()
    await layer.group_send("nobody", {"type": "chat.fragment"})
    assert layer.channels == {} and layer.groups == {}


async def test_a_full_member_misses_the_message_and_the_others_get_it():
    layer = LocalChannelLayer(capacity=1)
    full, fine = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("chat-1", full)
    await layer.group_add("chat-1", fine)
    await layer.send(full, {"type": "first"})

    await layer.group_send("chat-1", {"type": "second"})

    assert await receive(layer, fine) == {"type": "second"}
    assert await receive(layer, full) == {"type": "first"}
    assert layer.channels.get(full) is None  # nothing more was queued for it


async def test_expired_messages_and_their_members_are_swept(monkeypatch):
    monkeypatch.setattr(layers, "SWEEP_SECONDS", 0.0)
    layer = LocalChannelLayer(expiry=0.05)
    gone, live = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("chat-1", gone)
    await layer.group_add("chat-1", live)
    await layer.group_send("chat-1", {"type": "old"})
    assert await receive(layer, live) == {"type": "old"}
    await asyncio.sleep(0.1)  # past the expiry: the sweep below must see it

    await layer.group_send("chat-1", {"type": "new"})

    # As upstream: the channel whose message expired unread leaves its groups.
    assert gone not in layer.groups["chat-1"]
    assert await receive(layer, live) == {"type": "new"}


async def test_the_sweep_runs_at_most_once_a_second(monkeypatch):
    sweeps = []
    monkeypatch.setattr(InMemoryChannelLayer, "_clean_expired", lambda self: sweeps.append(self))
    layer = LocalChannelLayer()
    channel = await layer.new_channel()
    await layer.group_add("chat-1", channel)
    for _ in range(100):
        await layer.group_send("chat-1", {"type": "x"})
        await receive(layer, channel)
    # The first send swept; the other 199 calls within the second did not.
    assert len(sweeps) == 1


async def test_a_member_receives_a_copy_that_later_changes_do_not_reach():
    layer = LocalChannelLayer()
    channel = await layer.new_channel()
    plain = {"type": "chat.fragment", "html": "<p>hi</p>", "pending": True, "seq": 3}
    nested = {"type": "inbox.changed", "came": ["a1"], "extra": {"k": "v"}}
    await layer.send(channel, plain)
    await layer.send(channel, nested)
    # The sender changes its messages after sending them.
    plain["html"] = "changed"
    nested["came"].append("a2")
    nested["extra"]["k"] = "changed"

    assert await receive(layer, channel) == {
        "type": "chat.fragment",
        "html": "<p>hi</p>",
        "pending": True,
        "seq": 3,
    }
    assert await receive(layer, channel) == {
        "type": "inbox.changed",
        "came": ["a1"],
        "extra": {"k": "v"},
    }


async def test_a_channel_gets_one_queue_not_one_per_send_and_receive(monkeypatch):
    built = []

    class CountedQueue(asyncio.Queue):
        def __init__(self, *args, **kwargs) -> None:
            built.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(layers.asyncio, "Queue", CountedQueue)
    layer = LocalChannelLayer()
    channel = await layer.new_channel()
    for i in range(50):
        await layer.send(channel, {"type": "x", "i": i})
    assert [(await receive(layer, channel))["i"] for _ in range(50)] == list(range(50))

    assert len(built) == 1
    assert layer.channels == {}  # emptied, it is dropped as upstream drops it

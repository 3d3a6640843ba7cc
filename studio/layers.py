"""The channel layer of a single process: Channels' in-memory layer, at the cost of a group.

Upstream's ``InMemoryChannelLayer`` sweeps every channel and every group of
the process for expired messages and memberships on each ``group_send`` and
each ``receive``, and makes a task per member (gathered with
``as_completed``) for each group send. Every fragment then costs the event
loop in proportion to every open tab of the process: a group send to one
member and its receive took 0.48 ms with a thousand other sockets open,
0.04 ms with none (``bench/layer_hop.py --layer memory --sockets 1000``).
Here the sweep runs at most once a second (expiry is counted in minutes and
days) and a group send is a loop of puts: 0.01 ms either way. What a send
delivers, ``ChannelFull`` and expiry are upstream's.

Each send and each receive upstream also builds an ``asyncio.Queue`` it
throws away (the default of a ``setdefault``), and each send copies the
message with ``deepcopy``, which walks even a message of plain strings in
Python. Here the queue is built only for a channel that has none, and a
message whose values are all immutable (every message Studio sends: ids,
flags and HTML) is copied as a dict, which is what ``deepcopy`` makes of
it; any other message is still deep-copied.
"""

from __future__ import annotations

import asyncio
import time
from copy import deepcopy

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer

SWEEP_SECONDS = 1.0
# Values deepcopy returns as they are: a dict of these is copied by dict().
_ATOMIC = frozenset({str, int, float, bool, bytes, type(None)})


def _copy(message: dict) -> dict:
    """What ``deepcopy(message)`` returns, without its walk when nothing is nested."""
    for value in message.values():
        if type(value) not in _ATOMIC:
            return deepcopy(message)
    return dict(message)


class LocalChannelLayer(InMemoryChannelLayer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._swept_at = float("-inf")

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._swept_at < SWEEP_SECONDS:
            return
        self._swept_at = now
        super()._clean_expired()

    def _queue(self, channel: str) -> asyncio.Queue:
        queue = self.channels.get(channel)
        if queue is None:
            queue = self.channels[channel] = asyncio.Queue(maxsize=self.get_capacity(channel))
        return queue

    async def send(self, channel: str, message: dict) -> None:
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message
        try:
            self._queue(channel).put_nowait((time.time() + self.expiry, _copy(message)))
        except asyncio.QueueFull:
            raise ChannelFull(channel) from None

    async def receive(self, channel: str) -> dict:
        self.require_valid_channel_name(channel)
        self._clean_expired()
        queue = self._queue(channel)
        try:
            _, message = await queue.get()
        finally:
            if queue.empty():
                self.channels.pop(channel, None)
        return message

    async def group_send(self, group: str, message: dict) -> None:
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        # A copy: the group may change while the sends run (each is awaited).
        for channel in list(self.groups.get(group, ())):
            try:
                await self.send(channel, message)
            except ChannelFull:
                pass  # as upstream: a full member misses this one

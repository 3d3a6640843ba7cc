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
"""

from __future__ import annotations

import time

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer

SWEEP_SECONDS = 1.0


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

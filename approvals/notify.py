"""Channel-layer sends from synchronous code.

Only services call these, and only after commit. Delivery is at most once:
a failed send is logged, never raised, because the row is the truth and the
waiter re-reads it on its poll interval. A send that fails on a connection
Redis closed (it restarted) is retried once on a fresh one.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)


def _deliver(what: str, target: str, message: dict, send) -> bool:
    for attempt in (1, 2):
        try:
            async_to_sync(send)(target, message)
            return True
        except ChannelFull:
            logger.warning("%s %s is full; %s dropped", what, target, message.get("type"))
            return False
        except Exception:
            if attempt == 2:
                logger.warning(
                    "%s send to %s failed; %s dropped",
                    what,
                    target,
                    message.get("type"),
                    exc_info=True,
                )
    return False


def member_group(user_id: int) -> str:
    """Every socket of one member (session checks; their approvals inbox)."""
    return f"member.{user_id}"


def layer_send(channel: str, message: dict) -> bool:
    layer = get_channel_layer()
    if layer is None or not channel:
        return False
    return _deliver("channel", channel, message, layer.send)


def group_send(group: str, message: dict) -> bool:
    layer = get_channel_layer()
    if layer is None:
        return False
    return _deliver("group", group, message, layer.group_send)

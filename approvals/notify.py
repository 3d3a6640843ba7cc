"""Channel-layer sends from synchronous code.

Only services call these, and only after commit. Delivery is at most once:
a failed send is logged, never raised, because the row is the truth and the
waiter re-reads it on its poll interval.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)


def layer_send(channel: str, message: dict) -> bool:
    layer = get_channel_layer()
    if layer is None or not channel:
        return False
    try:
        async_to_sync(layer.send)(channel, message)
    except ChannelFull:
        logger.warning("channel %s is full; %s dropped", channel, message.get("type"))
        return False
    except Exception:
        logger.warning("send to %s failed; %s dropped", channel, message.get("type"), exc_info=True)
        return False
    return True


def group_send(group: str, message: dict) -> bool:
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        async_to_sync(layer.group_send)(group, message)
    except ChannelFull:
        logger.warning("group %s is full; %s dropped", group, message.get("type"))
        return False
    except Exception:
        logger.warning(
            "group send to %s failed; %s dropped", group, message.get("type"), exc_info=True
        )
        return False
    return True

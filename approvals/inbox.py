"""One channel-layer inbox per process.

Each server process lazily creates one channel on its event loop and one task
that receives from it. Rows record the inbox of the process whose run waits on
them; a decision taken in another process is sent here and wakes the local
slot. Handlers are registered by type so the chat app can add ``run.cancel``
without an import cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)

_handlers: dict[str, Callable[[dict], None]] = {}
_state: dict[str, object] = {"name": "", "loop": None, "task": None}


def register_handler(message_type: str, handler: Callable[[dict], None]) -> None:
    _handlers[message_type] = handler


def current_inbox() -> str:
    """This process's inbox name, or "" when no event loop has created one yet."""
    task = _state["task"]
    if task is None or task.done():
        return ""
    return str(_state["name"])


def server_loop() -> asyncio.AbstractEventLoop | None:
    loop = _state["loop"]
    if loop is None or loop.is_closed():
        return None
    return loop


async def ensure_inbox() -> str:
    """Create this process's inbox and its listener, once per event loop."""
    loop = asyncio.get_running_loop()
    task = _state["task"]
    if _state["loop"] is loop and task is not None and not task.done():
        return str(_state["name"])
    layer = get_channel_layer()
    name = await layer.new_channel("studio.inbox.")
    # Re-check: another coroutine may have won the race while we awaited.
    task = _state["task"]
    if _state["loop"] is loop and task is not None and not task.done():
        return str(_state["name"])
    _state.update(name=name, loop=loop, task=loop.create_task(_listen(layer, name)))
    return name


async def stop_inbox() -> None:
    task = _state["task"]
    _state.update(name="", loop=None, task=None)
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def dispatch(message: dict) -> None:
    handler = _handlers.get(message.get("type", ""))
    if handler is None:
        logger.warning("inbox: no handler for %r", message.get("type"))
        return
    try:
        handler(message)
    except Exception:
        logger.exception("inbox: handler for %r failed", message.get("type"))


async def _listen(layer, name: str) -> None:
    delay = 0.1
    while True:
        try:
            message = await layer.receive(name)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Redis restarting: keep trying; waiters poll their rows meanwhile.
            logger.warning(
                "inbox %s: receive failed, retrying in %.1fs", name, delay, exc_info=True
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            continue
        delay = 0.1
        dispatch(message)

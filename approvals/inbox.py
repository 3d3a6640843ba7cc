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
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from channels.layers import get_channel_layer
from django.conf import settings

logger = logging.getLogger(__name__)

_handlers: dict[str, Callable[[dict], None]] = {}
_state: dict[str, object] = {"name": "", "loop": None, "task": None, "watch": None, "poll": None}
# The poller's queries get a thread of their own: a full agent pool or a busy
# thread-sensitive executor must not delay the fallback that wakes waiters.
_POLL_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="studio-poll")
# Bound methods called (on the event loop) when Redis restarted and lost every
# group. Weak: a consumer that crashed without disconnect() must not linger.
_reset_callbacks: dict[int, weakref.WeakMethod] = {}


def on_layer_reset(callback: Callable[[], Awaitable[None]]) -> None:
    _reset_callbacks[id(callback.__self__)] = weakref.WeakMethod(callback)


def off_layer_reset(callback: Callable[[], Awaitable[None]]) -> None:
    _reset_callbacks.pop(id(callback.__self__), None)


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
    # Default prefix on purpose: channels-redis receives all of a process's
    # "specific." channels through one Redis list under one lock; a channel
    # with another prefix would hold that lock on its own list and starve
    # every consumer of the process.
    name = await layer.new_channel()
    # Re-check: another coroutine may have won the race while we awaited.
    task = _state["task"]
    if _state["loop"] is loop and task is not None and not task.done():
        return str(_state["name"])
    _state.update(name=name, loop=loop, task=loop.create_task(_listen(layer, name)))
    _state["poll"] = loop.create_task(_poll_waiters(settings.STUDIO_APPROVAL_POLL_SECONDS))
    if settings.REDIS_URL:
        _state["watch"] = loop.create_task(
            _watch_redis(settings.REDIS_URL, settings.STUDIO_LAYER_WATCH_SECONDS)
        )
    return name


async def stop_inbox() -> None:
    tasks = [_state["task"], _state["watch"], _state["poll"]]
    _state.update(name="", loop=None, task=None, watch=None, poll=None)
    for task in tasks:
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


async def _watch_redis(url: str, interval: float) -> None:
    """Notice a Redis restart (its run_id changes) and tell the consumers.

    Redis keeps nothing on disk here, so a restart forgets every group: each
    consumer must join again and re-send its tab the current state. One INFO
    call per process per interval, whatever the number of sockets.
    """
    import redis.asyncio as aioredis

    client = aioredis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    last = None
    try:
        while True:
            try:
                run_id = (await client.info("server")).get("run_id")
            except asyncio.CancelledError:
                raise
            except Exception:
                run_id = None  # down for now; compare again once it is back
            if run_id and last and run_id != last:
                callbacks = [ref() for ref in list(_reset_callbacks.values())]
                callbacks = [c for c in callbacks if c is not None]
                logger.warning("Redis restarted: re-joining %d socket(s)", len(callbacks))
                for callback in callbacks:
                    try:
                        await callback()
                    except Exception:
                        logger.warning("layer reset callback failed", exc_info=True)
            if run_id:
                last = run_id
            await asyncio.sleep(interval)
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()


def _poll_once() -> None:
    from django.db import connections

    from approvals.services import approval_poll_waiters

    try:
        approval_poll_waiters()
    finally:
        connections.close_all()


async def _poll_waiters(interval: float) -> None:
    """Every interval, re-read this process's waiting rows (covers lost wakes)."""
    from asgiref.sync import sync_to_async

    while True:
        try:
            await sync_to_async(_poll_once, thread_sensitive=False, executor=_POLL_EXECUTOR)()
        except asyncio.CancelledError:
            raise
        except Exception:
            # Database down: waiters notice the poller is stale and poll themselves.
            logger.warning("approval poller failed", exc_info=True)
        await asyncio.sleep(interval)

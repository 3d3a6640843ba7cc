"""Sockets on the real ASGI application (channels' communicator), with bounded waits."""

from __future__ import annotations

import asyncio
import re

from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from studio.asgi import application

BOUND = 15.0


@sync_to_async
def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


async def open_socket(
    conversation_id: int,
    user=None,
    *,
    origin: str = "http://127.0.0.1",
    host: str = "127.0.0.1",
    cookie: str | None = None,
    path: str | None = None,
):
    headers = [(b"origin", origin.encode()), (b"host", host.encode())]
    if user is not None:
        cookie = cookie or await session_cookie(user)
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    comm = WebsocketCommunicator(application, path or f"/ws/c/{conversation_id}/", headers=headers)
    connected, code = await comm.connect(timeout=BOUND)
    return comm, connected, code


async def closed_with(comm, code: int) -> None:
    """The socket was accepted, then closed with ``code`` (so the page learns it)."""
    while True:
        output = await comm.receive_output(timeout=BOUND)
        if output["type"] == "websocket.close":
            assert output.get("code") == code, output
            return


async def receive_until(comm, needle: str | re.Pattern, timeout: float = BOUND) -> str:
    """All frames up to and including the first that contains ``needle``."""
    seen = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise AssertionError(f"{needle!r} not received; got:\n" + "\n".join(seen)[-3000:])
        frame = await comm.receive_from(timeout=remaining)
        seen.append(frame)
        if needle.search(frame) if isinstance(needle, re.Pattern) else needle in frame:
            return "\n".join(seen)


async def wait_for(predicate, timeout: float = BOUND) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await sync_to_async(predicate)():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)

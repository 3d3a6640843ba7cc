"""Peer (a): a bare ASGI app on daphne that answers the decision POST.

The floor for "an HTTP POST through daphne": read the body, answer JSON.

    daphne bench.peers.bare_asgi:application
"""

from __future__ import annotations


async def application(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": b'{"resolved": true}'})

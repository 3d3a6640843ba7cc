"""Middleware of Studio's own that is about how requests are served."""

from __future__ import annotations


class OneThreadHop:
    """Last in ``MIDDLEWARE``: the middleware above it runs in one pass on a thread.

    Every middleware Django ships can run both ways, so under ASGI Django
    runs each of their hooks through ``sync_to_async``: some fifteen hops
    between the event loop and a thread per request, each waiting its turn
    for the GIL while the process steps runs. One sync-only middleware at
    the bottom turns the chain above it sync (Django's documented
    ``sync_capable`` and ``async_capable`` flags), adapted once at the top.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

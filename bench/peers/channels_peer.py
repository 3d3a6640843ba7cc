"""Peer (b): a minimal Django Channels + daphne approval server.

No middleware, no database: a WebSocket consumer announces a pending call
and waits on a ``threading.Event`` in a worker thread; an async POST view
sets the event; the consumer then sends the tool's result. It speaks the
same protocol as Studio for the benchmark harness (the same frames, the
same decision URL), so both are timed by the same code.

    DJANGO_SETTINGS_MODULE=bench.peers.channels_peer daphne bench.peers.channels_peer:application
"""

from __future__ import annotations

import json
import secrets
import threading

import django
from django.conf import settings

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="peer-not-secret-0123456789abcdef0123456789abcdef",
        ALLOWED_HOSTS=["*"],
        INSTALLED_APPS=["daphne", "channels"],
        MIDDLEWARE=[],
        ROOT_URLCONF=__name__,
        DATABASES={},
        CHANNEL_LAYERS={"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}},
        ASGI_APPLICATION=f"{__name__}.application",
    )
    django.setup()

from asgiref.sync import sync_to_async  # noqa: E402
from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402
from django.http import JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

WAITERS: dict[str, threading.Event] = {}


@csrf_exempt
async def decide(request, approval_id: str):
    event = WAITERS.get(approval_id)
    if event is None:
        return JsonResponse({"resolved": False}, status=409)
    event.set()
    return JsonResponse({"resolved": True, "status": "allowed", "reason": "user"})


class Chat(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        await self.accept()
        await self.send(text_data='<section id="transcript"></section>')

    async def receive(self, text_data=None, bytes_data=None) -> None:
        text = json.loads(text_data)["message"]
        approval_id = secrets.token_urlsafe(16)
        event = WAITERS[approval_id] = threading.Event()
        await self.send(
            text_data=f'<article data-approval-id="{approval_id}" data-status="pending"></article>'
        )
        await sync_to_async(event.wait, thread_sensitive=False)()
        del WAITERS[approval_id]
        await self.send(
            text_data=f'<div data-tool-result="c"><pre class="output">{text}</pre></div>'
        )
        await self.send(text_data='<div id="run-controls" data-running="false"></div>')


urlpatterns = [path("approvals/<str:approval_id>/decide/", decide)]

application = ProtocolTypeRouter(
    {
        "http": get_asgi_application(),
        "websocket": URLRouter([path("ws/c/<int:conversation_id>/", Chat.as_asgi())]),
    }
)

from __future__ import annotations

from django.urls import path

from approvals.consumers import InboxConsumer, MemberSocket

websocket_urlpatterns = [
    path("ws/inbox/", InboxConsumer.as_asgi()),
    path("ws/me/", MemberSocket.as_asgi()),
]

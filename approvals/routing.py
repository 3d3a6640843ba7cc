from __future__ import annotations

from django.urls import path, re_path

from approvals.api import ApprovalWait
from approvals.consumers import InboxConsumer, MemberSocket

http_urlpatterns = [
    re_path(r"^api/v1/approvals/(?P<approval_id>[A-Za-z0-9_-]{1,64})$", ApprovalWait.as_asgi()),
]

websocket_urlpatterns = [
    path("ws/inbox/", InboxConsumer.as_asgi()),
    path("ws/me/", MemberSocket.as_asgi()),
]

"""Peer (e): the minimal Channels peer plus what a secure decision needs on stock Django.

Django's own ASGI handler with sessions in the database, authentication and
CSRF; the socket authenticated by Channels' ``AuthMiddlewareStack``; an
audit row written before the card is announced; the decision one
conditional ORM update (``WHERE status = 'pending'``: the first decision
wins), then the waiter's event set. No rules, no rendering, no channel-layer
broadcast: the floor a secure approval costs on stock parts.

It shares the benchmark's database (its users and sessions) and secret key
with Studio, and keeps its audit rows in a table of its own.

    daphne bench.peers.stock_django:application
"""

from __future__ import annotations

import json
import os
import secrets
import threading

import dj_database_url
import django
from django.conf import settings

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY=os.environ["DJANGO_SECRET_KEY"],
        ALLOWED_HOSTS=["*"],
        INSTALLED_APPS=[
            "daphne",
            "channels",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
        ],
        SESSION_ENGINE="django.contrib.sessions.backends.db",
        ROOT_URLCONF=__name__,
        DATABASES={"default": dj_database_url.parse(os.environ["DATABASE_URL"])},
        CHANNEL_LAYERS={"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}},
        USE_TZ=True,
    )
    django.setup()

from asgiref.sync import sync_to_async  # noqa: E402
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.db import database_sync_to_async  # noqa: E402
from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings as django_settings  # noqa: E402
from django.contrib.auth.decorators import login_required  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402
from django.db import connection, models  # noqa: E402
from django.http import HttpResponse, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.utils import timezone  # noqa: E402
from django.views.decorators.csrf import ensure_csrf_cookie  # noqa: E402
from django.views.decorators.http import require_POST  # noqa: E402


class Approval(models.Model):
    """The audit row: who asked, for what, and the decision."""

    approval_id = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(django_settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    arguments = models.JSONField()
    status = models.CharField(max_length=16, default="pending")
    decided_by = models.ForeignKey(
        django_settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True)

    class Meta:
        app_label = "stock_peer"
        db_table = "stock_peer_approval"

    def __str__(self) -> str:
        return f"{self.approval_id} [{self.status}]"


if Approval._meta.db_table not in connection.introspection.table_names():
    with connection.schema_editor() as editor:
        editor.create_model(Approval)
connection.close()

WAITERS: dict[str, threading.Event] = {}


@ensure_csrf_cookie
def index(request):
    return HttpResponse("ok")


@require_POST
@login_required
def decide(request, approval_id: str):
    # The first decision wins: one conditional update, scoped to the member.
    won = Approval.objects.filter(
        approval_id=approval_id, user=request.user, status="pending"
    ).update(status="allowed", decided_by=request.user, decided_at=timezone.now())
    if not won:
        return JsonResponse({"resolved": False}, status=409)
    event = WAITERS.get(approval_id)
    if event is not None:
        event.set()
    return JsonResponse({"resolved": True, "status": "allowed", "reason": "user"})


class Chat(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        if not self.scope["user"].is_authenticated:
            await self.close()
            return
        await self.accept()
        await self.send(text_data='<section id="transcript"></section>')

    async def receive(self, text_data=None, bytes_data=None) -> None:
        text = json.loads(text_data)["message"]
        approval_id = secrets.token_urlsafe(16)
        event = WAITERS[approval_id] = threading.Event()
        await database_sync_to_async(Approval.objects.create)(
            approval_id=approval_id, user=self.scope["user"], arguments={"text": text}
        )
        await self.send(
            text_data=f'<article data-approval-id="{approval_id}" data-status="pending"></article>'
        )
        await sync_to_async(event.wait, thread_sensitive=False)()
        del WAITERS[approval_id]
        await self.send(
            text_data=f'<div data-tool-result="c"><pre class="output">{text}</pre></div>'
        )
        await self.send(text_data='<div id="run-controls" data-running="false"></div>')


urlpatterns = [path("", index), path("approvals/<str:approval_id>/decide/", decide)]

application = ProtocolTypeRouter(
    {
        "http": get_asgi_application(),
        "websocket": AuthMiddlewareStack(
            URLRouter([path("ws/c/<int:conversation_id>/", Chat.as_asgi())])
        ),
    }
)

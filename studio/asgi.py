"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

from __future__ import annotations

import os

import django
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
# Set up Django (apps, settings) before anything imports models.
django.setup(set_prefix=False)

from studio.handlers import (  # noqa: E402
    OneHopASGIHandler,
    daphne_skips_discarded_access_log,
    daphne_skips_form_parsing,
)

django_asgi_app = OneHopASGIHandler()
daphne_skips_form_parsing()
daphne_skips_discarded_access_log()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from approvals.routing import websocket_urlpatterns as member_sockets  # noqa: E402
from chat.routing import websocket_urlpatterns as chat_sockets  # noqa: E402
from studio.websocket import SameOriginValidator, UnknownPathConsumer  # noqa: E402

application = ProtocolTypeRouter(
    {
        # /static/ from the app's own files, in production too (a proxy may
        # serve them instead in a larger deployment).
        "http": ASGIStaticFilesHandler(django_asgi_app),
        "websocket": SameOriginValidator(
            AuthMiddlewareStack(
                URLRouter(
                    [*chat_sockets, *member_sockets, re_path(r"", UnknownPathConsumer.as_asgi())]
                )
            )
        ),
    }
)

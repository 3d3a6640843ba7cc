"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

from __future__ import annotations

import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
# Django's own handler, set up (apps, settings) before anything imports models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from approvals.routing import http_urlpatterns as api_long_polls  # noqa: E402
from approvals.routing import websocket_urlpatterns as member_sockets  # noqa: E402
from chat.routing import websocket_urlpatterns as chat_sockets  # noqa: E402
from studio.process import settle  # noqa: E402
from studio.runtime import runtime  # noqa: E402
from studio.websocket import SameOriginValidator, UnknownPathConsumer  # noqa: E402


class WithRuntime:
    """Start the process's runtime (its pools, inbox, poller) before the first
    request or socket: a process that only ever answers decision POSTs must
    still hear of other processes' runs and deliver to them."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        await runtime().start()
        await self.app(scope, receive, send)


application = WithRuntime(
    ProtocolTypeRouter(
        {
            # /static/ from the app's own files, in production too (a proxy may
            # serve them instead in a larger deployment).
            # The API's long poll waits on the loop (a Channels HTTP consumer);
            # every other request goes to Django.
            "http": URLRouter(
                [*api_long_polls, re_path(r"", ASGIStaticFilesHandler(django_asgi_app))]
            ),
            "websocket": SameOriginValidator(
                AuthMiddlewareStack(
                    URLRouter(
                        [
                            *chat_sockets,
                            *member_sockets,
                            re_path(r"", UnknownPathConsumer.as_asgi()),
                        ]
                    )
                )
            ),
        }
    )
)

settle()

"""WebSocket gatekeeping: same-origin checks and a clean refusal for unknown paths."""

from __future__ import annotations

from urllib.parse import urlparse

from channels.generic.websocket import AsyncWebsocketConsumer
from channels.security.websocket import OriginValidator, WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host


def _header(scope: dict, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin1")
    return ""


class SameOriginValidator(OriginValidator):
    """Let a socket in only from a page of this site: scheme, host *and* port.

    Channels' ``AllowedHostsOriginValidator`` compares host names only, so a
    page served on another port of the same host (any local service) could
    drive a member's socket. The site's own origin is the one the browser
    used to reach it: the ``Host`` header (which must be an allowed host) and
    the scheme (``https`` behind the proxy ``STUDIO_HTTPS`` trusts). Origins
    listed in ``DJANGO_CSRF_TRUSTED_ORIGINS`` are accepted too, as for POSTs.
    """

    def __init__(self, application) -> None:
        super().__init__(application, allowed_origins=[])

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return await self.application(scope, receive, send)
        origin = _header(scope, b"origin")
        if origin and self.same_origin(urlparse(origin.lower()), scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)

    def same_origin(self, origin, scope: dict) -> bool:
        host = _header(scope, b"host").lower()
        domain, _ = split_domain_port(host)
        patterns = list(settings.CSRF_TRUSTED_ORIGINS)
        if domain and validate_host(domain, settings.ALLOWED_HOSTS):
            patterns.append(f"{site_scheme(scope)}://{host}")
        return any(self.match_allowed_origin(origin, pattern) for pattern in patterns)


def site_scheme(scope: dict) -> str:
    """The scheme of the page that opened this socket."""
    if scope.get("scheme") == "wss":
        return "https"
    if settings.STUDIO_HTTPS and _header(scope, b"x-forwarded-proto").lower() == "https":
        return "https"
    return "http"


class UnknownPathConsumer(AsyncWebsocketConsumer):
    """Any other WebSocket path: accepted only to be closed with a code the page can read."""

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=4404)

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails
    request_id: str  # studio.logs.RequestIdMiddleware


def wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def client_ip(request: HttpRequest) -> str:
    """The client's address: the proxy's word for it only when we trust the proxy.

    Behind the HTTPS proxy that ``STUDIO_HTTPS`` declares, the last address
    in ``X-Forwarded-For`` is the one that proxy saw; anything before it was
    written by the client and proves nothing.
    """
    if settings.STUDIO_HTTPS:
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        last = forwarded.rsplit(",", 1)[-1].strip()
        if last:
            return last
    return request.META.get("REMOTE_ADDR", "")

from __future__ import annotations

from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")

from __future__ import annotations

from asgiref.sync import iscoroutinefunction
from django.core.handlers.asgi import ASGIHandler
from django.utils.deprecation import MiddlewareMixin

built_async: list[bool] = []


class Probe(MiddlewareMixin):
    """A middleware like Django's own (sync and async): notes the mode it was built in."""

    def __init__(self, get_response) -> None:
        super().__init__(get_response)
        built_async.append(iscoroutinefunction(self))


def _probe_mode() -> bool:
    built_async.clear()
    ASGIHandler()  # loads the middleware as the ASGI server does
    (mode,) = built_async
    return mode


def test_django_middleware_runs_in_one_thread_hop_under_asgi(settings):
    """With OneThreadHop last, Django's middleware run sync under ASGI: adapted once at
    the top, not through a hop to a thread for every hook."""
    assert settings.MIDDLEWARE[-1] == "studio.middleware.OneThreadHop"
    first, *rest = settings.MIDDLEWARE
    settings.MIDDLEWARE = [first, f"{__name__}.Probe", *rest]
    assert _probe_mode() is False
    # Without it, every hook of the same middleware would hop on its own.
    settings.MIDDLEWARE = settings.MIDDLEWARE[:-1]
    assert _probe_mode() is True

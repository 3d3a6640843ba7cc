"""Logs that join up: every line carries the request, member, conversation,
run and approval it is about, where they exist.

The ids live in context variables: a request sets its own (the middleware
below), a run's step sets the run's (``log_context``), and work handed to
our pools from a request carries the request's along (``sync_to_async``
copies the context). ``ContextFilter`` puts them on every record, for the
text or the JSON formatter (STUDIO_LOG_FORMAT).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import uuid
from contextvars import ContextVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings

FIELDS = ("request_id", "user_id", "conversation_id", "run_id", "approval_id")
_vars = {name: ContextVar(name, default="") for name in FIELDS}
# What a proxy's X-Request-ID may be: an id, not a place to write log lines.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")


@contextlib.contextmanager
def log_context(**fields):
    """Set some of FIELDS for the lines logged inside the block (this thread or task)."""
    tokens = [(_vars[k], _vars[k].set(str(v or ""))) for k, v in fields.items()]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def log_context_keep(**fields) -> None:
    """Set some of FIELDS for the rest of this task (a socket's, which ends with it)."""
    for name, value in fields.items():
        _vars[name].set(str(value or ""))


def log_fields() -> dict[str, str]:
    return {name: var.get() for name, var in _vars.items()}


class ContextFilter(logging.Filter):
    """Adds FIELDS to every record (empty where they do not exist), and names a
    request Django attached (``django.request``) by its method and path only:
    its repr carries the query string, which may hold a token."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in log_fields().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        request = getattr(record, "request", None)
        if request is not None and hasattr(request, "path"):
            record.request = f"{getattr(request, 'method', '')} {request.path}"
        return True


class TextFormatter(logging.Formatter):
    """The usual line, then the ids that are set, as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = " ".join(f"{n}={getattr(record, n)}" for n in FIELDS if getattr(record, n, ""))
        return f"{line} [{ids}]" if ids else line


access_log = logging.getLogger("studio.access")


class RequestIdMiddleware:
    """Gives each request an id (a trusted proxy's X-Request-ID, or a new one)
    as ``request.request_id``, logs under it, and answers with it. (The
    member is named where a view knows it: resolving it here would cost
    every request a hop to Django's sync thread.)

    It also writes the access line, at INFO, through logging: daphne's own
    access log is plain text on stdout, so the units turn it off and every
    line of a server's output is the formatter's (JSON with
    STUDIO_LOG_FORMAT=json). The path only: a query string may hold a token.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        request.request_id = request_id = _request_id(request)
        started = time.monotonic()
        with log_context(request_id=request_id):
            response = self.get_response(request)
            _access(request, response, started)
        response["X-Request-ID"] = request_id
        return response

    async def _acall(self, request):
        request.request_id = request_id = _request_id(request)
        started = time.monotonic()
        with log_context(request_id=request_id):
            response = await self.get_response(request)
            _access(request, response, started)
        response["X-Request-ID"] = request_id
        return response


def _access(request, response, started: float) -> None:
    if access_log.isEnabledFor(logging.INFO):
        access_log.info(
            "%s %s %s",
            request.method,
            request.path,
            response.status_code,
            extra={
                "method": request.method,
                "path": request.path,
                "status": response.status_code,
                "ms": round((time.monotonic() - started) * 1000, 1),
            },
        )


def _request_id(request) -> str:
    given = request.headers.get("X-Request-ID", "")
    if settings.STUDIO_HTTPS and _REQUEST_ID.match(given):
        return given  # the proxy STUDIO_HTTPS declares is trusted for it
    return uuid.uuid4().hex

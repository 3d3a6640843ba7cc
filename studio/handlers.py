"""Django's request handling in one hop per request, on a pool of our own.

Under Django's ``ASGIHandler`` each synchronous middleware hops between the
event loop and Django's single thread for sync code, once or twice each
(about 13 hops per request for our stack: ~2.4 ms of an 8.8 ms decision),
and every sync view queues on that one thread. This handler runs the very
same middleware, in the same order, with the same sessions, CSRF checks and
login requirement, as one synchronous call on ``runtime().http_pool``, the
way a threaded WSGI server would; only reading the body and writing the
response stay on the loop.

``daphne_skips_form_parsing`` takes one more step off the loop for every
form POST (see there).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from daphne import http_protocol
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.urls import set_script_prefix
from twisted.web import http

from studio.runtime import answering, runtime

logger = logging.getLogger(__name__)


class OneHopASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        base.BaseHandler.__init__(self)
        self.load_middleware(is_async=False)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        rt = runtime()
        await rt.start()
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        after: list[Callable[[], object]] = []  # see studio.runtime.once_answered
        try:
            loop = asyncio.get_running_loop()
            response = await loop.run_in_executor(
                rt.http_pool, self._respond, scope, body_file, after
            )
            await self.send_response(response, send)
            if response.streaming:
                await rt.off_loop(response.close, pool=rt.http_pool)
        finally:
            body_file.close()
            try:
                if after:
                    await answer_written()
            finally:
                for fn in after:
                    try:
                        fn()
                    except Exception:
                        logger.exception("a call left for after the answer failed")

    def _respond(self, scope, body_file, after: list[Callable[[], object]]):
        """The whole Django side of one request, on one pool thread."""
        with answering(after):
            set_script_prefix(get_script_prefix(scope))
            signals.request_started.send(sender=self.__class__, scope=scope)
            request, response = self.create_request(scope, body_file)
            if request is not None:
                response = self.get_response(request)
            response._handler_class = self.__class__
            if not response.streaming:
                # The body is in memory: close now, in the thread that used the
                # database (request_finished gives its connection back).
                response.close()
            return response


async def answer_written() -> None:
    """Return once Twisted has written out the answer just sent.

    daphne hands the answer to Twisted, which buffers it and writes it when
    the loop next finds the socket ready: on the loop's next turn, after the
    callbacks already queued. Two turns later it is on its way. Work left for
    after the answer (a woken run, a card to draw) started before that would
    take the interpreter from the write.
    """
    await asyncio.sleep(0)
    await asyncio.sleep(0)


class _WebRequest(http_protocol.WebRequest):
    """Daphne's request, without Twisted's parse of a form POST's body."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, parsePOSTFormSubmission=False, **kwargs)


def _access_log(self, request) -> None:
    """Twisted's access line, written only where daphne lets Twisted's log go."""
    if self.server.verbosity > 1:
        http.HTTPFactory.log(self, request)


def daphne_skips_discarded_access_log() -> None:
    """Format Twisted's access line only when it goes somewhere.

    Twisted's ``HTTPFactory`` formats a Combined Log Format line for every
    request and writes it to Twisted's log; daphne, below verbosity 2 (its
    default is 1), sends that log nowhere. daphne's own access log (its
    ``--access-log``, stdout at verbosity 1) is another one and stays.
    """
    http_protocol.HTTPFactory.log = _access_log


def daphne_skips_form_parsing() -> None:
    """Serve HTTP with requests that leave a form POST's body to the application.

    Twisted parses every form POST into ``request.args``, its Content-Type
    through the ``email`` package, before daphne hands the raw body to the
    ASGI application (Django parses it again); daphne never reads ``args``.
    That parse is about 0.05 ms of event-loop time per decision POST in one
    process, 0.2 ms in a traced server beside busy threads. Twisted's ``Request`` takes
    ``parsePOSTFormSubmission=False`` for this; daphne builds its requests
    from its module's ``WebRequest`` for each connection, with no option, so
    that name is pointed at a subclass that passes it.
    """
    http_protocol.WebRequest = _WebRequest

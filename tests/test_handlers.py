"""studio.handlers: the requests daphne builds leave a form POST's body to Django."""

from __future__ import annotations

import io
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from daphne import http_protocol
from twisted.web.test.requesthelper import DummyChannel

import studio.asgi  # noqa: F401 - serving Studio installs the request class
from deploy.cluster import DaphneProcess
from studio import handlers
from tests.helpers.procs import child_env

BODY = b"decision=allow&note=ok"


def received(request_class) -> object:
    """A form POST as Twisted hands it over once fully read (daphne's processing left out)."""
    channel = DummyChannel()
    channel.factory = SimpleNamespace(server=SimpleNamespace(protocol_connected=lambda r: None))
    request = request_class(channel, False)
    request.process = lambda: None
    request.requestHeaders.setRawHeaders(
        b"content-type", [b"application/x-www-form-urlencoded; charset=utf-8"]
    )
    request.gotLength(len(BODY))
    request.handleContentChunk(BODY)
    request.requestReceived(b"POST", b"/approvals/x/decide/", b"HTTP/1.1")
    return request


def test_serving_studio_makes_daphne_build_our_requests():
    assert http_protocol.WebRequest is handlers._WebRequest


@pytest.mark.parametrize(
    ("request_class", "args"),
    [
        (handlers._WebRequest, {}),
        # daphne's own parses it into args, which nothing reads: the test can fail.
        (handlers._WebRequest.__base__, {b"decision": [b"allow"], b"note": [b"ok"]}),
    ],
)
def test_a_form_body_reaches_the_application_whole_and_unparsed(request_class, args):
    request = received(request_class)
    assert request.args == args
    assert request.content.read() == BODY  # what daphne sends the application


def access_lines(verbosity: int) -> str:
    """What daphne's HTTP factory writes to Twisted's log for one request."""
    from daphne.server import Server
    from twisted.web import http

    # (A server is only built here; it listens once run.)
    server = Server(application=None, endpoints=["tcp:port=0"], verbosity=verbosity)
    factory = http_protocol.HTTPFactory(server)
    factory._logDateTime = "[04/Dec/2026:17:00:00 +0000]"
    factory._logFile = io.StringIO()
    request = http.Request(DummyChannel(), False)
    request.method, request.uri, request.clientproto = b"POST", b"/approvals/x/decide/", b"HTTP/1.1"
    request.code, request.sentLength = 200, 60
    factory.log(request)
    return factory._logFile.getvalue()


def test_twisted_formats_no_access_line_for_a_log_daphne_discards():
    assert access_lines(verbosity=1) == ""  # daphne's default: Twisted's log goes nowhere
    # At verbosity 2 daphne passes Twisted's log on: the line is written.
    assert '"POST /approvals/x/decide/ HTTP/1.1" 200 60' in access_lines(verbosity=2)


# How long tests.helpers.after_app holds the loop at most (its HOLD_SECONDS).
HOLD_SECONDS = 5.0


@pytest.mark.django_db(transaction=True)
def test_what_is_left_for_after_an_answer_runs_once_the_client_has_it(tmp_path):
    """A real daphne: the call left for after the answer holds the loop until the
    client has the answer, which only works if the answer was written first."""
    mark = tmp_path / "answered"
    server = DaphneProcess(
        env=child_env(STUDIO_TEST_AFTER_MARK=str(mark)),
        app="tests.helpers.after_app:application",
        log_path=tmp_path / "daphne.log",
    ).start()
    try:
        response = httpx.get(f"{server.url}/test/after/", timeout=HOLD_SECONDS / 2)
        assert (response.status_code, response.text) == (200, "answer")
        mark.touch()
        seen = Path(f"{mark}.seen")
        deadline = time.monotonic() + 2 * HOLD_SECONDS
        while not seen.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen.read_text() == "answered"
    finally:
        server.stop()

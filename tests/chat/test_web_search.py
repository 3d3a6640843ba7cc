"""web_search against a local stand-in that speaks SearxNG's JSON API."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from chat.tools import builtin_tools
from studio.cancel import CancelToken


class _Searx(BaseHTTPRequestHandler):
    seen: list[dict] = []

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        _Searx.seen.append(query)
        if query.get("q") == ["boom"]:
            self.send_response(500)
            self.end_headers()
            return
        results = [
            {
                "title": f"Result {i}",
                "url": f"https://example.com/{i}",
                "content": ("word " * 200) if i == 0 else f"snippet {i}",
            }
            for i in range(15)
        ]
        body = json.dumps({"query": query["q"][0], "results": results}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def searx(settings):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Searx)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}).start()
    settings.STUDIO_SEARXNG_URL = f"http://127.0.0.1:{httpd.server_address[1]}"
    _Searx.seen.clear()
    yield
    httpd.shutdown()
    httpd.server_close()


def search(**arguments):
    return builtin_tools()["web_search"].execute(
        arguments, cancel=CancelToken(), timeout=5, workspace=None
    )


def test_the_tool_is_absent_without_an_engine(settings):
    settings.STUDIO_SEARXNG_URL = ""
    assert "web_search" not in builtin_tools()


def test_results_are_listed_and_capped(searx):
    result = search(query="django channels", count=3)
    assert result.ok
    assert _Searx.seen[-1]["format"] == ["json"] and _Searx.seen[-1]["q"] == ["django channels"]
    assert result.text.startswith("Results for 'django channels':")
    assert "3. Result 2\n   https://example.com/2\n   snippet 2" in result.text
    assert "Result 3" not in result.text
    first = result.text.split("\n")[4]
    assert len(first) < 320 and first.endswith("…")  # a long snippet is cut
    # At most ten, whatever the model asks for.
    assert builtin_tools()["web_search"].validate({"query": "x", "count": 50})


def test_an_engine_that_is_down_or_failing_is_a_clear_error(searx, settings):
    assert search(query="boom").text == "Error: the search engine answered HTTP 500."
    settings.STUDIO_SEARXNG_URL = "http://127.0.0.1:1"
    down = search(query="anything")
    assert not down.ok and down.text.startswith(
        "Error: the search engine at http://127.0.0.1:1 could not be reached"
    )

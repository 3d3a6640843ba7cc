"""The ``web_fetch`` tool: GET a public http(s) page and return readable text.

It runs in the server (not the sandbox), so it guards itself (``studio.net``):

* every connection, the first and each redirect's, goes through a network
  backend that resolves the host itself, refuses every address that is not
  globally routable (``not is_global``, and IPv6 forms that wrap a private
  IPv4 address: mapped, compatible, 6to4, Teredo, NAT64), and connects to the
  address it checked, so DNS cannot answer differently in between;
* a host an admin allows (``STUDIO_WEB_FETCH_ALLOW_HOSTS``, e.g. an intranet
  wiki) may resolve to a private address, but only on its own port: the
  scheme's default, or the one written as ``host:port``;
* one deadline for the whole call, redirects and a slow body included, and
  Stop ends a download at once (both close the connection under the reader).
"""

from __future__ import annotations

import re
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
from django.conf import settings

from chat.tools.base import Tool, ToolResult
from studio.cancel import CancelToken
from studio.net import BlockedAddress, GuardedBackend, GuardedTransport, allowed_endpoints
from studio.text import strip_nul

MAX_BYTES = 1024 * 1024
MAX_TEXT = 20_000
MAX_REDIRECTS = 5
MAX_SECONDS = 30.0
USER_AGENT = "StudioBot/0.1 (+tool web_fetch)"


class Interrupted(Exception):
    """The deadline passed or the user pressed Stop."""


class _TextExtractor(HTMLParser):
    SKIP = {"script", "style", "noscript", "template", "svg", "head"}
    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "pre"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag, attrs) -> None:
        if tag == "title":
            self._in_title = True
        if tag in self.SKIP:
            self.skipping += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag) -> None:
        if tag == "title":
            self._in_title = False
        if tag in self.SKIP and self.skipping:
            self.skipping -= 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data) -> None:
        if self._in_title:
            self.title += data
        if not self.skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    text = "".join(parser.parts)
    text = re.sub(r"[ \t\r\f\v]+", " ", text)
    text = re.sub(r"\n\s*\n+", "\n\n", text)
    body = text.strip()
    title = parser.title.strip()
    return f"# {title}\n\n{body}" if title else body


def fetch(
    url: str,
    *,
    timeout: float,
    allow_private: bool,
    allow_hosts: list[str],
    cancel: CancelToken | None = None,
) -> ToolResult:
    backend = GuardedBackend(allow_private=allow_private, allow=allowed_endpoints(allow_hosts))
    interrupted: list[str] = []

    def interrupt(why: str) -> None:
        interrupted.append(why)
        backend.abort()

    deadline = time.monotonic() + timeout
    timer = threading.Timer(timeout, interrupt, args=("deadline",))
    timer.daemon = True
    timer.start()
    unsubscribe = cancel.subscribe(lambda: interrupt("stop")) if cancel else (lambda: None)
    try:
        return _fetch(url, backend=backend, deadline=deadline, interrupted=interrupted)
    except (httpx.HTTPError, OSError):
        if interrupted:
            raise Interrupted(interrupted[0]) from None
        raise
    finally:
        timer.cancel()
        unsubscribe()


def _fetch(url: str, *, backend: GuardedBackend, deadline: float, interrupted: list) -> ToolResult:
    headers = {"User-Agent": USER_AGENT, "Accept": "text/html,text/plain,*/*;q=0.5"}
    transport = GuardedTransport(backend)
    remaining = max(0.1, deadline - time.monotonic())
    with httpx.Client(transport=transport, timeout=remaining, follow_redirects=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            scheme = urlsplit(url).scheme.lower()
            if scheme not in ("http", "https"):
                return ToolResult.error(
                    f"only http and https URLs can be fetched, not {scheme or 'this'}."
                )
            backend.scheme = scheme
            with client.stream("GET", url, headers=headers) as response:
                if response.is_redirect and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    continue
                body = bytearray()
                for chunk in response.iter_bytes():
                    if interrupted:
                        raise Interrupted(interrupted[0])
                    body.extend(chunk)
                    if len(body) > MAX_BYTES:
                        break
                if interrupted:
                    raise Interrupted(interrupted[0])
                cut = len(body) > MAX_BYTES
                content_type = response.headers.get("content-type", "")
                text = bytes(body[:MAX_BYTES]).decode(
                    response.encoding or "utf-8", errors="replace"
                )
                status = response.status_code
            text = strip_nul(text)
            if "html" in content_type or text.lstrip()[:15].lower().startswith(
                ("<!doctype", "<html")
            ):
                text = html_to_text(text)
            if len(text) > MAX_TEXT:
                text, cut = text[:MAX_TEXT], True
            header = f"HTTP {status} {url}\n\n"
            if status >= 400:
                return ToolResult.error(f"HTTP {status} from {url}\n\n{text}")
            return ToolResult(header + text + ("\n[content truncated]" if cut else ""))
    return ToolResult.error(f"more than {MAX_REDIRECTS} redirects.")


def run(arguments: dict, *, cancel: CancelToken, timeout: float, workspace: Path) -> ToolResult:
    url = arguments["url"].strip()
    limit = min(timeout, MAX_SECONDS)
    try:
        return fetch(
            url,
            timeout=limit,
            allow_private=settings.STUDIO_WEB_FETCH_ALLOW_PRIVATE,
            allow_hosts=settings.STUDIO_WEB_FETCH_ALLOW_HOSTS,
            cancel=cancel,
        )
    except BlockedAddress as exc:
        return ToolResult.error(f"{exc}.")
    except Interrupted as exc:
        if str(exc) == "stop":
            return ToolResult.error("stopped by the user.")
        return ToolResult.error(f"{url} did not finish within {limit:g} s.")
    except httpx.InvalidURL as exc:
        return ToolResult.error(f"invalid URL: {exc}.")
    except httpx.UnsupportedProtocol:
        return ToolResult.error("only http and https URLs can be fetched.")
    except httpx.TimeoutException:
        return ToolResult.error(f"{url} did not answer in time.")
    except httpx.HTTPError as exc:
        return ToolResult.error(f"could not fetch {url}: {exc}.")


TOOL = Tool(
    name="web_fetch",
    description="Fetch a public web page (http or https) and return its readable text.",
    parameters={
        "type": "object",
        "properties": {
            "url": {
                "type": "string",
                "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://",
                "description": "The http(s) URL to fetch.",
            }
        },
        "required": ["url"],
        "additionalProperties": False,
    },
    run=run,
    subject_argument="url",
)

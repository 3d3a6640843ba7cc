"""The ``web_fetch`` tool: GET a public http(s) page and return readable text.

It runs in the server (not the sandbox), so it guards itself:

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

import ipaddress
import re
import socket
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpcore
import httpx
from django.conf import settings

from chat.tools.base import Tool, ToolResult
from studio.cancel import CancelToken
from studio.text import strip_nul

MAX_BYTES = 1024 * 1024
MAX_TEXT = 20_000
MAX_REDIRECTS = 5
MAX_SECONDS = 30.0
USER_AGENT = "StudioBot/0.1 (+tool web_fetch)"
DEFAULT_PORTS = {"http": 80, "https": 443}
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


class BlockedAddress(Exception):
    pass


class Interrupted(Exception):
    """The deadline passed or the user pressed Stop."""


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 address carries (mapped, compatible, 6to4, Teredo, NAT64)."""
    found = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    # IPv4-compatible (::a.b.c.d, but not :: and ::1 themselves) and NAT64.
    if (int(ip) >> 32 == 0 and int(ip) > 1) or any(ip in net for net in _NAT64):
        found.append(low32)
    return found


def _label(ip: IPAddress) -> str:
    for flag, label in (
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_unspecified", "unspecified"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
    ):
        if getattr(ip, flag):
            return label
    return "non-public"


def address_refusal(ip: IPAddress) -> str | None:
    """Why ``ip`` may not be fetched from, or None when it is globally routable."""
    # A wrapped IPv4 address first: it says best what the address really is.
    candidates: list[IPAddress] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        candidates = [*_embedded_ipv4(ip), ip]
    for candidate in candidates:
        if not candidate.is_global:
            wrapped = f" (wrapping {candidate})" if candidate is not ip else ""
            return f"{ip}{wrapped} is a {_label(candidate)} address"
    return None


def resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def allowed_endpoints(entries: list[str]) -> frozenset[tuple[str, int | None]]:
    """``host`` or ``host:port`` entries; a bare host means its scheme's default port."""
    endpoints = set()
    for entry in entries:
        host, _, port = entry.strip().lower().rpartition(":")
        if not host or not port.isdigit():
            host, port = entry.strip().lower(), ""
        endpoints.add((host.strip("[]"), int(port) if port else None))
    return frozenset(endpoints)


class GuardedBackend(httpcore.SyncBackend):
    def __init__(self, *, allow_private: bool, allow: frozenset[tuple[str, int | None]]) -> None:
        self.allow_private = allow_private
        self.allow = allow
        self.scheme = "http"
        self.streams: list[httpcore.NetworkStream] = []

    def _allowed(self, host: str, port: int) -> bool:
        if (host.lower(), port) in self.allow:
            return True
        return (host.lower(), None) in self.allow and port == DEFAULT_PORTS.get(self.scheme)

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        if isinstance(host, bytes):
            host = host.decode("ascii")
        host = host.strip("[]")
        try:
            addresses = resolve(host, port)
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from None
        if not (self.allow_private or self._allowed(host, port)):
            for address in addresses:
                refusal = address_refusal(ipaddress.ip_address(address.split("%")[0]))
                if refusal:
                    raise BlockedAddress(f"refusing to fetch from {host}: {refusal}")
        stream = super().connect_tcp(addresses[0], port, timeout, local_address, socket_options)
        self.streams.append(stream)
        return stream

    def abort(self) -> None:
        """Shut every connection down under whoever is reading it (deadline, Stop)."""
        for stream in list(self.streams):
            sock = stream.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class GuardedTransport(httpx.HTTPTransport):
    def __init__(self, backend: GuardedBackend) -> None:
        super().__init__(trust_env=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False), network_backend=backend
        )


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

"""The ``web_fetch`` tool: GET a public http(s) page and return readable text.

Every connection, the first and each redirect's, goes through a network
backend that resolves the host itself, refuses loopback, private,
link-local, multicast and reserved addresses, and connects to the address it
checked (so DNS cannot answer differently between the check and the connect).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpcore
import httpx
from django.conf import settings

from approvals.gate import CancelToken
from chat.tools.base import Tool

MAX_BYTES = 1024 * 1024
MAX_TEXT = 20_000
MAX_REDIRECTS = 5
USER_AGENT = "StudioBot/0.1 (+tool web_fetch)"


class BlockedAddress(Exception):
    pass


def address_refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for flag, label in (
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_unspecified", "unspecified"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
    ):
        if getattr(ip, flag):
            return f"{ip} is a {label} address"
    return None


def resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


class GuardedBackend(httpcore.SyncBackend):
    def __init__(self, *, allow_private: bool, allow_hosts: frozenset[str]) -> None:
        self.allow_private = allow_private
        self.allow_hosts = allow_hosts

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        if isinstance(host, bytes):
            host = host.decode("ascii")
        host = host.strip("[]")
        try:
            addresses = resolve(host, port)
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from None
        if not (self.allow_private or host in self.allow_hosts):
            for address in addresses:
                refusal = address_refusal(ipaddress.ip_address(address.split("%")[0]))
                if refusal:
                    raise BlockedAddress(f"refusing to fetch from {host}: {refusal}")
        return super().connect_tcp(addresses[0], port, timeout, local_address, socket_options)


class GuardedTransport(httpx.HTTPTransport):
    def __init__(self, *, allow_private: bool, allow_hosts: frozenset[str]) -> None:
        super().__init__(trust_env=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            network_backend=GuardedBackend(allow_private=allow_private, allow_hosts=allow_hosts),
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


def fetch(url: str, *, timeout: float, allow_private: bool, allow_hosts: frozenset[str]) -> str:
    transport = GuardedTransport(allow_private=allow_private, allow_hosts=allow_hosts)
    headers = {"User-Agent": USER_AGENT, "Accept": "text/html,text/plain,*/*;q=0.5"}
    with httpx.Client(transport=transport, timeout=timeout, follow_redirects=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            scheme = urlsplit(url).scheme.lower()
            if scheme not in ("http", "https"):
                return f"Error: only http and https URLs can be fetched, not {scheme or 'this'}."
            with client.stream("GET", url, headers=headers) as response:
                if response.is_redirect and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    continue
                body = bytearray()
                for chunk in response.iter_bytes():
                    body.extend(chunk)
                    if len(body) > MAX_BYTES:
                        break
                cut = len(body) > MAX_BYTES
                content_type = response.headers.get("content-type", "")
                text = bytes(body[:MAX_BYTES]).decode(
                    response.encoding or "utf-8", errors="replace"
                )
                status = response.status_code
            if "html" in content_type or text.lstrip()[:15].lower().startswith(
                ("<!doctype", "<html")
            ):
                text = html_to_text(text)
            if len(text) > MAX_TEXT:
                text, cut = text[:MAX_TEXT], True
            header = f"HTTP {status} {url}\n\n"
            if status >= 400:
                return f"Error: HTTP {status} from {url}\n\n{text}"
            return header + text + ("\n[content truncated]" if cut else "")
    return f"Error: more than {MAX_REDIRECTS} redirects."


def run(arguments: dict, *, cancel: CancelToken, timeout: float, workspace: Path) -> str:
    url = arguments["url"].strip()
    allow_hosts = frozenset(getattr(settings, "STUDIO_WEB_FETCH_ALLOW_HOSTS", []))
    try:
        return fetch(
            url,
            timeout=min(timeout, 30),
            allow_private=settings.STUDIO_WEB_FETCH_ALLOW_PRIVATE,
            allow_hosts=allow_hosts,
        )
    except BlockedAddress as exc:
        return f"Error: {exc}."
    except httpx.InvalidURL as exc:
        return f"Error: invalid URL: {exc}."
    except httpx.UnsupportedProtocol:
        return "Error: only http and https URLs can be fetched."
    except httpx.TimeoutException:
        return f"Error: {url} did not answer in time."
    except httpx.HTTPError as exc:
        return f"Error: could not fetch {url}: {exc}."


TOOL = Tool(
    name="web_fetch",
    description="Fetch a public web page (http or https) and return its readable text.",
    parameters={
        "type": "object",
        "properties": {"url": {"type": "string", "description": "The http(s) URL to fetch."}},
        "required": ["url"],
    },
    side_effects=False,
    run=run,
)

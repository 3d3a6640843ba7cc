"""Connections Studio makes for someone else, to addresses that must be public.

``web_fetch`` (chat) and the API's callbacks (approvals) connect to a URL a
model or an agent chose: every connection, the first and each redirect's,
goes through ``GuardedBackend``, which resolves the host itself, refuses
every address that is not globally routable (``not is_global``, and IPv6
forms that wrap a private IPv4 address: mapped, compatible, 6to4, Teredo,
NAT64), and connects to the address it checked, so DNS cannot answer
differently in between. A host an admin allows may resolve to a private
address, but only on its own port: the scheme's default, or ``host:port``.
"""

from __future__ import annotations

import ipaddress
import socket

import httpcore
import httpx

DEFAULT_PORTS = {"http": 80, "https": 443}
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


class BlockedAddress(Exception):
    pass


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


def host_refusal(host: str, port: int, *, allow: frozenset[tuple[str, int | None]],
                 scheme: str) -> str | None:  # fmt: skip
    """Why a connection to ``host:port`` would be refused now, or None (it resolves
    to public addresses only, or it is allowed)."""
    host = host.strip("[]")
    if (host.lower(), port) in allow or (
        (host.lower(), None) in allow and port == DEFAULT_PORTS.get(scheme)
    ):
        return None
    try:
        addresses = resolve(host, port)
    except (socket.gaierror, UnicodeError) as exc:
        return f"cannot resolve {host}: {exc}"
    for address in addresses:
        refusal = address_refusal(ipaddress.ip_address(address.split("%")[0]))
        if refusal:
            return refusal
    return None

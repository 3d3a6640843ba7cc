"""HTTP and WebSocket clients for tests against real daphne processes."""

from __future__ import annotations

import re
import time

import httpx
from django.test import Client
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

APPROVAL_ID = re.compile(r'data-approval-id="([^"]+)"')


def session_cookie(user) -> str:
    """A real session in the shared database, as a logged-in browser has."""
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


class Browserish:
    """What a logged-in tab does over HTTP: GET pages, POST with the CSRF token."""

    def __init__(self, base_url: str, session: str) -> None:
        self.http = httpx.Client(base_url=base_url, cookies={"sessionid": session}, timeout=20)
        self._csrf = ""

    def csrf(self, path: str = "/") -> str:
        if not self._csrf:
            self.http.get(path)
            self._csrf = self.http.cookies.get("csrftoken", "")
        return self._csrf

    def decide(self, approval_id: str, decision: str, **extra) -> httpx.Response:
        return self.http.post(
            f"/approvals/{approval_id}/decide/",
            data={"decision": decision, **extra},
            headers={"X-CSRFToken": self.csrf(), "Accept": "application/json"},
        )

    def close(self) -> None:
        self.http.close()


class Tab:
    """A WebSocket on one conversation (or the inbox), with bounded waits for fragments.

    Like htmx's ws extension in the browser, it reconnects after an abnormal
    closure (1006, 1011, 1012, 1013).
    """

    RECONNECT_CODES = {1006, 1011, 1012, 1013}

    def __init__(
        self, ws_base: str, conversation_id: int | None, session: str, origin: str, *, path=""
    ) -> None:
        # ``path``: another socket of the member's (``/ws/inbox/``, ``/ws/me/``).
        self.url = f"{ws_base}{path or f'/ws/c/{conversation_id}/'}"
        self.headers = {"Cookie": f"sessionid={session}", "Origin": origin}
        self.ws = self._connect()
        self.frames: list[str] = []
        self.reconnects = 0

    def _connect(self):
        # A Tab outlives any one ``with`` block (it reconnects, and is closed
        # by its test), so it enters the connection itself, as ``with`` would:
        # websockets 17.1 deprecates using connect() without entering it.
        return connect(self.url, additional_headers=self.headers, open_timeout=10).__enter__()

    def send(self, text: str) -> None:
        import json

        self.ws.send(json.dumps({"message": text}))

    def mark(self) -> int:
        return len(self.frames)

    def until(self, needle: str, timeout: float = 20, *, since: int | None = None) -> str:
        """Frames up to the one holding ``needle``; with ``since``, frames from
        that mark on count too (the needle may have come in an earlier frame)."""
        if since is not None and needle in "\n".join(self.frames[since:]):
            return "\n".join(self.frames[since:])
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{needle!r} not received; last frames: {seen[-5:]}")
            try:
                frame = self.ws.recv(timeout=remaining)
            except TimeoutError:
                continue
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd else 1006
                if code not in self.RECONNECT_CODES:
                    raise
                time.sleep(0.2)
                self.ws = self._connect()
                self.reconnects += 1
                continue
            seen.append(frame)
            self.frames.append(frame)
            if needle in frame:
                return "\n".join(seen)

    def close(self) -> None:
        self.ws.close()

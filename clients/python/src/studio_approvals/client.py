"""Ask Studio for a decision and wait for it, through restarts and lost connections.

A request carries an idempotency key, so asking again after a connection
broke answers with the same approval, never a second card. Waiting is a
series of long polls (``GET /api/v1/approvals/<id>?wait=N``): a server that
restarts or is briefly unreachable is asked again until the caller's own
deadline.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import os
import time
import uuid
from dataclasses import dataclass, field

import httpx

# One long poll at most (the server's limit).
POLL_SECONDS = 60
# Between tries while the server cannot be reached, growing to the last.
BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)


class StudioError(Exception):
    """Studio refused the request (a 4xx other than a deny) or could not be reached in time."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Denied(Exception):
    """The call was denied: by a person, a Deny rule, or because its time ran out."""

    def __init__(self, decision: Decision) -> None:
        who = f" by {decision.decided_by}" if decision.decided_by else ""
        note = f": {decision.note}" if decision.note else ""
        super().__init__(f"{decision.tool} was denied{who} ({decision.reason_label}){note}")
        self.decision = decision


class Undecided(Exception):
    """Nobody decided before the caller's timeout; the call still waits in Studio."""

    def __init__(self, approval_id: str) -> None:
        super().__init__(f"no decision yet on approval {approval_id}")
        self.approval_id = approval_id


@dataclass(frozen=True)
class Decision:
    id: str
    tool: str
    status: str
    reason: str
    reason_label: str
    decided_by: str | None
    note: str
    # What may run: the arguments as approved (a person may have edited them).
    arguments: dict | None
    edited: bool
    raw: dict = field(repr=False)

    @property
    def allowed(self) -> bool:
        return self.status == "allowed"

    @property
    def pending(self) -> bool:
        return self.status == "pending"

    @classmethod
    def of(cls, data: dict) -> Decision:
        return cls(
            id=data["id"],
            tool=data["tool"],
            status=data["status"],
            reason=data.get("reason", ""),
            reason_label=data.get("reason_label", ""),
            decided_by=data.get("decided_by"),
            note=data.get("note", ""),
            arguments=data.get("approved_arguments"),
            edited=bool(data.get("edited")),
            raw=data,
        )


def _settings(url: str | None, token: str | None) -> tuple[str, str]:
    url = (url or os.environ.get("STUDIO_URL", "")).rstrip("/")
    token = token or os.environ.get("STUDIO_TOKEN", "")
    if not url or not token:
        raise StudioError("set STUDIO_URL and STUDIO_TOKEN (or pass url= and token=)")
    return url, token


def verify_callback(token: str, body: bytes, signature: str, *, tolerance: float = 300) -> dict:
    """The decision a callback POST carries, once its ``Studio-Signature`` header is
    checked against ``token`` (the one that asked); raises ValueError otherwise."""
    parts = dict(p.split("=", 1) for p in signature.split(",") if "=" in p)
    try:
        stamp = int(parts["t"])
    except (KeyError, ValueError):
        raise ValueError("no timestamp in the signature") from None
    if abs(time.time() - stamp) > tolerance:
        raise ValueError("the signature is too old (or from the future)")
    secret = token.split("_", 2)[2] if token.count("_") >= 2 else token
    key = hashlib.sha256(secret.encode()).hexdigest()
    expected = hmac.new(key.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, parts.get("v1", "")):
        raise ValueError("the signature does not match")
    return json.loads(body)


def _ask_body(tool, arguments, title, context_url, idempotency_key, schema, expires,
              callback_url=None) -> dict:  # fmt: skip
    body = {
        "tool": tool,
        "arguments": arguments or {},
        "idempotency_key": idempotency_key or str(uuid.uuid4()),
    }
    if title:
        body["title"] = title[:200]
    if context_url:
        body["context_url"] = context_url
    if schema:
        body["schema"] = schema
    if expires:
        body["timeout"] = expires
    if callback_url:
        body["callback_url"] = callback_url
    return body


def _answer(response: httpx.Response) -> dict | None:
    """The row from an answer, None to try again (5xx), or StudioError."""
    if response.status_code >= 500:
        return None
    try:
        data = response.json()
    except ValueError:
        raise StudioError(
            f"Studio answered {response.status_code} without JSON", status=response.status_code
        ) from None
    if response.status_code in (200, 201, 403) and "status" in data:
        return data
    raise StudioError(data.get("error", str(data)), status=response.status_code)


def _next_try(got: httpx.Response | Exception, tries: int, deadline: float) -> dict | float:
    """After one try (its answer, or the connection's failure): the row, or how long
    to pause before the next; StudioError once ``deadline`` passed. Both clients
    loop on it, one sleeping, the other awaiting."""
    if isinstance(got, httpx.Response):
        data = _answer(got)
        if data is not None:
            return data
        got = "Studio answered with a server error"
    if time.monotonic() >= deadline:
        raise StudioError(f"Studio could not be reached in time: {got}")
    return BACKOFF[min(tries, len(BACKOFF) - 1)]


def _poll(approval_id: str, deadline: float) -> dict:
    """The long poll's request, waiting no longer than what is left."""
    left = max(0.0, deadline - time.monotonic())
    return {
        "method": "GET",
        "url": f"/api/v1/approvals/{approval_id}",
        "params": {"wait": f"{min(left, POLL_SECONDS):.1f}"},
    }


def _polled_enough(data: dict, deadline: float) -> bool:
    return data["status"] != "pending" or time.monotonic() >= deadline


def _report(approval_id: str, exit_status: int, output: str, seconds: float) -> dict:
    return {
        "method": "POST",
        "url": f"/api/v1/approvals/{approval_id}/result",
        "json": {"exit_status": exit_status, "output": output[:1_000_000], "seconds": seconds},
    }


def _reported(response: httpx.Response) -> dict:
    if response.status_code != 200:
        raise StudioError(response.json().get("error", ""), status=response.status_code)
    return response.json()


def _http_options(url: str | None, token: str | None, connect_timeout: float) -> dict:
    """Either client's settings: the server, the token, and a read that outlasts a long poll."""
    url, token = _settings(url, token)
    return {
        "base_url": url,
        "headers": {"Authorization": f"Bearer {token}"},
        "timeout": httpx.Timeout(connect_timeout, read=POLL_SECONDS + 15),
    }


def _final(data: dict) -> Decision:
    decision = Decision.of(data)
    if decision.status == "denied":
        raise Denied(decision)
    return decision


class Client:
    """A blocking client; ``approve`` returns an allowed Decision or raises Denied."""

    def __init__(
        self, url: str | None = None, token: str | None = None, *, connect_timeout: float = 10
    ):
        options = _http_options(url, token, connect_timeout)
        self.url, self.http = options["base_url"], httpx.Client(**options)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _retrying(self, deadline: float, send) -> dict:
        for tries in itertools.count():
            try:
                outcome = _next_try(send(), tries, deadline)
            except httpx.TransportError as exc:
                outcome = _next_try(exc, tries, deadline)
            if isinstance(outcome, dict):
                return outcome
            time.sleep(outcome)

    def ask(self, tool: str, arguments: dict | None = None, *, timeout: float = 600,
            title: str = "", context_url: str = "", idempotency_key: str | None = None,
            schema: dict | None = None, expires: float | None = None,
            callback_url: str | None = None) -> dict:  # fmt: skip
        """Ask (retried with one idempotency key); the row as Studio answers it."""
        body = _ask_body(tool, arguments, title, context_url, idempotency_key, schema, expires,
                         callback_url)  # fmt: skip
        deadline = time.monotonic() + timeout
        return self._retrying(deadline, lambda: self.http.post("/api/v1/approvals", json=body))

    def wait(self, approval_id: str, *, timeout: float = 600) -> dict:
        """Long-poll until the call is decided or ``timeout`` passes; the row then."""
        deadline = time.monotonic() + timeout
        while True:
            data = self._retrying(
                deadline, lambda: self.http.request(**_poll(approval_id, deadline))
            )
            if _polled_enough(data, deadline):
                return data

    def approve(self, tool: str, arguments: dict | None = None, *, timeout: float = 600,
                **ask) -> Decision:  # fmt: skip
        """Ask and wait: the allowed Decision (its ``arguments`` are what may run);
        raises Denied, Undecided (no decision within ``timeout``) or StudioError."""
        deadline = time.monotonic() + timeout
        data = self.ask(tool, arguments, timeout=timeout, **ask)
        if data["status"] == "pending":
            data = self.wait(data["id"], timeout=max(0.0, deadline - time.monotonic()))
        if data["status"] == "pending":
            raise Undecided(data["id"])
        return _final(data)

    def report(self, approval_id: str, *, exit_status: int, output: str = "",
               seconds: float = 0.0) -> dict:  # fmt: skip
        """Keep what the allowed call did on its audit row (once)."""
        return _reported(self.http.request(**_report(approval_id, exit_status, output, seconds)))


class AsyncClient:
    """``Client`` for asyncio: the same calls, awaited, holding no thread while waiting."""

    def __init__(
        self, url: str | None = None, token: str | None = None, *, connect_timeout: float = 10
    ):
        options = _http_options(url, token, connect_timeout)
        self.url, self.http = options["base_url"], httpx.AsyncClient(**options)

    async def close(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _retrying(self, deadline: float, send) -> dict:
        for tries in itertools.count():
            try:
                outcome = _next_try(await send(), tries, deadline)
            except httpx.TransportError as exc:
                outcome = _next_try(exc, tries, deadline)
            if isinstance(outcome, dict):
                return outcome
            await asyncio.sleep(outcome)

    async def ask(self, tool: str, arguments: dict | None = None, *, timeout: float = 600,
                  title: str = "", context_url: str = "", idempotency_key: str | None = None,
                  schema: dict | None = None, expires: float | None = None,
                  callback_url: str | None = None) -> dict:  # fmt: skip
        body = _ask_body(tool, arguments, title, context_url, idempotency_key, schema, expires,
                         callback_url)  # fmt: skip
        deadline = time.monotonic() + timeout
        return await self._retrying(
            deadline, lambda: self.http.post("/api/v1/approvals", json=body)
        )

    async def wait(self, approval_id: str, *, timeout: float = 600) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            data = await self._retrying(
                deadline, lambda: self.http.request(**_poll(approval_id, deadline))
            )
            if _polled_enough(data, deadline):
                return data

    async def approve(self, tool: str, arguments: dict | None = None, *, timeout: float = 600,
                      **ask) -> Decision:  # fmt: skip
        deadline = time.monotonic() + timeout
        data = await self.ask(tool, arguments, timeout=timeout, **ask)
        if data["status"] == "pending":
            data = await self.wait(data["id"], timeout=max(0.0, deadline - time.monotonic()))
        if data["status"] == "pending":
            raise Undecided(data["id"])
        return _final(data)

    async def report(self, approval_id: str, *, exit_status: int, output: str = "",
                     seconds: float = 0.0) -> dict:  # fmt: skip
        request = _report(approval_id, exit_status, output, seconds)
        return _reported(await self.http.request(**request))


def approve(tool: str, arguments: dict | None = None, *, timeout: float = 600, **ask) -> Decision:
    """Ask the Studio at STUDIO_URL with STUDIO_TOKEN; see ``Client.approve``."""
    with Client() as client:
        return client.approve(tool, arguments, timeout=timeout, **ask)


async def approve_async(
    tool: str, arguments: dict | None = None, *, timeout: float = 600, **ask
) -> Decision:
    async with AsyncClient() as client:
        return await client.approve(tool, arguments, timeout=timeout, **ask)

"""/api/v1/: approvals for agents outside the chat, with a member's API token.

``POST approvals`` asks (``approvals.services.api.approval_ask``), ``GET
approvals/<id>`` answers where the call stands and, with ``?wait=N``, waits
up to N seconds for its decision without holding a thread (``ApprovalWait``,
a Channels HTTP consumer: the decision's card message wakes it, and a read
every few seconds covers a message lost), ``POST approvals/<id>/result``
keeps what the call did on its audit row. Tokens, not sessions: no cookie
is read, so no request here can be forged from a page (no CSRF token).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from urllib.parse import parse_qs

from channels.generic.http import AsyncHttpConsumer
from channels.layers import get_channel_layer
from django.contrib.auth.decorators import login_not_required
from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from approvals.models import ApiToken, ToolApproval
from approvals.openapi import SCHEMA
from approvals.services.api import (
    BadRequest,
    Conflict,
    approval_ask,
    approval_for_token,
    approval_report,
    token_authenticate,
)
from studio.runtime import runtime

logger = logging.getLogger("studio.api")

# A request's body, at most (arguments are capped at 64 KiB within it).
MAX_BODY = 256 * 1024
MAX_WAIT = 60
# While a long poll waits: a read of the row this often, should the
# decision's message be lost (the channel layer delivers at most once).
POLL_SECONDS = 2.0
UNAUTHORIZED = "a valid API token is needed: Authorization: Bearer studio_…"


def _error(status: int, message: str, **headers: str) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    for name, value in headers.items():
        response[name] = value
    return response


def _unauthorized() -> JsonResponse:
    return _error(401, UNAUTHORIZED, **{"WWW-Authenticate": 'Bearer realm="studio"'})


def _json_body(request: HttpRequest) -> object:
    if request.content_type != "application/json":
        raise BadRequest("send the body as JSON (Content-Type: application/json)")
    try:
        return json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the body is not valid JSON") from None


def _too_big(request: HttpRequest) -> bool:
    try:
        return int(request.headers.get("Content-Length") or 0) > MAX_BODY
    except ValueError:
        return True


def _log(token: ApiToken, request: HttpRequest, status: int) -> None:
    logger.info(
        "api %s %s -> %s",
        request.method,
        request.path,
        status,
        extra={"event": "api_use", "token": token.pk, "user": token.user_id, "status": status},
    )


def with_token(view):
    """An API view, given the request's token: 401 without one, 413 for a body over
    MAX_BODY, 400 and 409 for what the services refuse; every use logged."""

    @functools.wraps(view)
    def answer(request: HttpRequest, *args, **kwargs) -> JsonResponse:
        token = token_authenticate(request.headers.get("Authorization", ""))
        if token is None:
            return _unauthorized()
        if _too_big(request):
            response = _error(413, f"the body must be at most {MAX_BODY} bytes")
        else:
            try:
                response = view(request, token, *args, **kwargs)
            except BadRequest as exc:
                response = _error(400, str(exc))
            except Conflict as exc:
                response = _error(409, str(exc))
        _log(token, request, response.status_code)
        return response

    return answer


NOT_FOUND = "no approval of this token has this id"


@login_not_required
@csrf_exempt
@require_POST
@with_token
def approvals_create(request: HttpRequest, token: ApiToken) -> JsonResponse:
    """Ask for a decision: 201 (pending or allowed), 200 (a replayed key), 403 (a Deny rule)."""
    asked = approval_ask(token=token, body=_json_body(request))
    approval = asked.approval
    status = 201 if asked.created else 200
    if approval.status == ToolApproval.Status.DENIED and approval.reason in (
        ToolApproval.Reason.RULE,
        ToolApproval.Reason.POLICY,
    ):
        status = 403
    response = JsonResponse(approval.api_answer(), status=status)
    response["Location"] = f"/api/v1/approvals/{approval.approval_id}"
    if not asked.created:
        response["Idempotent-Replayed"] = "true"
    return response


@login_not_required
@csrf_exempt
@require_POST
@with_token
def approval_result(request: HttpRequest, token: ApiToken, approval_id: str) -> JsonResponse:
    """Keep what an allowed call did (exit status, output) on its audit row; once."""
    approval = approval_report(token=token, approval_id=approval_id, body=_json_body(request))
    if approval is None:
        return _error(404, NOT_FOUND)
    return JsonResponse(approval.api_answer())


@login_not_required
@require_GET
@with_token
def approval_status(request: HttpRequest, token: ApiToken, approval_id: str) -> JsonResponse:
    """Where ``ApprovalWait`` does not serve (a WSGI worker): the call now, no waiting."""
    if request.GET.get("wait", "0") not in ("", "0"):
        raise BadRequest(
            "this server cannot wait (it is not Studio's ASGI application): "
            "route /api/v1/ to daphne, or ask with wait=0"
        )
    approval = approval_for_token(token=token, approval_id=approval_id)
    if approval is None:
        return _error(404, NOT_FOUND)
    return JsonResponse(approval.api_answer())


@login_not_required
@require_GET
def schema(request: HttpRequest) -> JsonResponse:
    """The API's OpenAPI document, for a signed-in member or a token's holder."""
    if not request.user.is_authenticated and (
        token_authenticate(request.headers.get("Authorization", "")) is None
    ):
        return _unauthorized()
    return JsonResponse(SCHEMA)


class ApprovalWait(AsyncHttpConsumer):
    """``GET /api/v1/approvals/<id>[?wait=N]``: the call's state, once decided or after N s.

    It waits on the event loop, holding no thread and no database
    connection: it listens to the token's conversation group, where every
    change of a card is told (``approvals.notify.CardChanged``),
    and reads the row again when its own id goes by, or every POLL_SECONDS.
    """

    # No channel from Channels' loop, which would hold its messages until
    # ``handle`` returns: ``handle`` opens its own (as the member socket does).
    channel_layer_alias = None

    async def handle(self, body: bytes) -> None:
        try:
            await self._answer()
        except DatabaseError:
            logger.warning("api long poll: the database is unavailable", exc_info=True)
            await self._json(
                503,
                {"error": "Studio's database is unavailable; ask again shortly"},
                retry_after="2",
            )

    async def _answer(self) -> None:
        if self.scope["method"] not in ("GET", "HEAD"):
            await self._json(405, {"error": "use GET"}, allow="GET")
            return
        headers = dict(self.scope["headers"])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        rt = runtime()
        token = await rt.off_loop(token_authenticate, authorization)
        if token is None:
            await self._json(401, {"error": UNAUTHORIZED}, www_authenticate='Bearer realm="studio"')
            return
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        try:
            wait = float((query.get("wait") or ["0"])[0])
        except ValueError:
            wait = -1
        if not 0 <= wait <= MAX_WAIT:
            await self._json(
                400, {"error": f"wait must be a number of seconds from 0 to {MAX_WAIT}"}
            )
            return
        approval_id = self.scope["url_route"]["kwargs"]["approval_id"]
        changed = asyncio.Queue()
        listening = None
        if wait:
            # Listening before the first read: a decision after it is heard.
            listening = await self._listen(token.conversation.group_name, approval_id, changed)
        try:
            approval = await rt.off_loop(approval_for_token, token=token, approval_id=approval_id)
            if approval is None:
                await self._json(404, {"error": NOT_FOUND})
                return
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait
            while approval.is_pending and (left := deadline - loop.time()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.get(), min(left, POLL_SECONDS))
                approval = await rt.off_loop(
                    approval_for_token, token=token, approval_id=approval_id
                )
            await self._json(200, approval.api_answer())
            logger.info(
                "api GET %s -> 200 (%s)",
                approval_id,
                approval.status,
                extra={"event": "api_use", "token": token.pk, "user": token.user_id, "status": 200},
            )
        finally:
            if listening is not None:
                await listening()

    async def _listen(self, group: str, approval_id: str, changed: asyncio.Queue):
        """Put a mark in ``changed`` whenever this approval's card changes; returns the closer."""
        layer = get_channel_layer()
        if layer is None:
            return None
        channel = await layer.new_channel()
        await layer.group_add(group, channel)

        async def receive() -> None:
            # Only receive() is awaited here: a cancel finds it there and the
            # layer drops the channel.
            while True:
                message = await layer.receive(channel)
                if message.get("approval_id") == approval_id:
                    changed.put_nowait(True)

        task = asyncio.get_running_loop().create_task(receive())
        await asyncio.sleep(0)

        async def close() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await layer.group_discard(group, channel)

        return close

    async def _json(self, status: int, data: dict, **headers: str) -> None:
        pairs = [(b"content-type", b"application/json")]
        pairs += [
            (name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()
        ]
        body = json.dumps(data).encode()
        if self.scope["method"] == "HEAD":
            body = b""
        await self.send_response(status, body, headers=pairs)

"""Approvals for agents outside the chat: members' API tokens, and calls asked with them.

A call asked through ``/api/v1/`` goes through the same rules as a chat
call of the same tool (a command line of ``terminal`` read as bash reads
it), in the token's own conversation: Deny and Allow answer at once and are
audited; Ask and Review leave a pending row that the member's inbox, the
reviewers and the header counts show like any other, decided by the same
view. The agent learns the decision by reading the row (``approval_for_token``).
"""

from __future__ import annotations

import hmac
import logging
import re
import secrets
import string
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.apps import apps
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from approvals.models import ApiToken, ToolApproval, arguments_hash
from approvals.services.rules import Action, approval_verdict, call_read, tool_schema
from approvals.services.waiting import (
    approval_record_auto,
    approval_record_output,
    approval_request,
)
from studio.db import one_or_none
from studio.net import DEFAULT_PORTS, allowed_endpoints, host_refusal
from studio.text import canonical_json, strip_nul, strip_nul_json

logger = logging.getLogger("studio.api")

TOKEN_RE = re.compile(r"^studio_([A-Za-z0-9]{12})_([A-Za-z0-9_-]{43})$")
TOOL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}$")
LOOKUP_ALPHABET = string.ascii_letters + string.digits
# What one request may carry: arguments as canonical JSON, and a schema.
MAX_ARGUMENTS_BYTES = 64 * 1024
MAX_RESULT_OUTPUT = 1024 * 1024
# How long an API call may wait for its decision (default: STUDIO_APPROVAL_TIMEOUT).
MAX_TIMEOUT = 7 * 24 * 3600


class BadRequest(Exception):
    """The request is not one Studio can take: a 400 naming what is wrong."""


class Conflict(Exception):
    """The request contradicts the row it names (a 409)."""


# --- tokens -----------------------------------------------------------------


def token_create(*, user, name: str, created_by=None) -> tuple[ApiToken, str]:
    """A new token of ``user``'s and its conversation; the secret is returned once, here."""
    name = strip_nul(name or "").strip()
    if not name or len(name) > 80:
        raise BadRequest("a token's name is 1 to 80 characters")
    Conversation = apps.get_model("chat", "Conversation")
    lookup = "".join(secrets.choice(LOOKUP_ALPHABET) for _ in range(12))
    secret = secrets.token_urlsafe(32)
    with transaction.atomic():
        conversation = Conversation.objects.create(
            owner=user, title=f"API: {name}", for_api=True, enabled_tools=[]
        )
        token = ApiToken.objects.create(
            user=user,
            name=name,
            lookup=lookup,
            secret_sha256=ApiToken.secret_hash(secret),
            conversation=conversation,
            created_by=created_by or user,
        )
    logger.info(
        "api token made", extra={"event": "token_created", "token": token.pk, "user": user.pk}
    )
    return token, f"{ApiToken.PREFIX}{lookup}_{secret}"


def token_revoke(*, token: ApiToken, by) -> bool:
    """Revoke it (its next request is refused); False if it was revoked already."""
    now = timezone.now()
    revoked = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=now, revoked_by=by
    )
    if revoked:
        token.revoked_at, token.revoked_by = now, by
        logger.info(
            "api token revoked",
            extra={"event": "token_revoked", "token": token.pk, "user": getattr(by, "pk", None)},
        )
    return bool(revoked)


def token_authenticate(authorization: str) -> ApiToken | None:
    """The active token an ``Authorization: Bearer …`` header carries, its use counted; or None."""
    scheme, _, value = (authorization or "").partition(" ")
    match = TOKEN_RE.match(value.strip()) if scheme.lower() == "bearer" else None
    if match is None:
        return None
    lookup, secret = match.groups()
    token = one_or_none(
        ApiToken.objects.select_related("user", "conversation").filter(lookup=lookup)
    )
    # Compared in constant time, and a hash is compared even for an unknown lookup.
    expected = token.secret_sha256 if token is not None else "0" * 64
    if not hmac.compare_digest(expected, ApiToken.secret_hash(secret)) or token is None:
        return None
    if not token.is_active or not token.user.is_active:
        return None
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now(), uses=F("uses") + 1)
    return token


# --- asking -----------------------------------------------------------------


@dataclass(frozen=True)
class Asked:
    approval: ToolApproval
    # False: the idempotency key named a row made by an earlier request.
    created: bool


def _text(body: dict, name: str, limit: int) -> str:
    value = body.get(name, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string")
    value = strip_nul(value).strip()
    if len(value) > limit:
        raise BadRequest(f"{name} must be at most {limit} characters")
    return value


def _request_fields(body: object) -> dict:
    """The request's fields, checked; raises BadRequest naming the first problem."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    known = {
        "tool",
        "arguments",
        "title",
        "context_url",
        "idempotency_key",
        "timeout",
        "schema",
        "callback_url",
    }
    unknown = sorted(set(body) - known)
    if unknown:
        raise BadRequest(f"unknown field: {unknown[0]} (known: {', '.join(sorted(known))})")
    tool = body.get("tool")
    if not isinstance(tool, str) or not TOOL_RE.match(tool):
        raise BadRequest(
            "tool must be a tool's name: 1 to 100 letters, digits and _ . : / - "
            "(starting with a letter or digit)"
        )
    arguments = body.get("arguments", {})
    if not isinstance(arguments, dict):
        raise BadRequest("arguments must be a JSON object")
    arguments = strip_nul_json(arguments)
    if len(canonical_json(arguments).encode()) > MAX_ARGUMENTS_BYTES:
        raise BadRequest(f"arguments must be at most {MAX_ARGUMENTS_BYTES} bytes as JSON")
    schema = body.get("schema") or {}
    if not isinstance(schema, dict):
        raise BadRequest("schema must be a JSON Schema object")
    if schema:
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            raise BadRequest(f"schema is not a valid JSON Schema: {exc.message}") from None
        _check_fit(schema, arguments, "the schema")
    context_url = _text(body, "context_url", 2000)
    if context_url and not re.match(r"^https?://[^\s/]+", context_url):
        raise BadRequest("context_url must be an http or https URL")
    callback_url = _text(body, "callback_url", 2000)
    if callback_url:
        _check_callback(callback_url)
    timeout = body.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 1 <= timeout <= MAX_TIMEOUT
    ):
        raise BadRequest(f"timeout must be a number of seconds from 1 to {MAX_TIMEOUT}")
    return {
        "tool": tool,
        "arguments": arguments,
        "schema": schema,
        "title": _text(body, "title", 200),
        "context_url": context_url,
        "idempotency_key": _text(body, "idempotency_key", 100),
        "timeout": float(timeout) if timeout is not None else None,
        "callback_url": callback_url,
    }


def _check_fit(schema: dict, arguments: dict, what: str) -> None:
    problem = next(iter(Draft202012Validator(schema).iter_errors(arguments)), None)
    if problem is not None:
        raise BadRequest(f"the arguments do not fit {what}: {problem.message}")


def _check_callback(url: str) -> None:
    """A callback goes to a public address (or one an admin allows): no SSRF."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest("callback_url must be an http or https URL")
    try:
        port = parts.port or DEFAULT_PORTS[parts.scheme]
    except ValueError:
        raise BadRequest("callback_url has a bad port") from None
    refusal = host_refusal(
        parts.hostname,
        port,
        allow=allowed_endpoints(settings.STUDIO_API_CALLBACK_ALLOW_HOSTS),
        scheme=parts.scheme,
    )
    if refusal:
        raise BadRequest(f"callback_url is refused: {refusal}")


def approval_ask(*, token: ApiToken, body: object) -> Asked:
    """Ask for a decision on one call of an agent outside the chat; raises BadRequest, Conflict.

    The idempotency key answers a retried request with its first row (the
    same tool and arguments, or Conflict); a new call goes through the rules.
    """
    fields = _request_fields(body)
    key = fields["idempotency_key"]
    if key:
        earlier = _by_key(token, key)
        if earlier is not None:
            return Asked(_same_call(earlier, fields), created=False)
    conversation = token.conversation
    # A tool the chat knows is read and checked by its own schema, not the agent's.
    schema = tool_schema(fields["tool"])
    if schema is not None:
        _check_fit(schema, fields["arguments"], f"the {fields['tool']} tool")
    else:
        schema = fields["schema"]
    subject, reading = call_read(
        tool_name=fields["tool"], arguments=fields["arguments"], schema=schema
    )
    details = {
        "conversation": conversation,
        "tool_name": fields["tool"],
        "arguments": fields["arguments"],
        "run_id": "",
        "requested_by": token.user,
        "schema": schema,
        "subject": subject,
    }
    api = {
        "source": ToolApproval.Source.API,
        "api_token": token,
        "title": fields["title"],
        "context_url": fields["context_url"],
        "idempotency_key": key,
        "callback_url": fields["callback_url"],
    }
    try:
        with transaction.atomic():
            verdict = approval_verdict(
                conversation=conversation,
                tool_name=fields["tool"],
                subject=subject,
                reading=reading,
            )
            if verdict.action in (Action.ALLOW, Action.DENY):
                approval = approval_record_auto(verdict=verdict, extra=api, **details)
            else:
                approval = approval_request(
                    verdict=verdict, timeout=fields["timeout"], extra=api, **details
                )
    except IntegrityError:
        # The same key in a request that committed first: answer with its row.
        earlier = _by_key(token, key) if key else None
        if earlier is None:
            raise
        return Asked(_same_call(earlier, fields), created=False)
    logger.info(
        "api call asked",
        extra={
            "event": "api_request",
            "token": token.pk,
            "user": token.user_id,
            "approval_id": approval.approval_id,
            "tool": approval.tool_name,
            "status": approval.status,
        },
    )
    return Asked(approval, created=True)


def _by_key(token: ApiToken, key: str) -> ToolApproval | None:
    return one_or_none(
        ToolApproval.objects.select_related("conversation", "decided_by", "api_token").filter(
            api_token=token, idempotency_key=key
        )
    )


def _same_call(approval: ToolApproval, fields: dict) -> ToolApproval:
    if approval.tool_name != fields["tool"] or approval.arguments_sha256 != arguments_hash(
        fields["arguments"]
    ):
        raise Conflict(
            "this idempotency_key was used for another call "
            f"({approval.tool_name}, approval {approval.approval_id})"
        )
    return approval


def approval_for_token(*, token: ApiToken, approval_id: str) -> ToolApproval | None:
    """The row, if this token asked for it (any other id: None, as if unknown)."""
    if not approval_id or len(approval_id) > 64:
        return None
    return one_or_none(
        ToolApproval.objects.select_related("conversation", "decided_by", "api_token").filter(
            approval_id=approval_id, api_token=token
        )
    )


def approval_report(*, token: ApiToken, approval_id: str, body: object) -> ToolApproval | None:
    """The agent says what the allowed call did; once. Raises BadRequest, Conflict."""
    approval = approval_for_token(token=token, approval_id=approval_id)
    if approval is None:
        return None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    unknown = sorted(set(body) - {"exit_status", "output", "seconds"})
    if unknown:
        raise BadRequest(f"unknown field: {unknown[0]} (known: exit_status, output, seconds)")
    exit_status = body.get("exit_status")
    if isinstance(exit_status, bool) or not isinstance(exit_status, int):
        raise BadRequest("exit_status must be an integer (0: the call succeeded)")
    output = body.get("output", "")
    if not isinstance(output, str):
        raise BadRequest("output must be a string")
    if len(output) > MAX_RESULT_OUTPUT:
        raise BadRequest(f"output must be at most {MAX_RESULT_OUTPUT} characters")
    seconds = body.get("seconds", 0)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise BadRequest("seconds must be a number, 0 or more")
    if not approval.is_allowed:
        raise Conflict(f"the call was not allowed ({approval.status}): it has no result")
    Outcome = ToolApproval.RunOutcome
    with transaction.atomic():
        # Once: the first report is the audit's.
        started = ToolApproval.objects.filter(
            pk=approval.pk, started_at__isnull=True, run_outcome=""
        ).update(started_at=timezone.now())
        if not started:
            raise Conflict("a result was recorded for this call already")
        approval_record_output(
            approval=approval,
            text=strip_nul(output),
            seconds=float(seconds),
            outcome=Outcome.OK if exit_status == 0 else Outcome.FAILED,
            session="",
        )
    logger.info(
        "api call reported",
        extra={
            "event": "api_result",
            "token": token.pk,
            "approval_id": approval.approval_id,
            "exit_status": exit_status,
        },
    )
    return ToolApproval.objects.select_related("conversation", "decided_by").get(pk=approval.pk)

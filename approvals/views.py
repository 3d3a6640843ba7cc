from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from approvals.inbox import (
    decided_by,
    entry_context,
    inbox_filters,
    inbox_queryset,
    notifications_set,
    wants_notifications,
)
from approvals.models import ApiToken, ToolApproval, can_review
from approvals.services.api import BadRequest, token_create, token_revoke
from approvals.services.decisions import (
    ApprovalNotFound,
    ClientInfo,
    DecisionForbidden,
    InvalidDecision,
    approval_decide,
    approvals_decide,
)
from studio.db import one_or_none
from studio.http import HtmxHttpRequest, client_ip, wants_json
from studio.logs import log_context

SINGLE = ("decision", "note", "arguments", "pattern", "scope", "fresh")


@require_GET
@login_required
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    """Every pending approval the member may decide, newest first (live over /ws/inbox/)."""
    user = request.user
    entries = [entry_context(approval, user) for approval in inbox_queryset(user)]
    return render(
        request,
        "approvals/inbox.html",
        {
            "entries": entries,
            "notify": wants_notifications(user),
            "reviewer": can_review(user),
            "filters": inbox_filters(entries),
            "decided": decided_by(user),
        },
    )


@require_POST
@login_required
def notifications(request: HtmxHttpRequest) -> HttpResponse:
    """The inbox's opt-in switch for browser notifications."""
    on = request.POST.get("notify") in ("on", "true", "1")
    notifications_set(request.user, on=on)
    if wants_json(request) or request.htmx:
        return JsonResponse({"notify": on})
    return redirect("approvals:inbox")


@require_POST
@login_required
def decide(request: HtmxHttpRequest, approval_id: str) -> HttpResponse:
    """Allow, Deny (+ note), Edit (+ arguments) or Always allow (+ pattern, scope).

    The first decision wins: a later one answers 409 with the current card
    (the proxy's repeat of the request that decided answers as it would
    have). A call a Review rule sends to a reviewer answers 202 with its
    card, waiting.
    """
    try:
        _once(request, SINGLE)
        with log_context(approval_id=approval_id, user_id=request.user.pk):
            result = approval_decide(
                approval_id=approval_id,
                user=request.user,
                decision=request.POST.get("decision", ""),
                note=request.POST.get("note", ""),
                arguments=_edited_arguments(request),
                pattern=request.POST.get("pattern", ""),
                scope=request.POST.get("scope", ""),
                fresh=request.POST.get("fresh", "") in ("1", "true", "on"),
                client=_client(request),
            )
    except ApprovalNotFound:
        raise Http404("No such approval.") from None
    except InvalidDecision as exc:
        return _bad_request(request, str(exc))
    except DecisionForbidden as exc:
        return _refused(request, str(exc), status=403)

    approval = result.approval
    status = 200 if result.resolved else 202 if result.review else 409
    if wants_json(request):
        answer = {"resolved": result.resolved, "status": approval.status, "reason": approval.reason}
        if result.review:
            answer["review"] = True  # pending, now for a reviewer
        return JsonResponse(answer, status=status)
    if request.htmx:
        # A 409 carries the current card too; studio.js tells htmx to swap it.
        return HttpResponse(result.card_html, status=status)
    if result.resolved or result.review:
        return _back(request, approval)
    return render(request, "approvals/already_decided.html", {"approval": approval}, status=409)


@require_POST
@login_required
def decide_batch(request: HtmxHttpRequest) -> HttpResponse:
    """One decision for several approvals (``approval_id`` repeated): Allow all / Deny all."""
    try:
        _once(request, ("decision", "note"))
        answers = approvals_decide(
            approval_ids=request.POST.getlist("approval_id"),
            user=request.user,
            decision=request.POST.get("decision", ""),
            note=request.POST.get("note", ""),
            client=_client(request),
        )
    except InvalidDecision as exc:
        return _bad_request(request, str(exc))
    if wants_json(request) or request.htmx:
        # (htmx: the cards change through the conversation's socket.)
        return JsonResponse({"results": answers})
    found = [a for a in answers if "error" not in a]
    if not found:
        raise Http404("No such approval.")
    first = ToolApproval.objects.get(approval_id=found[0]["approval_id"])
    return _back(request, first)


def _client(request: HtmxHttpRequest) -> ClientInfo:
    """The decision's origin for the audit (the proxy's word only when STUDIO_HTTPS trusts it)."""
    return ClientInfo(
        ip=client_ip(request),
        user_agent=request.META.get("HTTP_USER_AGENT", ""),
        request_id=request.request_id,
    )


def _back(request: HtmxHttpRequest, approval: ToolApproval) -> HttpResponse:
    """After a plain-form decision: the chat for its member, the inbox for a reviewer."""
    if approval.conversation.owner_id == request.user.pk:
        return redirect("chat:conversation", approval.conversation_id)
    return redirect("approvals:inbox")


def _once(request: HtmxHttpRequest, names: tuple[str, ...]) -> None:
    for name in names:
        if len(request.POST.getlist(name)) > 1:
            raise InvalidDecision(f"{name} must be given once")


def _edited_arguments(request: HtmxHttpRequest) -> object:
    """``arguments`` as JSON (the API), or the edit form's ``arg.<name>`` fields."""
    if "arguments" in request.POST:
        try:
            return json.loads(request.POST["arguments"])
        except ValueError as exc:
            raise InvalidDecision(f"arguments must be JSON: {exc}") from None
    fields = {k[4:]: v for k, v in request.POST.items() if k.startswith("arg.")}
    # A textarea sends CRLF; the code that runs keeps the newlines it was written with.
    return {name: value.replace("\r\n", "\n") for name, value in fields.items()} or None


def _bad_request(request: HtmxHttpRequest, message: str) -> HttpResponse:
    return _refused(request, message, status=400)


def _refused(request: HtmxHttpRequest, message: str, *, status: int) -> HttpResponse:
    if wants_json(request):
        return JsonResponse({"error": message}, status=status)
    return HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")


@require_GET
@login_required
def api_tokens(request: HtmxHttpRequest) -> HttpResponse:
    """The member's API tokens for agents outside the chat (made and revoked here)."""
    return _tokens_page(request)


@require_POST
@login_required
def api_token_create(request: HtmxHttpRequest) -> HttpResponse:
    """A new token; its secret is shown on this answer's page, and never again."""
    try:
        token, secret = token_create(user=request.user, name=request.POST.get("name", ""))
    except BadRequest as exc:
        return _tokens_page(request, error=str(exc), status=400)
    return _tokens_page(request, made=token, secret=secret, status=201)


@require_POST
@login_required
def api_token_revoke(request: HtmxHttpRequest, token_id: int) -> HttpResponse:
    token = one_or_none(ApiToken.objects.filter(pk=token_id, user=request.user))
    if token is None:
        raise Http404("No API token of yours has this id.")
    token_revoke(token=token, by=request.user)
    return redirect("approvals:api_tokens")


def _tokens_page(
    request: HtmxHttpRequest, *, made=None, secret: str = "", error: str = "", status: int = 200
) -> HttpResponse:
    tokens = ApiToken.objects.filter(user=request.user).order_by("revoked_at", "-created_at")
    return render(
        request,
        "approvals/api_tokens.html",
        {
            "tokens": tokens,
            "made": made,
            "secret": secret,
            "error": error,
            "base_url": request.build_absolute_uri("/"),
        },
        status=status,
    )

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from approvals.services import (
    ApprovalNotFound,
    DecideResult,
    InvalidDecision,
    approval_decide,
)
from studio.http import HtmxHttpRequest, wants_json

# Decisions run here, not on Django's single thread for sync views: a burst
# of a thousand decisions must not queue behind page renders (or each other).
DECISION_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="studio-decide")


def _decide(**kwargs) -> DecideResult:
    try:
        return approval_decide(**kwargs)
    finally:
        # PostgreSQL: give the connection back to the pool. SQLite: keep this
        # thread's connection; opening one costs more than the decision.
        if connection.vendor != "sqlite":
            connection.close()


@require_POST
@login_required
async def decide(request: HtmxHttpRequest, approval_id: str) -> HttpResponse:
    """Record Allow / Always allow / Deny; the first decision wins (409 after)."""
    for name in ("decision", "note"):
        if len(request.POST.getlist(name)) > 1:
            return _bad_request(request, f"{name} must be given once")
    try:
        result = await sync_to_async(_decide, thread_sensitive=False, executor=DECISION_POOL)(
            approval_id=approval_id,
            user=await request.auser(),
            decision=request.POST.get("decision", ""),
            note=request.POST.get("note", ""),
        )
    except ApprovalNotFound:
        raise Http404("No such approval.") from None
    except InvalidDecision as exc:
        return _bad_request(request, str(exc))

    approval = result.approval
    status = 200 if result.resolved else 409
    if wants_json(request):
        return JsonResponse(
            {"resolved": result.resolved, "status": approval.status, "reason": approval.reason},
            status=status,
        )
    if request.htmx:
        # A 409 carries the current card too; studio.js tells htmx to swap it.
        return HttpResponse(result.card_html, status=status)
    if result.resolved:
        return redirect("chat:conversation", approval.conversation_id)
    return await sync_to_async(render)(
        request,
        "approvals/already_decided.html",
        {"approval": approval},
        status=409,
    )


def _bad_request(request: HtmxHttpRequest, message: str) -> HttpResponse:
    if wants_json(request):
        return JsonResponse({"error": message}, status=400)
    return HttpResponse(message, status=400, content_type="text/plain; charset=utf-8")

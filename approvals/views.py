from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from approvals.services import ApprovalNotFound, InvalidDecision, approval_decide
from studio.http import HtmxHttpRequest, wants_json


@require_POST
@login_required
def decide(request: HtmxHttpRequest, approval_id: str) -> HttpResponse:
    """Record Allow / Always allow / Deny; the first decision wins (409 after)."""
    for name in ("decision", "note"):
        if len(request.POST.getlist(name)) > 1:
            return _bad_request(request, f"{name} must be given once")
    try:
        result = approval_decide(
            approval_id=approval_id,
            user=request.user,
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
    return render(request, "approvals/already_decided.html", {"approval": approval}, status=409)


def _bad_request(request: HtmxHttpRequest, message: str) -> HttpResponse:
    if wants_json(request):
        return JsonResponse({"error": message}, status=400)
    return HttpResponse(message, status=400, content_type="text/plain; charset=utf-8")

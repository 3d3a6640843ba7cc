from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from approvals.models import ToolApproval
from chat.models import Conversation
from chat.services import conversation_start
from studio.http import HtmxHttpRequest


@require_GET
@login_required
def index(request: HtmxHttpRequest) -> HttpResponse:
    conversations = Conversation.objects.owned_by(request.user).order_by("-updated_at")
    return render(request, "chat/index.html", {"conversations": conversations})


@require_POST
@login_required
def conversation_new(request: HtmxHttpRequest) -> HttpResponse:
    conversation = conversation_start(owner=request.user)
    return redirect(conversation)


@require_GET
@login_required
def conversation_detail(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    conversation = get_object_or_404(
        Conversation.objects.owned_by(request.user), pk=conversation_id
    )
    approvals = ToolApproval.objects.filter(conversation=conversation).select_related("decided_by")
    return render(
        request,
        "chat/conversation.html",
        {"conversation": conversation, "approvals": approvals.order_by("requested_at")},
    )

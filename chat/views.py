from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from chat import render as fragments
from chat.engine import run_launch, run_retry, run_stop
from chat.export import conversation_json_text, conversation_markdown
from chat.limits import MAX_MESSAGE
from chat.models import Conversation
from chat.services import (
    conversation_image,
    conversation_rule_revoke,
    conversation_settings_update,
    conversation_start,
    conversation_under_review,
)
from studio.http import HtmxHttpRequest
from studio.text import strip_nul


def _owned(request: HtmxHttpRequest, conversation_id: int) -> Conversation:
    return get_object_or_404(Conversation.objects.owned_by(request.user), pk=conversation_id)


def _viewable(request: HtmxHttpRequest, conversation_id: int) -> tuple[Conversation, bool]:
    """The conversation and whether it is shown read-only: its owner's, or a
    reviewer's while one of its calls waits for a reviewer. Else 404."""
    conversation = Conversation.objects.owned_by(request.user).filter(pk=conversation_id).first()
    if conversation is not None:
        return conversation, False
    conversation = conversation_under_review(conversation_id=conversation_id, user=request.user)
    if conversation is None:
        raise Http404("No such conversation.")
    return conversation, True


@require_GET
@login_required
def index(request: HtmxHttpRequest) -> HttpResponse:
    conversations = Conversation.objects.owned_by(request.user).order_by("-updated_at")
    return render(request, "chat/index.html", {"conversations": conversations})


@require_POST
@login_required
def conversation_new(request: HtmxHttpRequest) -> HttpResponse:
    return redirect(conversation_start(owner=request.user))


@require_GET
@login_required
def conversation_detail(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    conversation, read_only = _viewable(request, conversation_id)
    if read_only:
        context = fragments.review_context(conversation, viewer=request.user)
    else:
        context = fragments.page_context(conversation)
    return render(request, "chat/conversation.html", context)


@require_POST
@login_required
def conversation_send(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    """Plain-form fallback of the WebSocket's send (works before any script runs)."""
    conversation = _owned(request, conversation_id)
    text = strip_nul(request.POST.get("message", ""))
    if len(text) > MAX_MESSAGE:
        return HttpResponse(f"Messages are limited to {MAX_MESSAGE:,} characters.", status=400)
    launch = run_launch(conversation_id=conversation.pk, user=request.user, text=text)
    if not launch.ok:
        messages.error(request, launch.refusal)
    return redirect(conversation)


@require_POST
@login_required
def conversation_stop(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    conversation = _owned(request, conversation_id)
    if not run_stop(conversation_id=conversation.pk, user=request.user):
        messages.info(request, "Nothing is running.")
    return redirect(conversation)


@require_GET
@login_required
def conversation_export(request: HtmxHttpRequest, conversation_id: int, kind: str) -> HttpResponse:
    """The conversation as a file, for its owner: Markdown (``md``) or JSON (``json``)."""
    conversation = _owned(request, conversation_id)
    if kind not in ("md", "json"):
        raise Http404("Export as md or json.")
    if kind == "md":
        body, content_type = conversation_markdown(conversation), "text/markdown; charset=utf-8"
    else:
        body, content_type = conversation_json_text([conversation]), "application/json"
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = (
        f'attachment; filename="conversation-{conversation.pk}.{kind}"'
    )
    return response


@require_POST
@login_required
def conversation_retry(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    """Plain-form fallback of the socket's Retry: ask the model again after an error."""
    conversation = _owned(request, conversation_id)
    launch = run_retry(conversation_id=conversation.pk, user=request.user)
    if not launch.ok:
        messages.error(request, launch.refusal)
    return redirect(conversation)


@require_POST
@login_required
def conversation_settings(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    conversation = _owned(request, conversation_id)
    conversation_settings_update(
        conversation=conversation,
        confirm_tool_calls=request.POST.get("confirm_tool_calls") in ("on", "true", "1"),
        enabled_tools=request.POST.getlist("enabled_tools"),
    )
    if request.htmx:
        return HttpResponse(fragments.settings_panel(conversation, request=request))
    return redirect(conversation)


@require_POST
@login_required
def rule_revoke(request: HtmxHttpRequest, conversation_id: int, rule_id: int) -> HttpResponse:
    conversation = _owned(request, conversation_id)
    if not conversation_rule_revoke(conversation=conversation, rule_id=rule_id, user=request.user):
        return HttpResponse("No such rule.", status=404)
    if request.htmx:
        return HttpResponse(fragments.settings_panel(conversation, request=request))
    return redirect(conversation)


IMAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; sandbox"


@require_GET
@login_required
def conversation_file(request: HtmxHttpRequest, conversation_id: int, key: str) -> HttpResponse:
    """Studio's copy of an image a tool made, for the conversation's owner only;
    never anything that could run script."""
    conversation = _owned(request, conversation_id)
    found = conversation_image(conversation=conversation, key=key)
    if found is None:
        raise Http404("No such image.")
    stream, mime = found
    response = FileResponse(stream, content_type=mime)
    response["X-Content-Type-Options"] = "nosniff"
    # An SVG opened on its own must not run script: no script, a sandbox.
    response["Content-Security-Policy"] = IMAGE_CSP
    response["Content-Disposition"] = "inline"
    response["Cache-Control"] = "private, max-age=3600"
    return response

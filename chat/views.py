from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from chat import display, services, workspace
from chat import render as fragments
from chat.export import conversation_json_text, conversation_markdown
from chat.limits import MAX_MESSAGE
from chat.models import Conversation
from chat.runs.commands import run_edit, run_launch, run_regenerate, run_retry, run_stop
from chat.services import (
    conversation_image,
    conversation_rule_revoke,
    conversation_settings_update,
    conversation_start,
    conversation_under_review,
)
from studio.db import one_or_none
from studio.http import HtmxHttpRequest, wants_json
from studio.text import strip_nul


def _owned(request: HtmxHttpRequest, conversation_id: int) -> Conversation:
    return get_object_or_404(Conversation.objects.owned_by(request.user), pk=conversation_id)


def _viewable(request: HtmxHttpRequest, conversation_id: int) -> tuple[Conversation, str]:
    """The conversation and how it is shown: "own" (its owner's), or read-only
    as "review" (a reviewer's, while one of its calls waits for a reviewer) or
    "shared" (a teammate's, while its owner shares it). Else 404."""
    conversation = one_or_none(
        Conversation.objects.owned_by(request.user).filter(pk=conversation_id)
    )
    if conversation is not None:
        return conversation, "own"
    conversation = conversation_under_review(conversation_id=conversation_id, user=request.user)
    if conversation is not None:
        return conversation, "review"
    conversation = services.conversation_shared_with(
        conversation_id=conversation_id, user=request.user
    )
    if conversation is None:
        raise Http404("No such conversation.")
    return conversation, "shared"


def _settings_panel(request: HtmxHttpRequest, conversation: Conversation, **parts) -> HttpResponse:
    """The chat's settings panel alone, after a change made in it."""
    panel = display.settings_context(conversation)
    return HttpResponse(fragments.settings_panel(panel, request=request, **parts))


@require_GET
@login_required
def index(request: HtmxHttpRequest) -> HttpResponse:
    """The member's conversations, searchable (the sidebar's list, full page),
    and what teammates share with the team."""
    context = display.list_context(request.GET, request.user)
    context["shared"] = services.conversations_shared_by_others(user=request.user)
    return render(request, "chat/index.html", context)


@require_GET
@login_required
def conversation_list(request: HtmxHttpRequest) -> HttpResponse:
    """The sidebar's list alone, for its search box and archive switch."""
    context = display.list_context(request.GET, request.user)
    return render(request, "chat/_conversation_list.html", context)


def _switch(request: HtmxHttpRequest, field: str) -> bool | None:
    """A form's on/off field (1 or 0); None when it is neither."""
    return {"1": True, "0": False}.get(request.POST.get(field, ""))


def _listed(request: HtmxHttpRequest, conversation: Conversation, *, refusal: str = ""):
    """After a sidebar action: the list as its search shows it (htmx), else back
    where the member was; a refusal is a 400 with the reason (or a flash)."""
    if request.htmx:
        if refusal:
            return HttpResponse(refusal, status=400, content_type="text/plain; charset=utf-8")
        context = display.list_context(request.POST, request.user)
        if context["current_id"] == conversation.pk:
            context["renamed"] = conversation
        return render(request, "chat/_conversation_list.html", context)
    if refusal:
        messages.error(request, refusal)
    elif conversation.deleted_at or conversation.archived_at:
        return redirect("chat:index")
    return redirect(conversation)


@require_POST
@login_required
def conversation_rename(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    conversation = _owned(request, conversation_id)
    try:
        services.conversation_rename(
            conversation=conversation, title=strip_nul(request.POST.get("title", ""))
        )
    except services.ConversationRefused as refused:
        return _listed(request, conversation, refusal=str(refused))
    return _listed(request, conversation)


@require_POST
@login_required
def conversation_archive(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    conversation = _owned(request, conversation_id)
    archive = _switch(request, "archive")
    if archive is None:
        return HttpResponse("Say archive=1 or archive=0.", status=400)
    services.conversation_archive(conversation=conversation, archived=archive)
    return _listed(request, conversation)


@require_POST
@login_required
def conversation_share(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    """Share the chat read-only with the team (share=1), or stop (share=0)."""
    conversation = _owned(request, conversation_id)
    share = _switch(request, "share")
    if share is None:
        return HttpResponse("Say share=1 or share=0.", status=400)
    services.conversation_share(conversation=conversation, shared=share)
    if request.htmx:
        return _settings_panel(request, conversation)
    if share:
        messages.success(request, "Shared: your team can read this chat (not change it).")
    else:
        messages.info(request, "No longer shared: only you can open this chat.")
    return redirect(conversation)


@require_POST
@login_required
def conversation_delete(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    conversation = _owned(request, conversation_id)
    if request.POST.get("confirm") != "yes":
        return _listed(request, conversation, refusal="Tick the box to confirm the delete.")
    try:
        services.conversation_delete(conversation=conversation, user=request.user)
    except services.ConversationRefused as refused:
        return _listed(request, conversation, refusal=str(refused))
    if request.htmx and str(conversation.pk) == request.POST.get("current"):
        # The chat on screen is gone: leave it for the list.
        return HttpResponse(headers={"HX-Redirect": reverse("chat:index")})
    return _listed(request, conversation)


@require_POST
@login_required
def conversation_new(request: HtmxHttpRequest) -> HttpResponse:
    return redirect(conversation_start(owner=request.user))


@require_GET
@login_required
def conversation_detail(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    conversation, shown = _viewable(request, conversation_id)
    if shown != "own":
        context = display.review_context(conversation, viewer=request.user)
        context["shared_view"] = shown == "shared"
    else:
        context = display.page_context(conversation)
    return render(request, "chat/conversation.html", context)


@require_POST
@login_required
def conversation_send(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    """Plain-form fallback of the WebSocket's send (works before any script runs)."""
    conversation = _owned(request, conversation_id)
    text = strip_nul(request.POST.get("message", ""))
    if len(text) > MAX_MESSAGE:
        return HttpResponse(f"Messages are limited to {MAX_MESSAGE:,} characters.", status=400)
    if request.FILES:
        # Files sent with the message: all of them first, or no message.
        try:
            saved = workspace.workspace_upload(conversation, request.FILES.getlist("files"))
        except workspace.UploadRefused as refused:
            messages.error(request, str(refused))
            return redirect(conversation)
        note = workspace.attached_note(conversation, [f.name for f in saved])
        text = workspace.with_attached(text, note) if note else text
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
def conversation_regenerate(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    """Plain-form fallback of the socket's Regenerate: run the last turn again."""
    conversation = _owned(request, conversation_id)
    launch = run_regenerate(conversation_id=conversation.pk, user=request.user)
    if not launch.ok:
        messages.error(request, launch.refusal)
    return redirect(conversation)


@require_POST
@login_required
def conversation_edit(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    """Plain-form fallback of the socket's Edit: fork at a message of the member's."""
    conversation = _owned(request, conversation_id)
    message_id = request.POST.get("message_id", "")
    if not message_id.isdigit():
        return HttpResponse("Name the message to edit.", status=400)
    text = strip_nul(request.POST.get("message", ""))
    if len(text) > MAX_MESSAGE:
        return HttpResponse(f"Messages are limited to {MAX_MESSAGE:,} characters.", status=400)
    launch = run_edit(
        conversation_id=conversation.pk, user=request.user, message_id=int(message_id), text=text
    )
    if not launch.ok:
        messages.error(request, launch.refusal)
    return redirect(conversation)


@require_POST
@login_required
def conversation_settings(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    conversation = _owned(request, conversation_id)
    try:
        conversation_settings_update(
            conversation=conversation,
            confirm_tool_calls=request.POST.get("confirm_tool_calls") in ("on", "true", "1"),
            enabled_tools=request.POST.getlist("enabled_tools"),
            model=request.POST.get("model", ""),
        )
    except services.ConversationRefused as refused:
        return HttpResponse(str(refused), status=400, content_type="text/plain; charset=utf-8")
    if request.htmx:
        return _settings_panel(request, conversation)
    return redirect(conversation)


@require_POST
@login_required
def python_restart(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    """End the conversation's python session; its next python call starts afresh."""
    conversation = _owned(request, conversation_id)
    services.python_sessions_reset(conversation_id=conversation.pk)
    if request.htmx:
        return _settings_panel(request, conversation, restarted=True)
    messages.success(request, "Python restarted: the next python call starts afresh.")
    return redirect(conversation)


@require_POST
@login_required
def rule_revoke(request: HtmxHttpRequest, conversation_id: int, rule_id: int) -> HttpResponse:
    conversation = _owned(request, conversation_id)
    if not conversation_rule_revoke(conversation=conversation, rule_id=rule_id, user=request.user):
        return HttpResponse("No such rule.", status=404)
    if request.htmx:
        return _settings_panel(request, conversation)
    return redirect(conversation)


@require_POST
@login_required
def workspace_upload(request: HtmxHttpRequest, conversation_id: int) -> HttpResponse:
    """Files from the member into the conversation's workspace: all, or none."""
    conversation = _owned(request, conversation_id)
    try:
        saved = workspace.workspace_upload(conversation, request.FILES.getlist("files"))
    except workspace.UploadRefused as refused:
        if wants_json(request):
            return JsonResponse({"error": str(refused)}, status=400)
        if request.htmx:
            return HttpResponse(str(refused), status=400, content_type="text/plain; charset=utf-8")
        messages.error(request, str(refused))
        return redirect(conversation)
    if wants_json(request):
        # Files sent with a message (studio.js): their names as saved, for the message.
        return JsonResponse({"saved": [f.name for f in saved]})
    if request.htmx:
        return HttpResponse(
            fragments.files_panel(display.files_context(conversation), request=request, saved=saved)
        )
    messages.success(request, "Uploaded " + ", ".join(f.name for f in saved) + ".")
    return redirect(conversation)


@require_GET
@login_required
def workspace_download(request: HtmxHttpRequest, conversation_id: int, name: str) -> HttpResponse:
    """A file of the workspace, to its member, as a download that never runs in the page."""
    conversation = _owned(request, conversation_id)
    found = workspace.workspace_open(conversation, name)
    if found is None:
        raise Http404("No such file in this chat's workspace.")
    stream, size = found
    response = FileResponse(
        stream,
        as_attachment=True,
        filename=name.rsplit("/", 1)[-1],
        content_type="application/octet-stream",
    )
    response["Content-Length"] = str(size)
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = IMAGE_CSP
    response["Cache-Control"] = "private, no-store"
    return response


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

"""HTML fragments for the chat, shared by the page, the consumer and the runs.

Every fragment comes from the same partials the page renders, so a card or a
message looks the same pushed over the socket or fetched with the page.
"""

from __future__ import annotations

import functools
import time

from django.conf import settings
from django.template.loader import render_to_string
from django.urls import get_script_prefix
from django.utils.html import escape

from approvals.models import ToolApproval, ToolRule
from approvals.services.rules import policy_rules
from chat import events
from chat.display import Item, MessageView, ToolBlock, blocks_for, tool_dom_id, transcript_items
from chat.limits import MAX_MESSAGE
from chat.llm import default_model_label
from chat.models import Conversation, LanguageModel, Message, Run
from chat.services import conversation_list, conversation_retryable, regenerate_point
from chat.tools import builtin_tools
from chat.tools.base import LIVE_LINES
from chat.workspace import workspace_files


def message(view: MessageView, tool_calls: list[dict] = ()) -> str:
    item = Item(message=view)
    if view.role == Message.Role.ASSISTANT:
        item.tools = blocks_for(view.pk, list(tool_calls))
    return render_to_string("chat/_message.html", {"item": item})


def appended(html: str) -> str:
    """``html`` added at the end of the transcript (of every tab that gets it)."""
    return f'<div hx-swap-oob="beforeend:#transcript">{html}</div>'


def tool_block(block: ToolBlock) -> str:
    return render_to_string(
        "chat/_tool_block.html",
        {"block": block, "oob": True, "note_max_length": settings.STUDIO_NOTE_MAX_LENGTH},
    )


def tool_started(event: events.ToolStarted, approval: ToolApproval | None) -> str:
    """The call's block; ``approval``: its card's row, as it is now (None: no card)."""
    return _block(event, approval=approval)


def tool_finished(event: events.ToolFinished) -> str:
    result = MessageView(
        pk=event.result_id,
        role=Message.Role.TOOL,
        content=event.result,
        created_at=event.created_at,
        is_error=not event.ok,
        attachments=list(event.images),
        conversation_id=event.conversation_id,
        stopped_by=event.stopped_by,
    )
    if event.approval_id:
        # The card is on the page already: only the output below it changes.
        return render_to_string(
            "chat/_tool_output.html",
            {
                "dom_id": tool_dom_id(event.message_id, event.call.call_id),
                "call_id": event.call.call_id,
                "result": result,
                "oob": True,
            },
        )
    return _block(event, result=result)


def _block(event: events.ToolStarted | events.ToolFinished, **parts) -> str:
    call = event.call
    return tool_block(
        ToolBlock(
            message_id=event.message_id,
            call_id=call.call_id,
            name=call.name,
            arguments=call.arguments,
            **parts,
        )
    )


def turn_saved(event: events.TurnSaved, conversation_id: int) -> str:
    view = MessageView(
        pk=event.message_id,
        conversation_id=conversation_id,
        role=Message.Role.ASSISTANT,
        content=event.content,
        created_at=event.created_at,
        model_name=event.model_name,
    )
    calls = [{"id": c.call_id, "name": c.name, "arguments": c.arguments} for c in event.calls]
    return message(view, calls)


def batch(message_id: int, approval_ids: tuple[str, ...]) -> str:
    return render_to_string(
        "chat/_batch.html",
        {"message_id": message_id, "approval_ids": approval_ids, "oob": True},
    )


def stream_open(stream_id: str) -> str:
    return render_to_string("chat/_stream.html", {"stream_id": stream_id})


def stream_delta(stream_id: str, text: str) -> str:
    return f'<div hx-swap-oob="beforeend:#{stream_id}-body">{escape(text)}</div>'


def stream_drop(stream_id: str) -> str:
    return f'<div id="{stream_id}" hx-swap-oob="delete"></div>'


def tool_live(message_id: int, call_id: str, text: str) -> str:
    """A running call's card: still running, with the last lines it printed."""
    lines = text.splitlines()
    shown = "\n".join(lines[-LIVE_LINES:])
    if len(lines) > LIVE_LINES and not shown.startswith("…"):
        shown = "…\n" + shown
    return render_to_string(
        "chat/_tool_output.html",
        {
            "dom_id": tool_dom_id(message_id, call_id),
            "call_id": call_id,
            "running": True,
            "live": shown,
            "oob": True,
        },
    )


# The run's status line and controls are sent several times per run, and
# each depends on its arguments alone: rendered once (a template edited
# under DEBUG shows after a restart).
@functools.lru_cache(maxsize=256)
def run_status(text: str) -> str:
    return render_to_string("chat/_run_status.html", {"text": text})


def run_controls(
    *, running: bool, conversation_id: int, retry: bool = False, regenerate: bool = False
) -> str:
    """Stop while a run goes; Retry after one that ended in an error, else Regenerate."""
    after = "" if running else "retry" if retry else "regenerate" if regenerate else ""
    return _run_controls(running, conversation_id, after, get_script_prefix())


@functools.lru_cache(maxsize=1024)
def _run_controls(running: bool, conversation_id: int, after: str, prefix: str) -> str:
    return render_to_string(
        "chat/_run_controls.html",
        {
            "running": running,
            "retry": after == "retry",
            "regenerate": after == "regenerate",
            "oob": True,
            "conversation_id": conversation_id,
        },
    )


def run_after(conversation: Conversation, running: bool) -> dict:
    """What the run controls offer once nothing runs: Retry after an error, or
    Regenerate once the member has asked something."""
    if running:
        return {"retry": False, "regenerate": False}
    retry = conversation_retryable(conversation.pk)
    return {"retry": retry, "regenerate": not retry and regenerate_point(conversation.pk)[0]}


def title(conversation_title: str) -> str:
    return f'<h1 id="conversation-title" hx-swap-oob="outerHTML">{escape(conversation_title)}</h1>'


def files_panel(conversation: Conversation, request=None, *, oob=False, saved=()) -> str:
    """The workspace's list of files (``saved``: just uploaded), never its upload form."""
    context = {**files_context(conversation), "oob": oob, "saved": saved}
    return render_to_string("chat/_file_list.html", context, request=request)


def files_context(conversation: Conversation) -> dict:
    files, more = workspace_files(conversation)
    return {
        "conversation": conversation,
        "files": files,
        "files_more": more,
        "upload_max_mb": settings.STUDIO_UPLOAD_MAX_MB,
    }


def settings_panel(
    conversation: Conversation, request=None, *, oob: bool = False, restarted: bool = False
) -> str:
    context = {**settings_context(conversation), "oob": oob, "restarted": restarted}
    return render_to_string("chat/_settings.html", context, request=request)


def settings_context(conversation: Conversation) -> dict:
    from chat.mcp import panel

    rules = list(
        ToolRule.objects.applying_to(conversation).select_related("created_by").order_by("scope")
    )
    mine = [r for r in rules if r.scope != ToolRule.Scope.EVERYONE]
    team = [r for r in rules if r.scope == ToolRule.Scope.EVERYONE] + policy_rules()
    return {
        "conversation": conversation,
        "tools": list(builtin_tools().values()),
        "mcp_servers": panel(conversation),
        "rules": mine,
        "team_rules": team,
        "python_sessions": settings.STUDIO_PYTHON_SESSIONS,
        "python_idle": _duration(settings.STUDIO_PYTHON_IDLE_SECONDS),
        "models": LanguageModel.objects.filter(enabled=True).only("pk", "name"),
        "default_model": default_model_label(),
    }


def list_context(params, user, *, current: int | None = None) -> dict:
    """The sidebar's (and the index's) list, as its search form asks for it:
    ``q`` words, ``archived=1`` for the archived ones, ``current`` the chat on screen."""
    query = params.get("q", "")[:200]
    archived = params.get("archived") == "1"
    if current is None and str(params.get("current", "")).isdigit():
        current = int(params["current"])
    return {
        "conversations": conversation_list(owner=user, query=query, archived=archived),
        "query": query,
        "archived": archived,
        "current_id": current,
    }


def waiting_markers(user, *, approval_ids: list[str] | None = None) -> str:
    """The sidebar's "waiting" markers, swapped in place: those of the member's
    chats that these approvals belong to, or (None) of the sidebar's whole list."""
    if approval_ids is None:
        waiting = dict(conversation_list(owner=user).values_list("pk", "waiting"))
    else:
        touched = set(
            ToolApproval.objects.filter(
                approval_id__in=approval_ids, conversation__owner=user
            ).values_list("conversation_id", flat=True)
        )
        pending = set(
            ToolApproval.objects.pending()
            .filter(conversation_id__in=touched)
            .values_list("conversation_id", flat=True)
        )
        waiting = {pk: pk in pending for pk in sorted(touched)}
    return render_to_string("chat/_waiting_markers.html", {"markers": waiting.items()})


def page_context(conversation: Conversation) -> dict:
    """Everything ``chat/conversation.html`` shows."""
    # Before anything is read: the socket asks what changed since (whole seconds, down).
    drawn_at = int(time.time())
    running = Run.objects.running().filter(conversation=conversation).exists()
    return {
        "drawn_at": drawn_at,
        **files_context(conversation),
        **list_context({}, conversation.owner, current=conversation.pk),
        **settings_context(conversation),
        "items": transcript_items(conversation),
        "running": running,
        **run_after(conversation, running),
        "message_max_length": MAX_MESSAGE,
        "note_max_length": settings.STUDIO_NOTE_MAX_LENGTH,
    }


def review_context(conversation: Conversation, *, viewer) -> dict:
    """The conversation page, read-only, for a reviewer (cards as they see them)."""
    return {
        "conversation": conversation,
        "items": transcript_items(conversation),
        "read_only": True,
        "viewer": viewer,
        "note_max_length": settings.STUDIO_NOTE_MAX_LENGTH,
    }


# daphne sends no WebSocket message over 1 MiB (``--websocket-max-message-size``):
# a long chat's catch-up goes out in frames of at most this many characters
# (4 bytes each at worst in UTF-8).
FRAME_BUDGET = 192 * 1024


def catch_up(conversation: Conversation, running: bool, *, with_settings: bool = True) -> list[str]:
    """Everything a (re)connecting tab needs to be current, transcript and run
    state (``running``: whether a run is going; and the settings panel, unless
    the page was just drawn with it), as the frames to send: one, unless the
    transcript is too long for it."""
    state = run_controls(
        running=running, conversation_id=conversation.pk, **run_after(conversation, running)
    )
    if with_settings:
        state += settings_panel(conversation, oob=True)
    frames = transcript_frames(conversation)
    if len(frames[-1]) + len(state) <= FRAME_BUDGET:
        return [*frames[:-1], frames[-1] + state]
    return [*frames, state]


def transcript_frames(conversation: Conversation) -> list[str]:
    """The transcript redrawn, in one frame or, when it is too long for one, an
    empty transcript and then its items appended in order, as a reply's are."""
    items = transcript_items(conversation)
    whole = transcript(conversation, items)
    if len(whole) <= FRAME_BUDGET:
        return [whole]
    return [transcript(conversation, []), *_appended_in_frames(conversation, items)]


def _appended_in_frames(conversation: Conversation, items: list) -> list[str]:
    html = render_to_string("chat/_transcript_items.html", _transcript_context(conversation, items))
    if len(html) <= FRAME_BUDGET or len(items) == 1:
        return [appended(html)]
    half = len(items) // 2
    return _appended_in_frames(conversation, items[:half]) + _appended_in_frames(
        conversation, items[half:]
    )


def transcript(conversation: Conversation, items: list) -> str:
    return render_to_string(
        "chat/_transcript.html", {**_transcript_context(conversation, items), "oob": True}
    )


def _transcript_context(conversation: Conversation, items: list) -> dict:
    return {
        "items": items,
        "conversation": conversation,
        "note_max_length": settings.STUDIO_NOTE_MAX_LENGTH,
    }


def notice(text: str, *, level: str = "error") -> str:
    return render_to_string("chat/_notice.html", {"text": text, "level": level})


def composer_state(state: str, seq: int) -> str:
    return f'<div id="composer-state" data-state="{state}" data-seq="{seq}" hidden></div>'


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes >= 1:
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds:g} seconds"

"""HTML fragments for the chat, shared by the page, the consumer and the runs.

Every fragment comes from the same partials the page renders, so a card or a
message looks the same pushed over the socket or fetched with the page. It
draws what it is given and reads nothing (``chat.display`` reads).
"""

from __future__ import annotations

import functools

from django.conf import settings
from django.template.loader import render_to_string
from django.urls import get_script_prefix
from django.utils.html import escape

from approvals.models import ToolApproval
from chat import events
from chat.display import Item, MessageView, ToolBlock, blocks_for, tool_dom_id
from chat.models import Conversation, Message
from chat.tools.base import LIVE_LINES


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
    """Stop while a run goes; Retry after one that ended in an error, else Regenerate
    (``chat.display.run_controls`` reads which)."""
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


def title(conversation_title: str) -> str:
    return f'<h1 id="conversation-title" hx-swap-oob="outerHTML">{escape(conversation_title)}</h1>'


def files_panel(context: dict, request=None, *, oob=False, saved=()) -> str:
    """The workspace's list of files (``context``: ``chat.display.files_context``;
    ``saved``: just uploaded), never its upload form."""
    return render_to_string(
        "chat/_file_list.html", {**context, "oob": oob, "saved": saved}, request=request
    )


def settings_panel(
    context: dict, request=None, *, oob: bool = False, restarted: bool = False
) -> str:
    """The chat's settings (``context``: ``chat.display.settings_context``)."""
    return render_to_string(
        "chat/_settings.html", {**context, "oob": oob, "restarted": restarted}, request=request
    )


def waiting_markers(markers: dict[int, bool]) -> str:
    """The sidebar's "waiting" markers (``chat.display.waiting``), swapped in place."""
    return render_to_string("chat/_waiting_markers.html", {"markers": markers.items()})


# daphne sends no WebSocket message over 1 MiB (``--websocket-max-message-size``):
# a long chat's catch-up goes out in frames of at most this many characters
# (4 bytes each at worst in UTF-8).
FRAME_BUDGET = 192 * 1024


def catch_up(
    conversation: Conversation, items: list, *, controls: dict, panel: dict | None = None
) -> list[str]:
    """Everything a (re)connecting tab needs to be current, as the frames to send:
    the transcript's ``items``, the run ``controls`` (``chat.display.run_controls``)
    and the settings ``panel``'s context, unless the page was just drawn with it.
    One frame, unless the transcript is too long for it."""
    state = run_controls(conversation_id=conversation.pk, **controls)
    if panel is not None:
        state += settings_panel(panel, oob=True)
    frames = transcript_frames(conversation, items)
    if len(frames[-1]) + len(state) <= FRAME_BUDGET:
        return [*frames[:-1], frames[-1] + state]
    return [*frames, state]


def transcript_frames(conversation: Conversation, items: list) -> list[str]:
    """The transcript redrawn, in one frame or, when it is too long for one, an
    empty transcript and then its items appended in order, as a reply's are."""
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

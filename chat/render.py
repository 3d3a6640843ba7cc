"""HTML fragments for the chat, shared by the page, the consumer and the runs.

Every fragment comes from the same partials the page renders, so a card or a
message looks the same pushed over the socket or fetched with the page.
"""

from __future__ import annotations

from django.template.loader import render_to_string

from approvals.models import ToolApproval
from chat.models import Conversation, Message
from chat.services import ToolBlock, transcript_items


def message(msg: Message) -> str:
    from chat.services import Item

    item = Item(message=msg)
    if msg.role == Message.Role.ASSISTANT:
        item.tools = [
            ToolBlock(
                message_id=msg.pk,
                call_id=c["id"],
                name=c["name"],
                arguments=c.get("arguments") or {},
            )
            for c in msg.tool_calls
        ]
    return render_to_string("chat/_message.html", {"item": item})


def appended(html: str) -> str:
    """``html`` added at the end of the transcript (of every tab that gets it)."""
    return f'<div hx-swap-oob="beforeend:#transcript">{html}</div>'


def tool_block(block: ToolBlock, *, oob: bool = True) -> str:
    return render_to_string("chat/_tool_block.html", {"block": block, "oob": oob})


def tool_block_for_event(data: dict) -> str:
    approval: ToolApproval | None = data.get("approval")
    if approval is not None:
        approval = ToolApproval.objects.select_related("decided_by").get(pk=approval.pk)
    block = ToolBlock(
        message_id=data["message_id"],
        call_id=data["tool_call_id"],
        name=data["tool"],
        arguments=data.get("arguments") or {},
        approval=approval,
        result=data.get("message"),
    )
    return tool_block(block)


def tool_output(data: dict) -> str:
    """Only the result part of a tool block: the card was already pushed."""
    from chat.services import tool_dom_id

    return render_to_string(
        "chat/_tool_output.html",
        {
            "dom_id": tool_dom_id(data["message_id"], data["tool_call_id"]),
            "call_id": data["tool_call_id"],
            "result": data.get("message"),
            "oob": True,
        },
    )


def stream_open(stream_id: str) -> str:
    return render_to_string("chat/_stream.html", {"stream_id": stream_id})


def run_status(text: str) -> str:
    return render_to_string("chat/_run_status.html", {"text": text})


def run_controls(*, running: bool, conversation_id: int) -> str:
    return render_to_string(
        "chat/_run_controls.html",
        {"running": running, "oob": True, "conversation_id": conversation_id},
    )


def settings_panel(conversation: Conversation, request=None, *, oob: bool = False) -> str:
    context = {**settings_context(conversation), "oob": oob}
    return render_to_string("chat/_settings.html", context, request=request)


def settings_context(conversation: Conversation) -> dict:
    from approvals.models import ToolGrant
    from chat.tools import REGISTRY

    grants = (
        ToolGrant.objects.active().filter(conversation=conversation).select_related("granted_by")
    )
    return {"conversation": conversation, "tools": list(REGISTRY.values()), "grants": list(grants)}


def catch_up(conversation: Conversation) -> str:
    """Everything a (re)connecting tab needs to be current: transcript and run state."""
    from chat.models import Run

    running = Run.objects.running().filter(conversation=conversation).exists()
    return (
        transcript(conversation)
        + run_controls(running=running, conversation_id=conversation.pk)
        + settings_panel(conversation, oob=True)
    )


def transcript(conversation: Conversation) -> str:
    return render_to_string(
        "chat/_transcript.html",
        {"items": transcript_items(conversation), "conversation": conversation, "oob": True},
    )


def notice(text: str, *, level: str = "error") -> str:
    return render_to_string("chat/_notice.html", {"text": text, "level": level})


def composer_state(state: str, seq: int) -> str:
    return f'<div id="composer-state" data-state="{state}" data-seq="{seq}" hidden></div>'

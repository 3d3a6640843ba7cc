"""A conversation as a file: Markdown for people, JSON for machines and the audit.

The JSON holds every message (tool calls and results included) and every
approval row of the conversation with all its fields (reasons, hashes,
who decided), as ``approvals.export`` writes them for the archive.
"""

from __future__ import annotations

import json

from approvals.export import row_record
from approvals.models import ToolApproval
from chat.models import Conversation, Message


def conversation_json(conversation: Conversation) -> dict:
    approvals = ToolApproval.objects.filter(conversation=conversation).order_by(
        "requested_at", "pk"
    )
    return {
        "conversation": {
            "id": conversation.pk,
            "title": conversation.title,
            "owner": conversation.owner.get_username(),
            "created_at": conversation.created_at.isoformat(),
        },
        "messages": [row_record(m) for m in conversation.messages.order_by("created_at", "id")],
        "approvals": [row_record(a) for a in approvals],
    }


def conversation_json_text(conversations) -> str:
    """One conversation as an object, several as a list (the admin's export)."""
    documents = [conversation_json(c) for c in conversations]
    body = documents[0] if len(documents) == 1 else documents
    return json.dumps(body, ensure_ascii=False, indent=2) + "\n"


WHO = {
    Message.Role.USER: "You",
    Message.Role.ASSISTANT: "Assistant",
    Message.Role.ERROR: "Studio",
}


def conversation_markdown(conversation: Conversation) -> str:
    approvals = {a.approval_id: a for a in ToolApproval.objects.filter(conversation=conversation)}
    lines = [f"# {conversation.title}", ""]
    for message in conversation.messages.order_by("created_at", "id"):
        when = message.created_at.strftime("%Y-%m-%d %H:%M")
        if message.superseded_at is not None:
            when += " (earlier version: replaced by an edit or a regenerate)"
        if message.role == Message.Role.TOOL:
            approval = approvals.get(message.approval_id)
            how = f" ({approval.status_label})" if approval is not None else ""
            lines += [
                f"**{message.tool_name}** call{how}, {when}:",
                "",
                _fenced(json.dumps(message.tool_arguments, ensure_ascii=False, indent=2), "json"),
                "",
                _fenced(message.content),
                "",
            ]
            continue
        lines += [f"**{WHO.get(message.role, message.role)}**, {when}:", ""]
        if message.content:
            lines += [message.content, ""]
    return "\n".join(lines)


def _fenced(text: str, language: str = "") -> str:
    """``text`` in a code fence longer than any run of backticks inside it."""
    fence = "`" * max(3, _longest_backticks(text) + 1)
    return f"{fence}{language}\n{text}\n{fence}"


def _longest_backticks(text: str) -> int:
    longest = current = 0
    for char in text:
        current = current + 1 if char == "`" else 0
        longest = max(longest, current)
    return longest

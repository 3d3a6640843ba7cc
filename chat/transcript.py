"""The model's transcript, rebuilt from Message rows (nothing lives only in memory).

A run builds it once when it starts and then appends what it saves, with
the same two helpers, so the model sees exactly what a rebuild would give.
"""

from __future__ import annotations

import json

from chat.models import Conversation, Message
from chat.workspace import workspace_summary

SYSTEM_PROMPT = (
    "You are the assistant in Studio, a team chat. You can call tools: {tools}. "
    "Each tool call may wait for the user's approval; if the user declines a call, "
    "respect that and do not retry it unless they ask. Don't repeat a call that "
    "already succeeded; use its result. If your server has no native tool calling, "
    'write a call as <tool_call>{{"name": "python", "arguments": {{"code": "..."}}}}'
    "</tool_call> on its own. Files in the workspace (your tools' working folder, where "
    "the user's uploads land too): {files}. To hand the user a file, link it in Markdown "
    "as [its name](workspace:path/in/the/workspace); Studio makes that a download."
)
INTERRUPTED = "Error: no result was recorded for this call (the run was interrupted)."


def turn_message(content: str, tool_calls: list[dict]) -> dict:
    entry: dict = {"role": "assistant", "content": content or None}
    if tool_calls:
        entry["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments") or {})},
            }
            for c in tool_calls
        ]
    return entry


def tool_message(call_id: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def transcript_build(conversation: Conversation, *, tools: str) -> list[dict]:
    """``tools``: the enabled tools described for the system prompt."""
    messages: list[dict] = [
        {
            "role": "system",
            "content": SYSTEM_PROMPT.format(
                tools=tools or "none", files=workspace_summary(conversation)
            ),
        }
    ]
    open_calls: list[str] = []
    # Four columns, not model instances: a long conversation is read again at
    # every message sent (200 rows: 4.6 ms as instances, 1.4 ms as tuples).
    # Not what an edit or a regenerate replaced: the model reads the branch it is on.
    rows = conversation.messages.filter(superseded_at__isnull=True)
    rows = rows.order_by("created_at", "id").values_list(
        "role", "content", "tool_calls", "tool_call_id"
    )
    for role, content, tool_calls, tool_call_id in rows:
        if role != Message.Role.TOOL:
            messages.extend(_close(open_calls))
            open_calls = []
        if role == Message.Role.USER:
            messages.append({"role": "user", "content": content})
        elif role == Message.Role.ASSISTANT:
            messages.append(turn_message(content, tool_calls))
            open_calls = [c["id"] for c in tool_calls]
        elif role == Message.Role.TOOL:
            if tool_call_id in open_calls:
                open_calls.remove(tool_call_id)
                messages.append(tool_message(tool_call_id, content))
        # ERROR rows are for people, not for the model.
    messages.extend(_close(open_calls))
    return messages


def _close(open_calls: list[str]) -> list[dict]:
    """Results for calls a crashed run never answered, so the transcript stays valid."""
    return [tool_message(c, INTERRUPTED) for c in open_calls]

"""The chat as people see it: the read model the page, the socket and the runs render.

Services write rows; this module only reads them (and the values runs
announce) into small view objects and template contexts, which
``chat.render`` draws without reading anything more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings

from approvals.models import ToolApproval, ToolRule
from approvals.services.rules import policy_rules
from chat.limits import MAX_MESSAGE
from chat.llm import default_model_label
from chat.mcp import panel
from chat.models import Conversation, LanguageModel, Message, Run
from chat.services import conversation_list, conversation_retryable, regenerate_point
from chat.tools import builtin_tools
from chat.workspace import workspace_files
from studio.wording import EDITED_TEXT


@dataclass
class MessageView:
    """What ``chat/_message.html`` shows of a message (a row or a run's event)."""

    pk: int
    role: str
    content: str
    created_at: datetime
    is_error: bool = False
    # Tool results: the images the call made, and where they live.
    attachments: list[dict] = field(default_factory=list)
    conversation_id: int = 0
    # Replaced by an edit or a regenerate: shown in an earlier version's fold.
    superseded: bool = False
    model_name: str = ""  # assistant turns: the model that wrote it
    stopped_by: str = ""  # tool results cut short by Stop: who pressed it

    @property
    def shown(self) -> str:
        """The content as the member reads it: without the line meant for the
        model about an edit (the card shows the edit itself)."""
        return self.content.removeprefix(EDITED_TEXT + "\n")

    @classmethod
    def of(cls, message: Message) -> MessageView:
        return cls(
            pk=message.pk,
            role=message.role,
            content=message.content,
            created_at=message.created_at,
            is_error=message.is_error,
            attachments=message.attachments,
            conversation_id=message.conversation_id,
            superseded=message.superseded_at is not None,
            model_name=message.model_name,
            stopped_by=message.stopped_by,
        )


@dataclass
class ToolBlock:
    message_id: int
    call_id: str
    name: str
    arguments: dict
    approval: ToolApproval | None = None
    result: MessageView | None = None

    @property
    def dom_id(self) -> str:
        return tool_dom_id(self.message_id, self.call_id)


@dataclass
class Item:
    message: MessageView
    tools: list[ToolBlock] = field(default_factory=list)
    folded: tuple = ()


@dataclass
class Fold:
    """An earlier version: what one edit or regenerate replaced, readable, folded."""

    folded: list[Item | Fold]  # an earlier fork's fold may sit inside a later one's
    message: None = None

    @property
    def count(self) -> int:
        return sum(entry.count if isinstance(entry, Fold) else 1 for entry in self.folded)


def tool_dom_id(message_id: int, call_id: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in call_id)[:80]
    return f"tool-{message_id}-{safe}"


def blocks_for(message_id: int, tool_calls: list[dict]) -> list[ToolBlock]:
    return [
        ToolBlock(
            message_id=message_id,
            call_id=c["id"],
            name=c["name"],
            arguments=c.get("arguments") or {},
        )
        for c in tool_calls
    ]


def transcript_items(conversation: Conversation, *, limit: int = 500) -> list[Item | Fold]:
    """Messages in order, each assistant turn with its tool calls, approvals and results;
    what an edit or a regenerate replaced, folded where it was."""
    messages = list(conversation.messages.order_by("-created_at", "-id")[:limit])
    messages.reverse()
    approvals = {}
    rows = ToolApproval.objects.filter(conversation=conversation).select_related(
        "decided_by", "requested_by"
    )
    for a in rows.order_by("requested_at"):
        a.conversation = conversation  # the cards ask whose it is; no query each
        approvals[(a.run_id, a.tool_call_id)] = a
    items: list[Item] = []
    blocks: dict[str, ToolBlock] = {}
    for m in messages:
        if m.role == Message.Role.TOOL:
            block = blocks.get(m.tool_call_id)
            if block is not None:
                block.result = MessageView.of(m)
            continue
        item = Item(message=MessageView.of(m))
        if m.role == Message.Role.ASSISTANT:
            for block in blocks_for(m.pk, m.tool_calls):
                block.approval = approvals.get((str(m.run_id or ""), block.call_id))
                blocks[block.call_id] = block
                item.tools.append(block)
        items.append((m.superseded_at, item))
    return _folded(items)


def _folded(items: list[tuple[datetime | None, Item]]) -> list[Item | Fold]:
    """The branch as it is, with each replaced stretch folded where it was."""
    shown: list[Item | Fold] = []
    stretch: list[tuple[datetime, Item]] = []
    for superseded_at, item in items:
        if superseded_at is None:
            shown.extend(_fold(stretch))
            shown.append(item)
            stretch = []
        else:
            stretch.append((superseded_at, item))
    return shown + _fold(stretch)


def _fold(stretch: list[tuple[datetime, Item]]) -> list[Fold]:
    """Replaced messages in a row: the latest fork's fold spans from the first to
    the last message it replaced, and holds the folds of earlier forks inside it."""
    if not stretch:
        return []
    latest = max(at for at, _ in stretch)
    mine = [n for n, (at, _) in enumerate(stretch) if at == latest]
    first, last = mine[0], mine[-1]
    inside: list[Item | Fold] = []
    earlier: list[tuple[datetime, Item]] = []
    for at, item in stretch[first : last + 1]:
        if at == latest:
            inside.extend(_fold(earlier))
            inside.append(item)
            earlier = []
        else:
            earlier.append((at, item))
    return _fold(stretch[:first]) + [Fold(folded=inside)] + _fold(stretch[last + 1 :])


# --- what the page, the panels and a tab's catch-up show -------------------------


def run_controls(conversation: Conversation, running: bool) -> dict:
    """What the run controls offer: Stop while a run goes; once nothing runs,
    Retry after an error, or Regenerate once the member has asked something."""
    if running:
        return {"running": True, "retry": False, "regenerate": False}
    retry = conversation_retryable(conversation.pk)
    regenerate = not retry and regenerate_point(conversation.pk)[0]
    return {"running": False, "retry": retry, "regenerate": regenerate}


def files_context(conversation: Conversation) -> dict:
    files, more = workspace_files(conversation)
    return {
        "conversation": conversation,
        "files": files,
        "files_more": more,
        "upload_max_mb": settings.STUDIO_UPLOAD_MAX_MB,
    }


def settings_context(conversation: Conversation) -> dict:
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
        "models": list(LanguageModel.objects.filter(enabled=True).only("pk", "name")),
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
        "conversations": list(conversation_list(owner=user, query=query, archived=archived)),
        "query": query,
        "archived": archived,
        "current_id": current,
    }


def waiting(user, *, approval_ids: list[str] | None = None) -> dict[int, bool]:
    """Whether each of the member's chats waits for a decision: those these
    approvals belong to, or (None) every chat of the sidebar's list."""
    if approval_ids is None:
        return dict(conversation_list(owner=user).values_list("pk", "waiting"))
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
    return {pk: pk in pending for pk in sorted(touched)}


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
        **run_controls(conversation, running),
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


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes >= 1:
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds:g} seconds"

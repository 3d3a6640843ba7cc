"""Chat services: conversations, messages, runs and conversation settings."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.models import ToolApproval, ToolGrant
from approvals.notify import group_send, member_group
from approvals.services import grant_revoke
from chat.models import Conversation, Message, Run
from chat.tools import tool_names

logger = logging.getLogger(__name__)

TITLE_LENGTH = 60


class RunBusy(Exception):
    """The conversation already has a run going."""


def session_digest(session_key: str | None) -> str:
    """A session key as it may travel through the channel layer (not the key itself)."""
    return hashlib.sha256((session_key or "").encode()).hexdigest() if session_key else ""


def member_sessions_recheck(*, user_id: int, ended_session: str | None = None) -> None:
    """After commit, make every open socket of the member re-check its session."""
    message = {"type": "session.check", "ended": session_digest(ended_session)}
    transaction.on_commit(lambda: group_send(member_group(user_id), message))


def conversation_start(*, owner, title: str = "New chat") -> Conversation:
    return Conversation.objects.create(owner=owner, title=title[:200] or "New chat")


def conversation_settings_update(
    *, conversation: Conversation, confirm_tool_calls: bool, enabled_tools: list[str]
) -> Conversation:
    known = tool_names()
    conversation.confirm_tool_calls = confirm_tool_calls
    conversation.enabled_tools = [name for name in known if name in set(enabled_tools)]
    conversation.save(update_fields=["confirm_tool_calls", "enabled_tools", "updated_at"])
    return conversation


def conversation_grant_revoke(*, conversation: Conversation, grant_id: int, user) -> bool:
    grant = ToolGrant.objects.active().filter(pk=grant_id, conversation=conversation).first()
    if grant is None:
        return False
    return grant_revoke(grant=grant, user=user)


def run_create(
    *,
    conversation_id: int,
    user,
    text: str,
    inbox: str,
    is_dead: Callable[[str], bool] | None = None,
) -> Run:
    """Claim the conversation for a new run and save the user's message.

    The database's partial unique index makes the claim atomic across
    processes. A run in the way is retired first if its process died: its
    heartbeat is stale, or ``is_dead(run_id)`` says so (a single-process
    deployment knows every live run, so one it does not know died with the
    previous server).
    """
    conversation = Conversation.objects.get(pk=conversation_id, owner=user)
    for attempt in range(2):
        try:
            with transaction.atomic():
                run = Run.objects.create(conversation=conversation, started_by=user, inbox=inbox)
                Message.objects.create(
                    conversation=conversation, run=run, role=Message.Role.USER, content=text
                )
                if conversation.title == "New chat":
                    conversation.title = _title_from(text)
                conversation.save(update_fields=["title", "updated_at"])
            return run
        except IntegrityError:
            if attempt:
                raise RunBusy(conversation_id) from None
            retired = run_retire_stale(conversation_id=conversation_id)[0]
            if not retired and is_dead is not None:
                running = Run.objects.running().filter(conversation_id=conversation_id)
                running = running.values_list("id", flat=True)
                retired = _retire([i for i in running if is_dead(str(i))])[0]
            if not retired:
                raise RunBusy(conversation_id) from None
    raise RunBusy(conversation_id)


def _title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1] + "…"


def stale_runs(*, conversation_id: int | None = None):
    """Running runs whose process stopped refreshing their heartbeat (it died)."""
    cutoff = timezone.now() - timedelta(seconds=settings.STUDIO_RUN_STALE_SECONDS)
    runs = Run.objects.running().filter(heartbeat_at__lt=cutoff)
    if conversation_id is not None:
        runs = runs.filter(conversation_id=conversation_id)
    return runs


def run_retire_stale(
    *, conversation_id: int | None = None, dry_run: bool = False
) -> tuple[int, int]:
    """Mark dead runs as errors and expire their pending approvals.

    Three queries whatever the number of rows. Returns (runs, approvals).
    """
    ids = list(stale_runs(conversation_id=conversation_id).values_list("id", flat=True))
    return _retire(ids, dry_run=dry_run)


def _retire(ids: list, *, dry_run: bool = False) -> tuple[int, int]:
    if not ids:
        return 0, 0
    approvals = ToolApproval.objects.pending().filter(run_id__in=[str(i) for i in ids])
    if dry_run:
        return len(ids), approvals.count()
    now = timezone.now()
    retired = (
        Run.objects.running()
        .filter(pk__in=ids)
        .update(
            status=Run.Status.ERROR,
            finished_at=now,
            error="The server process running this stopped.",
        )
    )
    expired = approvals.update(
        status=ToolApproval.Status.DENIED, reason=ToolApproval.Reason.EXPIRED, decided_at=now
    )
    return retired, expired


def run_heartbeat(*, run_ids: list[str]) -> int:
    if not run_ids:
        return 0
    return Run.objects.running().filter(pk__in=run_ids).update(heartbeat_at=timezone.now())


def run_finish(*, run_id: str, status: str, error: str = "") -> None:
    Run.objects.running().filter(pk=run_id).update(
        status=status, error=error[:2000], finished_at=timezone.now()
    )


# --- reading the transcript for display ---------------------------------------------


@dataclass
class ToolBlock:
    message_id: int
    call_id: str
    name: str
    arguments: dict
    approval: ToolApproval | None = None
    result: Message | None = None

    @property
    def dom_id(self) -> str:
        return tool_dom_id(self.message_id, self.call_id)


@dataclass
class Item:
    message: Message
    tools: list[ToolBlock] = field(default_factory=list)


def tool_dom_id(message_id: int, call_id: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in call_id)[:80]
    return f"tool-{message_id}-{safe}"


def transcript_items(conversation: Conversation, *, limit: int = 500) -> list[Item]:
    """Messages in order, each assistant turn with its tool calls, approvals and results."""
    messages = list(conversation.messages.order_by("-created_at", "-id")[:limit])
    messages.reverse()
    approvals = {
        (a.run_id, a.tool_call_id): a
        for a in ToolApproval.objects.filter(conversation=conversation)
        .select_related("decided_by")
        .order_by("requested_at")
    }
    items: list[Item] = []
    blocks: dict[str, ToolBlock] = {}
    for m in messages:
        if m.role == Message.Role.TOOL:
            block = blocks.get(m.tool_call_id)
            if block is not None:
                block.result = m
            continue
        item = Item(message=m)
        if m.role == Message.Role.ASSISTANT:
            for call in m.tool_calls:
                block = ToolBlock(
                    message_id=m.pk,
                    call_id=call["id"],
                    name=call["name"],
                    arguments=call.get("arguments") or {},
                    approval=approvals.get((str(m.run_id or ""), call["id"])),
                )
                blocks[call["id"]] = block
                item.tools.append(block)
        items.append(item)
    return items

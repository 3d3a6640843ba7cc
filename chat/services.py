"""Chat services: conversations, messages, runs and conversation settings."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from approvals.models import ToolApproval, ToolRule, can_review
from approvals.notify import member_group
from approvals.services.rules import rule_revoke
from approvals.services.waiting import approvals_end
from chat.models import Conversation, Message, Run
from chat.tools import builtin_tools
from studio.runtime import runtime
from studio.sessions import session_digest

logger = logging.getLogger(__name__)

TITLE_LENGTH = 60


class RunBusy(Exception):
    """The conversation already has a run going."""


def member_sessions_recheck(*, user_id: int, ended_session: str | None = None) -> None:
    """After commit, make every open socket of the member re-check its session."""
    message = {"type": "session.check", "ended": session_digest(ended_session)}
    transaction.on_commit(lambda: runtime().outbox.group(member_group(user_id), message))


def conversation_start(*, owner, title: str = "New chat") -> Conversation:
    """A chat to start in: the member's blank one if there is one, else a new one.

    A chat nobody has written in yet is reused, so "New chat" clicked again
    and again does not pile up empty conversations in the list.
    """
    blank = (
        Conversation.objects.filter(owner=owner, messages__isnull=True, runs__isnull=True)
        .order_by("-pk")
        .first()
    )
    if blank is None:
        return Conversation.objects.create(owner=owner, title=title[:200] or "New chat")
    blank.title = title[:200] or "New chat"
    blank.save(update_fields=["title", "updated_at"])  # to the top of the list
    return blank


def conversation_settings_update(
    *, conversation: Conversation, confirm_tool_calls: bool, enabled_tools: list[str]
) -> Conversation:
    """Save the panel: built-ins are switched on, MCP tools (on by default) off."""
    from chat.mcp import known_tool_names

    chosen = set(enabled_tools)
    conversation.confirm_tool_calls = confirm_tool_calls
    conversation.enabled_tools = [name for name in builtin_tools() if name in chosen]
    conversation.disabled_tools = [name for name in known_tool_names() if name not in chosen]
    conversation.save(
        update_fields=["confirm_tool_calls", "enabled_tools", "disabled_tools", "updated_at"]
    )
    return conversation


def conversation_image(*, conversation: Conversation, key: str):
    """(open file, MIME type) of Studio's copy of an image a tool of this
    conversation made, or None. Only image types, only by the key the copy
    was saved under; the workspace itself is never read here."""
    from pathlib import PurePosixPath

    from django.core.exceptions import SuspiciousFileOperation
    from django.core.files.storage import default_storage

    from chat.tools.images import IMAGE_TYPES, storage_name

    path = PurePosixPath(key)
    mime = IMAGE_TYPES.get(path.suffix.lower())
    if mime is None or "\x00" in key or len(path.parts) != 2 or ".." in path.parts:
        return None
    try:
        return default_storage.open(storage_name(conversation.workspace.name, key), "rb"), mime
    except (OSError, SuspiciousFileOperation, ValueError):
        return None


def conversation_under_review(*, conversation_id: int, user) -> Conversation | None:
    """Another member's conversation a reviewer may read while one of its calls
    waits for a reviewer (read-only: no sending, no settings)."""
    if not can_review(user):
        return None
    waiting = ToolApproval.objects.pending().filter(
        conversation_id=conversation_id, needs_review=True
    )
    if not waiting.exists():
        return None
    return Conversation.objects.select_related("owner").filter(pk=conversation_id).first()


def conversation_rule_revoke(*, conversation: Conversation, rule_id: int, user) -> bool:
    """Revoke one of the member's own rules shown in this conversation's panel."""
    rule = (
        ToolRule.objects.active()
        .filter(pk=rule_id)
        .filter(
            Q(scope=ToolRule.Scope.CONVERSATION, conversation=conversation)
            | Q(scope=ToolRule.Scope.MEMBER, member=user)
        )
        .first()
    )
    if rule is None or conversation.owner_id != user.pk:
        return False
    return rule_revoke(rule=rule, user=user)


def run_create(
    *,
    run_id: str,
    conversation_id: int,
    user,
    text: str,
    inbox: str,
    is_dead: Callable[[str], bool] | None = None,
) -> tuple[Run, Message]:
    """Claim the conversation for a new run and save the user's message; returns both.

    The database's partial unique index makes the claim atomic across
    processes. A run in the way is retired first if its process died: its
    heartbeat is stale, or ``is_dead(run_id)`` says so (a single-process
    deployment knows every live run, so one it does not know died with the
    previous server). The caller registers ``run_id`` as live *before*
    calling, so a concurrent send never mistakes this run for a dead one.
    """
    conversation = Conversation.objects.select_related("owner").get(pk=conversation_id, owner=user)
    for attempt in range(2):
        try:
            with transaction.atomic():
                # The owner as read here, not ``user``: the run keeps it for its
                # life, and a view's ``request.user`` is a lazy object that holds
                # its whole request (11 KB more per parked run, measured at 10,000).
                run = Run.objects.create(
                    id=run_id,
                    conversation=conversation,
                    started_by=conversation.owner,
                    inbox=inbox,
                )
                message = Message.objects.create(
                    conversation=conversation,
                    run=run,
                    role=Message.Role.USER,
                    content=text,
                )
                if conversation.title == "New chat":
                    conversation.title = _title_from(text)
                conversation.save(update_fields=["title", "updated_at"])
            return run, message
        except IntegrityError:
            if attempt:
                raise RunBusy(conversation_id) from None
            retired = runs_retire(runs=stale_runs(conversation_id=conversation_id))[0]
            if not retired and is_dead is not None:
                running = Run.objects.running().filter(conversation_id=conversation_id)
                dead = [i for i in running.values_list("id", flat=True) if is_dead(str(i))]
                retired = runs_retire(runs=Run.objects.filter(pk__in=dead))[0]
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


def runs_retire(*, runs, dry_run: bool = False) -> tuple[int, int]:
    """Mark runs of dead processes as failed and expire their pending approvals.

    Their cards turn "Expired" in every open tab. Returns (runs, approvals).
    """
    ids = [str(i) for i in runs.filter(status=Run.Status.RUNNING).values_list("id", flat=True)]
    if not ids:
        return 0, 0
    pending = ToolApproval.objects.filter(run_id__in=ids)
    if dry_run:
        return len(ids), pending.pending().count()
    retired = (
        Run.objects.running()
        .filter(pk__in=ids)
        .update(
            status=Run.Status.ERROR,
            finished_at=timezone.now(),
            error="The server process running this stopped.",
        )
    )
    expired = approvals_end(pending=pending, reason=ToolApproval.Reason.EXPIRED)
    return retired, len(expired)


def on_purge(sender, *, dry_run: bool, report: list, **kwargs) -> None:
    """purge_approvals asks every app for its part: ours is the runs of dead processes."""
    retired, expired = runs_retire(runs=stale_runs(), dry_run=dry_run)
    if retired:
        verb = "Would retire" if dry_run else "Retired"
        report.append(
            f"{verb} {retired} run(s) of dead server processes with {expired} pending approval(s)."
        )


def run_heartbeat(*, inbox: str) -> int:
    """Mark every running run of the process with this inbox alive (one statement)."""
    if not inbox:
        return 0
    return Run.objects.running().filter(inbox=inbox).update(heartbeat_at=timezone.now())


def run_finish(*, run_id: str, status: str, error: str = "") -> None:
    """Record how the run ended; a run ended already (retired as dead, say) keeps its record."""
    Run.objects.filter(pk=run_id, status=Run.Status.RUNNING).update(
        status=status, error=error[:2000], finished_at=timezone.now()
    )

"""Chat services: conversations, messages, runs and conversation settings."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from approvals.models import ToolApproval, ToolRule, can_review
from approvals.notify import member_group
from approvals.services.rules import rule_revoke
from approvals.services.waiting import approval_cancel_run, approvals_time_out
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


def run_create(*, run_id: str, conversation_id: int, user, text: str | None, owner: str) -> tuple:
    """Claim the conversation for a new run, owned by ``owner``, and save the
    user's message (None: a retry, from the conversation as it is); returns
    (run, message or None).

    The database's partial unique index makes the claim atomic across
    processes: a conversation whose run goes on (working or waiting, in any
    process) refuses a second one with ``RunBusy``.
    """
    conversation = Conversation.objects.select_related("owner").get(pk=conversation_id, owner=user)
    try:
        with transaction.atomic():
            # The owner as read here, not ``user``: a view's ``request.user``
            # is a lazy object that holds its whole request.
            run = Run.objects.create(
                id=run_id, conversation=conversation, started_by=conversation.owner, owner=owner
            )
            message = None
            if text is not None:
                message = Message.objects.create(
                    conversation=conversation, run=run, role=Message.Role.USER, content=text
                )
            if conversation.title == "New chat" and text:
                conversation.title = _title_from(text)
            conversation.save(update_fields=["title", "updated_at"])
    except IntegrityError:
        raise RunBusy(conversation_id) from None
    return run, message


def conversation_retryable(conversation_id: int) -> bool:
    """Its last word is an error (the model was down, say): a retry may ask again."""
    last = (
        Message.objects.filter(conversation_id=conversation_id)
        .order_by("-created_at", "-id")
        .values_list("role", flat=True)
        .first()
    )
    return last == Message.Role.ERROR


def _title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1] + "…"


@dataclass(frozen=True)
class Claim:
    run: Run
    # Taken over from a process that exited or died (not woken by a decision).
    resumed: bool


def run_claim(*, run_id: str, owner: str) -> Claim | None:
    """Take the run to step it, if it can go on and nobody steps it; first claim wins.

    It can be claimed when it waits and the call it waits on was decided (or
    it was stopped), when an exiting process left it, or when its owner's
    heartbeat is older than STUDIO_RUN_STALE_SECONDS (that process died).
    One conditional update on the row as read decides between claimants.
    """
    try:
        uuid.UUID(str(run_id))
    except ValueError:
        return None  # an approval of no run of ours (written by hand, imported)
    run = (
        Run.objects.running().select_related("conversation", "started_by").filter(pk=run_id).first()
    )
    if run is None:
        return None
    now = timezone.now()
    stale = run.heartbeat_at < now - timedelta(seconds=settings.STUDIO_RUN_STALE_SECONDS)
    if run.owner and not stale:
        return None  # being stepped
    resumed = bool(run.owner) or not run.waiting_on
    claimable = Run.objects.filter(
        pk=run.pk, status=Run.Status.RUNNING, owner=run.owner, heartbeat_at=run.heartbeat_at
    )
    if not run.owner and run.waiting_on and not run.stop_requested:
        # Nothing to do while the call it waits on still waits.
        claimable = claimable.exclude(
            Exists(ToolApproval.objects.pending().filter(approval_id=OuterRef("waiting_on")))
        )
    won = claimable.update(
        owner=owner, waiting_on="", heartbeat_at=now, resumes=F("resumes") + int(resumed)
    )
    if not won:
        return None
    if resumed:
        logger.info("run %s resumed here (it was %s)", run.pk, run.owner or "left by its process")
    run.owner, run.waiting_on, run.heartbeat_at = owner, "", now
    return Claim(run=run, resumed=resumed)


def approval_pending(approval_id: str) -> bool:
    return ToolApproval.objects.pending().filter(approval_id=approval_id).exists()


def run_release(*, run_id: str, owner: str, waiting_on: str) -> bool:
    """The run waits for a decision on ``waiting_on``: it belongs to no process now."""
    return bool(
        Run.objects.running()
        .filter(pk=run_id, owner=owner)
        .update(owner="", waiting_on=waiting_on, heartbeat_at=timezone.now())
    )


def runs_abandon(*, run_ids: list[str], owner: str) -> int:
    """Leave runs this exiting process was stepping for another process to resume at once."""
    return (
        Run.objects.running()
        .filter(pk__in=run_ids, owner=owner)
        .update(owner="", waiting_on="", heartbeat_at=timezone.now())
    )


def run_finish(*, run_id: str, status: str, owner: str | None = None, error: str = "") -> None:
    """Record how the run ended (by its owner, when ``owner`` is given)."""
    runs = Run.objects.filter(pk=run_id, status=Run.Status.RUNNING)
    if owner is not None:
        runs = runs.filter(owner=owner)
    runs.update(
        status=status,
        owner="",
        waiting_on="",
        error=error[:2000],
        finished_at=timezone.now(),
    )


def run_heartbeat(*, owner: str) -> list[str]:
    """Mark the runs ``owner`` steps alive; returns those of them Stop was pressed for."""
    if not owner:
        return []
    runs = Run.objects.running().filter(owner=owner)
    runs.update(heartbeat_at=timezone.now())
    return [str(i) for i in runs.filter(stop_requested=True).values_list("id", flat=True)]


def run_stop_request(*, conversation_id: int, user) -> Run | None:
    """Mark the conversation's run as stopped and end the calls it waits on; returns it.

    A waiting run's next step (the calls ending wakes it) then ends it; a
    working one hears of it through its cancel token (the caller's part).
    """
    run = (
        Run.objects.running()
        .filter(conversation_id=conversation_id, conversation__owner=user)
        .only("id", "owner")
        .first()
    )
    if run is None:
        return None
    Run.objects.filter(pk=run.pk).update(stop_requested=True)
    approval_cancel_run(run_id=str(run.pk))
    return run


# At most this many runs are resumed per sweep (the next sweep takes the rest).
SWEEP_BATCH = 200


def runs_to_resume(*, since: datetime | None = None) -> list[str]:
    """Runs that can go on and that nobody steps: what a sweep resumes.

    First the calls whose time is up end (their runs are woken like any).
    Then: runs an exiting process left, runs whose owner died, and waiting
    runs whose call was decided (``since``: only those decided since then;
    None: every waiting run is looked at).
    """
    approvals_time_out()
    now = timezone.now()
    running = Run.objects.running()
    dead = running.exclude(owner="").filter(
        heartbeat_at__lt=now - timedelta(seconds=settings.STUDIO_RUN_STALE_SECONDS)
    )
    left = running.filter(owner="", waiting_on="")
    waiting = running.filter(owner="").exclude(waiting_on="")
    if since is None:
        pending = ToolApproval.objects.pending().filter(approval_id=OuterRef("waiting_on"))
        decided = waiting.exclude(Exists(pending))
    else:
        recent = ToolApproval.objects.decided().filter(decided_at__gte=since - SWEEP_OVERLAP)
        decided = waiting.filter(waiting_on__in=recent.values("approval_id"))
    ids: list[str] = []
    for runs in (dead, left, decided):
        ids += [str(i) for i in runs.values_list("id", flat=True)[: SWEEP_BATCH - len(ids)]]
    return ids


# The quick sweep reaches this far before the previous one (clock skew
# between processes, commits that took a moment).
SWEEP_OVERLAP = timedelta(seconds=5)

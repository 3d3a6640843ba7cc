"""Approval services: every write to approval rows and every wake-up.

The gate semantics (see DESIGN.md) live here:

* ``approval_request`` creates the pending row *and* registers the waiter,
  so the caller can only announce the call after a decision can be received;
* ``approval_decide`` records the first decision with one conditional update
  and wakes the waiter after commit, in this process or through the channel
  layer in another;
* ``approval_check`` is one look at a waiting call's row for a run that is
  parked (holding no thread); ``approval_wait`` blocks a thread until the end
  for callers that own one;
* ``approvals_end`` is the one way a pending approval ends without a user's
  decision (timeout, cancelled, expired): recorded as ``denied`` with its own
  reason, its card re-rendered in every tab.

There is one gate per process (``runtime().gate``); no service takes it as
an argument, and tests empty it between cases.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.template.loader import render_to_string
from django.utils import timezone

from approvals.gate import Slot
from approvals.models import ToolApproval, ToolGrant, arguments_hash
from studio.cancel import CancelToken
from studio.runtime import runtime
from studio.text import strip_nul

logger = logging.getLogger(__name__)

Status = ToolApproval.Status
Reason = ToolApproval.Reason

# decision value -> (status, reason, creates a grant)
DECISIONS: dict[str, tuple[str, str, bool]] = {
    "allow": (Status.ALLOWED, Reason.USER, False),
    "always": (Status.ALLOWED, Reason.ALWAYS_ALLOW, True),
    "deny": (Status.DENIED, Reason.USER, False),
}

# The poller re-reads every waiting row this often besides its quick look
# at what was decided lately (which a skewed clock could in theory miss).
FULL_POLL_SECONDS = 60.0
# The quick look reaches this far before the previous poll (clock skew
# between processes, commits that took a moment).
POLL_OVERLAP = timedelta(seconds=5)


class ApprovalNotFound(Exception):
    """Unknown id, or an approval this user may not see: both are a 404."""


class InvalidDecision(ValueError):
    """The decision (or its note) is not acceptable; the message says why."""


@dataclass(frozen=True)
class DecideResult:
    resolved: bool
    approval: ToolApproval
    card_html: str


# --- reading ---------------------------------------------------------------


def approval_get_for_user(*, approval_id: str, user) -> ToolApproval:
    if not approval_id or not isinstance(approval_id, str) or len(approval_id) > 64:
        raise ApprovalNotFound(approval_id)
    if user is None or not user.is_authenticated:
        raise ApprovalNotFound(approval_id)
    try:
        return ToolApproval.objects.select_related("conversation").get(
            approval_id=approval_id, conversation__owner=user
        )
    except ToolApproval.DoesNotExist:
        raise ApprovalNotFound(approval_id) from None


def approval_auto_reason(*, conversation, tool_name: str) -> str | None:
    """Why this call may run without a prompt, or None if it must ask."""
    if ToolGrant.objects.active().filter(conversation=conversation, tool_name=tool_name).exists():
        return Reason.ALWAYS_ALLOW
    if tool_name in settings.STUDIO_AUTO_ALLOW_TOOLS:
        return Reason.POLICY
    return None


def card_render(approval: ToolApproval) -> str:
    return render_to_string(
        "approvals/_card.html",
        {"approval": approval, "note_max_length": settings.STUDIO_NOTE_MAX_LENGTH},
    )


# --- requesting --------------------------------------------------------------


def approval_request(
    *,
    conversation,
    tool_name: str,
    arguments: dict,
    run_id: str,
    requested_by=None,
    tool_call_id: str = "",
    hints: list[str] | None = None,
) -> tuple[ToolApproval, Slot]:
    """Create the pending row and register its waiter, in that order.

    Only after this returns may the caller announce the call (``tool_start``):
    the slot already exists, so even an instant decision finds it.
    """
    rt = runtime()
    approval = ToolApproval.objects.create(
        conversation=conversation,
        tool_name=tool_name,
        arguments=arguments,
        arguments_sha256=arguments_hash(arguments),
        requested_by=requested_by,
        run_id=run_id,
        tool_call_id=tool_call_id,
        tool_hints=hints or [],
        waiter_inbox=rt.inbox.name,
    )
    slot = rt.gate.register(approval.approval_id, run_id=run_id)
    return approval, slot


def approval_record_auto(
    *,
    conversation,
    tool_name: str,
    arguments: dict,
    reason: str,
    run_id: str,
    requested_by=None,
    tool_call_id: str = "",
    hints: list[str] | None = None,
) -> ToolApproval:
    """Record a call allowed without a prompt (grant, policy, switch off): still audited."""
    now = timezone.now()
    return ToolApproval.objects.create(
        conversation=conversation,
        tool_name=tool_name,
        arguments=arguments,
        arguments_sha256=arguments_hash(arguments),
        requested_by=requested_by,
        run_id=run_id,
        tool_call_id=tool_call_id,
        tool_hints=hints or [],
        status=Status.ALLOWED,
        reason=reason,
        requested_at=now,
        decided_at=now,
    )


# --- deciding -----------------------------------------------------------------


def approval_decide(*, approval_id: str, user, decision: str, note: str = "") -> DecideResult:
    """Record ``user``'s decision if the row is still pending; first decision wins.

    Raises ``ApprovalNotFound`` for unknown ids and other members' approvals
    (checked before the decision value, so a foreign id reveals nothing) and
    ``InvalidDecision`` for a bad value. A decision on a decided row changes
    nothing and returns ``resolved=False`` with the current row.
    """
    approval = approval_get_for_user(approval_id=approval_id, user=user)
    if decision not in DECISIONS:
        raise InvalidDecision("decision must be one of: allow, always, deny")
    note = strip_nul(note or "").strip()
    if len(note) > settings.STUDIO_NOTE_MAX_LENGTH:
        raise InvalidDecision(f"note must be at most {settings.STUDIO_NOTE_MAX_LENGTH} characters")
    status, reason, grants = DECISIONS[decision]
    now = timezone.now()
    with transaction.atomic():
        updated = ToolApproval.objects.filter(pk=approval.pk, status=Status.PENDING).update(
            status=status, reason=reason, decided_by=user, decided_at=now, note=note
        )
        if updated and grants:
            grant_create(
                conversation=approval.conversation, tool_name=approval.tool_name, user=user
            )
    if not updated:
        approval.refresh_from_db()
        return DecideResult(resolved=False, approval=approval, card_html=card_render(approval))
    approval.status, approval.reason, approval.decided_by = status, reason, user
    approval.decided_at, approval.note = now, note
    # Outside the atomic block the update is committed (inside a caller's
    # transaction, on_commit waits for it). The waiter first: the card can
    # be drawn while the tool already runs.
    transaction.on_commit(lambda: _wake_waiter(approval))
    html = card_render(approval)
    transaction.on_commit(lambda: _card_broadcast(approval, html))
    return DecideResult(resolved=True, approval=approval, card_html=html)


def _wake_waiter(approval: ToolApproval) -> None:
    """Wake the run waiting on ``approval``, here or in its own process."""
    rt = runtime()
    # Here: hand the run the committed row, so it need not read it again.
    if not rt.gate.wake(approval.approval_id, outcome=approval):
        inbox = approval.waiter_inbox
        if inbox and inbox != rt.inbox.name:
            rt.outbox.channel(
                inbox, {"type": "approval.decided", "approval_id": approval.approval_id}
            )


def _card_broadcast(approval: ToolApproval, html: str) -> None:
    runtime().outbox.group(
        approval.conversation.group_name,
        {
            "type": "approval.changed",
            "approval_id": approval.approval_id,
            "status": approval.status,
            "reason": approval.reason,
            "html": html,
        },
    )


def approvals_end(*, pending, reason: str) -> list[ToolApproval]:
    """End pending approvals without a user's decision (timeout, cancelled, expired).

    ``pending``: a queryset of approvals. Each still-pending one is recorded
    as ``denied`` with ``reason`` in one conditional update (a decision that
    won the race keeps its row), its local waiter is woken, and its card is
    re-rendered in every open tab after commit. Returns the rows it ended.
    """
    ids = list(pending.filter(status=Status.PENDING).values_list("pk", flat=True))
    if not ids:
        return []
    now = timezone.now()
    ToolApproval.objects.filter(pk__in=ids, status=Status.PENDING).update(
        status=Status.DENIED, reason=reason, decided_at=now
    )
    # The ones this update ended carry its exact mark.
    ended = list(
        ToolApproval.objects.filter(pk__in=ids, reason=reason, decided_at=now).select_related(
            "conversation"
        )
    )
    cards = [(approval, card_render(approval)) for approval in ended]

    def after_commit() -> None:
        gate = runtime().gate
        for approval, html in cards:
            gate.wake(approval.approval_id, outcome=approval)
            _card_broadcast(approval, html)

    transaction.on_commit(after_commit)
    return ended


def approval_cancel_run(*, run_id: str) -> int:
    """Close a run's gate: drop its slots and cancel its still-pending rows."""
    runtime().gate.close_run(run_id)
    ended = approvals_end(
        pending=ToolApproval.objects.filter(run_id=run_id), reason=Reason.CANCELLED
    )
    return len(ended)


def approvals_expire_stale(*, before: datetime, dry_run: bool = False) -> int:
    """Expire pending rows requested before ``before``: no waiter can still be alive."""
    stale = ToolApproval.objects.stale(before=before)
    if dry_run:
        return stale.count()
    return len(approvals_end(pending=stale, reason=Reason.EXPIRED))


# --- waiting ------------------------------------------------------------------


def approval_check(*, slot: Slot, cancel: CancelToken, deadline: float) -> ToolApproval | None:
    """One look at a waiting call: its decided row, or None while it is pending.

    Ends the wait itself when Stop was pressed (cancelled) or the deadline
    (``time.monotonic()``) passed (timeout). Raises ``ApprovalNotFound`` when
    the row was deleted. The caller parks on ``slot`` between looks and
    discards it at the end.
    """
    outcome = slot.outcome
    # Clear before reading: a wake after this is for a change not read yet.
    slot.clear()
    if outcome is not None:
        return outcome  # the committed row, from a decision in this process
    approval = ToolApproval.objects.filter(approval_id=slot.approval_id).first()
    if approval is None:
        raise ApprovalNotFound(slot.approval_id)
    if not approval.is_pending:
        return approval
    if cancel.is_set():
        reason = Reason.CANCELLED
    elif time.monotonic() >= deadline:
        reason = Reason.TIMEOUT
    else:
        return None
    approvals_end(pending=ToolApproval.objects.filter(pk=approval.pk), reason=reason)
    # Ours, or the decision that won the race against it.
    return ToolApproval.objects.get(pk=approval.pk)


def approval_wait(
    *,
    slot: Slot,
    cancel: CancelToken | None = None,
    timeout: float | None = None,
    poll: float | None = None,
) -> ToolApproval | None:
    """Block this thread until the row is decided, the wait times out or ``cancel`` fires.

    For callers that own a thread (runs park instead). Never call inside
    ``transaction.atomic()``. Always removes the slot. Returns the decided
    row, or None if it was deleted meanwhile.
    """
    from studio.runtime import release_connection

    timeout = settings.STUDIO_APPROVAL_TIMEOUT if timeout is None else timeout
    poll = settings.STUDIO_APPROVAL_POLL_SECONDS if poll is None else poll
    cancel = cancel or CancelToken()
    deadline = time.monotonic() + timeout
    unsubscribe = cancel.subscribe(slot.wake)
    slot.waiting = True
    try:
        while True:
            try:
                outcome = approval_check(slot=slot, cancel=cancel, deadline=deadline)
            except ApprovalNotFound:
                return None
            if outcome is not None:
                return outcome
            release_connection()
            slot.wait(min(max(0.0, deadline - time.monotonic()), poll_wait(poll)))
    finally:
        unsubscribe()
        runtime().gate.discard(slot)


def poll_wait(poll: float) -> float:
    """How long a waiter may sleep before it looks at its row itself.

    While the process poller runs, it wakes whoever was decided (it re-reads
    every waiting row at least every FULL_POLL_SECONDS), so a waiter sleeps
    until its deadline: ten thousand parked runs cost no wake-ups. Without
    the poller (the database was down), each waiter polls itself.
    """
    if runtime().gate.poller_alive(poll):
        return float("inf")
    return poll


def approval_poll_waiters() -> int:
    """Wake this process's waiters whose rows were decided behind their back.

    Covers a lost wake message. Each interval it asks only for what was
    decided lately (one small query, whatever the number of waiters); every
    ``FULL_POLL_SECONDS`` it re-reads all waiting rows, 500 per query.
    """
    gate = runtime().gate
    started, now = time.monotonic(), timezone.now()
    waiting = gate.waiting_ids()
    woken = 0
    if waiting:
        if started - gate.full_poll_at >= FULL_POLL_SECONDS or gate.poll_mark is None:
            decided = set()
            for start in range(0, len(waiting), 500):
                chunk = waiting[start : start + 500]
                still = set(
                    ToolApproval.objects.pending()
                    .filter(approval_id__in=chunk)
                    .values_list("approval_id", flat=True)
                )
                decided.update(a for a in chunk if a not in still)
            gate.full_poll_at = started
        else:
            decided = set(
                ToolApproval.objects.decided()
                .filter(decided_at__gte=gate.poll_mark - POLL_OVERLAP)
                .values_list("approval_id", flat=True)
            )
        for approval_id in waiting:
            if approval_id in decided and gate.wake(approval_id):
                woken += 1
    gate.poll_mark = now
    gate.polled_at = started
    return woken


def wake_from_message(message: dict) -> None:
    """Inbox handler for ``approval.decided`` sent by another process."""
    runtime().gate.wake(str(message.get("approval_id", "")))


# --- grants ---------------------------------------------------------------------


def grant_create(*, conversation, tool_name: str, user) -> ToolGrant:
    """Always allow ``tool_name`` in ``conversation`` (idempotent)."""
    existing = (
        ToolGrant.objects.active().filter(conversation=conversation, tool_name=tool_name).first()
    )
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            return ToolGrant.objects.create(
                conversation=conversation, tool_name=tool_name, granted_by=user
            )
    except IntegrityError:
        # Someone granted it a moment ago; theirs stands.
        return ToolGrant.objects.active().get(conversation=conversation, tool_name=tool_name)


def grant_revoke(*, grant: ToolGrant, user) -> bool:
    updated = ToolGrant.objects.filter(pk=grant.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now(), revoked_by=user
    )
    return bool(updated)

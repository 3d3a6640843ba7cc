"""Approval services: every write to approval rows and every wake-up.

The gate semantics (see DESIGN.md) live here:

* ``approval_request`` creates the pending row *and* registers the waiter,
  so the caller can only announce the call after a decision can be received;
* ``approval_decide`` records the first decision with one conditional update
  and wakes the waiter after commit, in this process or through the channel
  layer in another;
* ``approval_wait`` blocks a run's worker thread until a decision, a timeout
  or a cancel, re-reading the row on every wake and every poll interval;
* timeout, cancel and expiry are recorded as ``denied`` with their own reason.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.template.loader import render_to_string
from django.utils import timezone

from approvals.gate import GATE, Gate, Slot
from approvals.inbox import current_inbox
from approvals.models import ToolApproval, ToolGrant, arguments_hash
from approvals.notify import group_send, layer_send
from studio.cancel import CancelToken
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

REJECTION_TEXT = "The user declined to run this tool call."
# With a process poller running, a waiter still re-checks on its own this often.
SELF_CHECK_SECONDS = 300.0


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
        return ToolApproval.objects.select_related("conversation", "decided_by").get(
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
    return render_to_string("approvals/_card.html", {"approval": approval})


# --- requesting --------------------------------------------------------------


def approval_request(
    *,
    conversation,
    tool_name: str,
    arguments: dict,
    requested_by=None,
    run_id: str = "",
    tool_call_id: str = "",
    gate: Gate = GATE,
) -> tuple[ToolApproval, Slot]:
    """Create the pending row and register its waiter, in that order.

    Only after this returns may the caller announce the call (``tool_start``):
    the slot already exists, so even an instant decision finds it.
    """
    approval = ToolApproval.objects.create(
        conversation=conversation,
        tool_name=tool_name,
        arguments=arguments,
        arguments_sha256=arguments_hash(arguments),
        requested_by=requested_by,
        run_id=run_id,
        tool_call_id=tool_call_id,
        waiter_inbox=current_inbox(),
    )
    slot = gate.register(approval.approval_id, run_id=run_id)
    return approval, slot


def approval_record_auto(
    *,
    conversation,
    tool_name: str,
    arguments: dict,
    reason: str,
    requested_by=None,
    decided_by=None,
    run_id: str = "",
    tool_call_id: str = "",
) -> ToolApproval:
    """Record a call allowed without a prompt (grant or policy): still audited."""
    now = timezone.now()
    return ToolApproval.objects.create(
        conversation=conversation,
        tool_name=tool_name,
        arguments=arguments,
        arguments_sha256=arguments_hash(arguments),
        requested_by=requested_by,
        run_id=run_id,
        tool_call_id=tool_call_id,
        status=Status.ALLOWED,
        reason=reason,
        decided_by=decided_by,
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
    html = card_render(approval)
    # We are outside the atomic block, so the update is committed (or we are
    # inside a caller's transaction and on_commit defers until it commits).
    transaction.on_commit(lambda: _after_decision(approval, html))
    return DecideResult(resolved=True, approval=approval, card_html=html)


def _after_decision(approval: ToolApproval, html: str) -> None:
    """Wake the waiter (here or in its own process), then re-render every tab."""
    if not GATE.wake(approval.approval_id):
        inbox = approval.waiter_inbox
        if inbox and inbox != current_inbox():
            layer_send(inbox, {"type": "approval.decided", "approval_id": approval.approval_id})
    _card_broadcast(approval, html)


def _card_broadcast(approval: ToolApproval, html: str) -> None:
    group_send(
        f"conversation.{approval.conversation_id}",
        {
            "type": "approval.changed",
            "approval_id": approval.approval_id,
            "status": approval.status,
            "reason": approval.reason,
            "html": html,
        },
    )


def approval_finish(*, approval_id: str, reason: str) -> ToolApproval | None:
    """End a pending wait without a user's decision (timeout, cancelled, expired).

    Recorded as ``denied`` with its own reason. If a decision won the race the
    row keeps it. Returns the current row, or None if it no longer exists.
    """
    now = timezone.now()
    updated = ToolApproval.objects.filter(approval_id=approval_id, status=Status.PENDING).update(
        status=Status.DENIED, reason=reason, decided_at=now
    )
    approval = ToolApproval.objects.filter(approval_id=approval_id).first()
    if updated and approval is not None:
        html = card_render(approval)
        transaction.on_commit(lambda: _card_broadcast(approval, html))
    return approval


def approval_cancel_run(*, run_id: str, gate: Gate = GATE) -> int:
    """Close a run's gate: drop its slots and cancel its still-pending rows."""
    gate.close_run(run_id)
    if not run_id:
        return 0
    cancelled = 0
    for approval_id in (
        ToolApproval.objects.pending().filter(run_id=run_id).values_list("approval_id", flat=True)
    ):
        approval = approval_finish(approval_id=approval_id, reason=Reason.CANCELLED)
        if approval is not None and approval.reason == Reason.CANCELLED:
            cancelled += 1
    return cancelled


# --- waiting ------------------------------------------------------------------


def approval_wait(
    *,
    slot: Slot,
    cancel: CancelToken | None = None,
    timeout: float | None = None,
    poll: float | None = None,
    gate: Gate = GATE,
) -> ToolApproval | None:
    """Block until the row is decided, the wait times out or ``cancel`` fires.

    Never call inside ``transaction.atomic()``: the decision must be able to
    commit while we wait. Always removes the slot, whatever happens.
    Returns the decided row (None if the row was deleted meanwhile).
    """
    timeout = settings.STUDIO_APPROVAL_TIMEOUT if timeout is None else timeout
    poll = settings.STUDIO_APPROVAL_POLL_SECONDS if poll is None else poll
    deadline = time.monotonic() + timeout
    unsubscribe = cancel.subscribe(slot.wake) if cancel is not None else (lambda: None)
    slot.waiting = True
    try:
        while True:
            # Clear before reading: a wake that happens after the clear is
            # seen by wait(); one before it was for a commit we now read.
            slot.event.clear()
            approval = ToolApproval.objects.filter(approval_id=slot.approval_id).first()
            if approval is None:
                return None
            if not approval.is_pending:
                return approval
            if cancel is not None and cancel.is_set():
                return approval_finish(approval_id=slot.approval_id, reason=Reason.CANCELLED)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return approval_finish(approval_id=slot.approval_id, reason=Reason.TIMEOUT)
            if gate.poller_alive(poll):
                # The process's poller re-reads every waiting row in one query
                # per interval and wakes us; we only check that it still runs.
                wait_for = min(remaining, max(poll, SELF_CHECK_SECONDS))
            else:
                wait_for = min(remaining, poll)
            # A parked run must not hold a database connection for an hour
            # (a thousand of them would exhaust PostgreSQL's max_connections).
            if not connection.in_atomic_block:
                connection.close()
            slot.event.wait(wait_for)
    finally:
        unsubscribe()
        gate.discard(slot)


def approval_poll_waiters(*, gate: Gate = GATE) -> int:
    """Re-read every waiting row of this process at once; wake the decided ones.

    One query per 500 waiters per poll interval, instead of one per waiter:
    this is what covers a lost channel message for a thousand parked runs.
    """
    ids = gate.waiting_ids()
    woken = 0
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        pending = set(
            ToolApproval.objects.pending()
            .filter(approval_id__in=chunk)
            .values_list("approval_id", flat=True)
        )
        for approval_id in chunk:
            if approval_id not in pending and gate.wake(approval_id):
                woken += 1
    gate.polled_at = time.monotonic()
    return woken


def wake_from_message(message: dict) -> None:
    """Inbox handler for ``approval.decided`` sent by another process."""
    GATE.wake(str(message.get("approval_id", "")))


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

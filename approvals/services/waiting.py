"""A tool call's life around its decision: asked, waited on, ended, its output kept.

* ``approval_request`` creates the pending row *and* registers the waiter,
  so the caller can only announce the call after a decision can be received;
* ``approval_check`` is one look at a waiting call's row for a run that is
  parked (holding no thread); ``approval_wait`` blocks a thread until the end
  for callers that own one;
* ``approvals_end`` is the one way a pending approval ends without a user's
  decision (timeout, cancelled, expired): recorded as ``denied`` with its own
  reason, its card re-rendered in every tab;
* ``approval_poll_waiters`` covers a lost wake message: the row is the truth.

There is one gate per process (``runtime().gate``); no service takes it as
an argument, and tests empty it between cases.
"""

from __future__ import annotations

import hashlib
import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals.gate import Slot
from approvals.models import OUTPUT_SUMMARY_BYTES, ToolApproval, arguments_hash
from approvals.services.decisions import (
    ApprovalNotFound,
    card_broadcast,
    card_render,
    inbox_broadcast,
)
from approvals.services.rules import Action, Verdict
from studio.cancel import CancelToken
from studio.runtime import release_connection, runtime
from studio.text import strip_nul

logger = logging.getLogger(__name__)

Status = ToolApproval.Status
Reason = ToolApproval.Reason

# The poller re-reads every waiting row this often besides its quick look
# at what was decided lately (which a skewed clock could in theory miss).
FULL_POLL_SECONDS = 60.0
# The quick look reaches this far before the previous poll (clock skew
# between processes, commits that took a moment).
POLL_OVERLAP = timedelta(seconds=5)


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
    schema: dict | None = None,
    subject: str = "",
    verdict: Verdict | None = None,
) -> tuple[ToolApproval, Slot]:
    """Create the pending row and register its waiter, in that order.

    Only after this returns may the caller announce the call (``tool_start``):
    the slot already exists, so even an instant decision finds it.
    """
    rt = runtime()
    approval = ToolApproval.objects.create(
        **_call_fields(
            conversation, tool_name, arguments, run_id, requested_by, tool_call_id, hints, schema
        ),
        subject=subject,
        waiter_inbox=rt.inbox.name,
        needs_review=verdict is not None and verdict.action == Action.REVIEW,
        **_rule_fields(verdict),
    )
    slot = rt.gate.register(approval.approval_id, run_id=run_id)
    inbox_broadcast(approval)
    return approval, slot


def approval_record_auto(
    *,
    conversation,
    tool_name: str,
    arguments: dict,
    verdict: Verdict,
    run_id: str,
    requested_by=None,
    tool_call_id: str = "",
    hints: list[str] | None = None,
    schema: dict | None = None,
    subject: str = "",
) -> ToolApproval:
    """Record a call the rules let run, or blocked, without asking: still audited."""
    now = timezone.now()
    return ToolApproval.objects.create(
        **_call_fields(
            conversation, tool_name, arguments, run_id, requested_by, tool_call_id, hints, schema
        ),
        subject=subject,
        status=Status.DENIED if verdict.action == Action.DENY else Status.ALLOWED,
        reason=verdict.reason,
        requested_at=now,
        decided_at=now,
        decision_seconds=0.0,
        **_rule_fields(verdict),
    )


def _call_fields(
    conversation, tool_name, arguments, run_id, requested_by, tool_call_id, hints, schema
) -> dict:
    """What every row of a call keeps of it, asked or not."""
    return {
        "conversation": conversation,
        "tool_name": tool_name,
        "arguments": arguments,
        "arguments_sha256": arguments_hash(arguments),
        "requested_by": requested_by,
        "run_id": run_id,
        "tool_call_id": tool_call_id,
        "tool_hints": hints or [],
        "tool_schema": schema or {},
    }


def _rule_fields(verdict: Verdict | None) -> dict:
    rule = verdict.rule if verdict is not None else None
    if rule is None:
        return {}
    return {"rule": rule if rule.pk else None, "rule_snapshot": rule.snapshot()}


def approval_record_output(*, approval: ToolApproval, text: str, seconds: float) -> None:
    """Keep what the tool gave back: its first OUTPUT_SUMMARY_BYTES, size and SHA-256."""
    data = text.encode("utf-8", "replace")
    summary = data[:OUTPUT_SUMMARY_BYTES].decode("utf-8", "ignore")
    ToolApproval.objects.filter(pk=approval.pk).update(
        run_seconds=seconds,
        output_summary=strip_nul(summary),
        output_size=len(data),
        output_sha256=hashlib.sha256(data).hexdigest(),
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
            card_broadcast(approval, html)

    transaction.on_commit(after_commit)
    return ended


def approval_cancel_run(*, run_id: str) -> int:
    """Close a run's gate: drop its slots and cancel its still-pending rows."""
    runtime().gate.close_run(run_id)
    ended = approvals_end(
        pending=ToolApproval.objects.filter(run_id=run_id), reason=Reason.CANCELLED
    )
    return len(ended)


def approval_withdraw(*, approval: ToolApproval, slot: Slot) -> None:
    """The run no longer needs this call (an identical one ran meanwhile): end it as
    cancelled, for every tab, and forget its slot."""
    approvals_end(pending=ToolApproval.objects.filter(pk=approval.pk), reason=Reason.CANCELLED)
    approval_release(slot=slot)


def approval_release(*, slot: Slot) -> None:
    """The run stopped waiting on ``slot`` (decided, withdrawn or ended): drop it."""
    runtime().gate.discard(slot)


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
    # The first look of a call nothing has woken yet reads nothing: its
    # row is pending, as the run wrote it (see ``Slot.fresh_look``). One read
    # fewer for every call that waits: the round trip 0.97x (bench/RESULTS.md,
    # change 30).
    if not slot.fresh_look():
        outcome = slot.outcome
        # Clear before reading: a wake after this is for a change not read yet.
        slot.clear()
        if outcome is not None:
            return outcome  # the committed row, from a decision in this process
        approval = _row(slot.approval_id)
        if not approval.is_pending:
            return approval
    if cancel.is_set():
        reason = Reason.CANCELLED
    elif time.monotonic() >= deadline:
        reason = Reason.TIMEOUT
    else:
        return None
    approvals_end(pending=ToolApproval.objects.filter(approval_id=slot.approval_id), reason=reason)
    # Ours, or the decision that won the race against it.
    return _row(slot.approval_id)


def _row(approval_id: str) -> ToolApproval:
    """The row as it is now, with its conversation; ``ApprovalNotFound`` once deleted."""
    approval = ToolApproval.objects.by_approval_id(approval_id)
    if approval is None:
        raise ApprovalNotFound(approval_id)
    return approval


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

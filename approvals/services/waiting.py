"""A tool call's life around its decision: asked, ended, started, its output kept.

* ``approval_request`` creates the pending row, with the time it expires;
  the caller announces the call (``tool_start``) after, and the run then
  waits holding nothing: the row is what it waits on;
* ``approvals_end`` is the one way a pending approval ends without a user's
  decision (timeout, cancelled, expired): recorded as ``denied`` with its own
  reason, its card re-rendered in every tab;
* ``approval_start`` marks an allowed call as begun, once, before it runs;
* ``approvals_time_out`` ends the calls whose time is up (any process may).

Whenever calls leave "pending", ``calls_settled`` tells whoever resumes
runs (chat) which runs may go on, after commit.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals.models import OUTPUT_SUMMARY_BYTES, ToolApproval, arguments_hash
from approvals.notify import CallAsked, tell
from approvals.services.decisions import card_changed
from approvals.services.rules import Action, Verdict
from approvals.signals import calls_settled
from studio.text import strip_nul

logger = logging.getLogger(__name__)

Status = ToolApproval.Status
Reason = ToolApproval.Reason

# Timeouts found in one sweep, at most (the next sweep takes the rest).
TIMEOUT_BATCH = 500


# --- requesting --------------------------------------------------------------


def approval_request(
    *,
    conversation,
    tool_name: str,
    arguments: dict,
    run_id: str,
    timeout: float | None = None,
    requested_by=None,
    tool_call_id: str = "",
    hints: list[str] | None = None,
    schema: dict | None = None,
    subject: str = "",
    verdict: Verdict | None = None,
    extra: dict | None = None,
) -> ToolApproval:
    """Create the pending row; undecided after ``timeout`` seconds (default
    STUDIO_APPROVAL_TIMEOUT) it ends as a timeout. ``extra``: an API call's
    own fields (``approvals.services.api``).

    Only after this returns may the caller announce the call (``tool_start``).
    """
    now = timezone.now()
    if timeout is None:
        timeout = settings.STUDIO_APPROVAL_TIMEOUT
    approval = ToolApproval.objects.create(
        **_call_fields(
            conversation, tool_name, arguments, run_id, requested_by, tool_call_id, hints, schema
        ),
        subject=subject,
        requested_at=now,
        expires_at=now + timedelta(seconds=timeout),
        needs_review=verdict is not None and verdict.action == Action.REVIEW,
        **_rule_fields(verdict),
        **(extra or {}),
    )
    # Once committed: an inbox that hears of it must find the row.
    tell(CallAsked(approval))
    return approval


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
    extra: dict | None = None,
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
        **(extra or {}),
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


def approval_record_output(
    *,
    approval: ToolApproval,
    text: str,
    seconds: float,
    outcome: str,
    session: str = "",
    only_if=None,
) -> bool:
    """Keep what the tool gave back: its first OUTPUT_SUMMARY_BYTES, size and SHA-256,
    how its run ended (``outcome``) and the kept interpreter it ran in
    (``session``; blank: one of its own).

    Once per call: False when its outcome was recorded already (a takeover
    found it interrupted), or when ``only_if`` (a condition of the caller's,
    checked in the same statement) fails. The row's lock orders this write
    and ``approval_record_interrupted``: the second finds the first's outcome.
    """
    data = text.encode("utf-8", "replace")
    summary = data[:OUTPUT_SUMMARY_BYTES].decode("utf-8", "ignore")
    recording = ToolApproval.objects.filter(pk=approval.pk, run_outcome="")
    if only_if is not None:
        recording = recording.filter(only_if)
    return bool(
        recording.update(
            run_outcome=outcome,
            interpreter_session=session,
            run_seconds=seconds,
            output_summary=strip_nul(summary),
            output_size=len(data),
            output_sha256=hashlib.sha256(data).hexdigest(),
        )
    )


def approvals_end(*, pending, reason: str) -> list[ToolApproval]:
    """End pending approvals without a user's decision (timeout, cancelled, expired).

    ``pending``: a queryset of approvals. Each still-pending one is recorded
    as ``denied`` with ``reason`` in one conditional update (a decision that
    won the race keeps its row); after commit its card is re-rendered in
    every open tab and its run may go on. Returns the rows it ended.
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
    for approval in ended:
        card_changed(approval)

    def after_commit() -> None:
        run_ids = {approval.run_id for approval in ended if approval.run_id}
        if run_ids:
            calls_settled.send(sender=ToolApproval, run_ids=run_ids)

    transaction.on_commit(after_commit)
    return ended


def approval_cancel_run(*, run_id: str) -> int:
    """End a run's still-pending calls as cancelled (Stop, or the run ended)."""
    ended = approvals_end(
        pending=ToolApproval.objects.filter(run_id=run_id), reason=Reason.CANCELLED
    )
    return len(ended)


def approval_record_interrupted(*, approval: ToolApproval) -> bool:
    """A call begun before by a process that stopped before saving its result;
    False when its result was recorded after all (its step's last write was
    still committing as the run was taken over)."""
    return bool(
        ToolApproval.objects.filter(pk=approval.pk, run_outcome="").update(
            run_outcome=ToolApproval.RunOutcome.INTERRUPTED
        )
    )


def approval_start(*, approval: ToolApproval, only_if=None) -> bool:
    """Mark an allowed call as begun; False if it was begun before (never run it again),
    or if ``only_if`` (a condition of the caller's, checked in the same statement) fails."""
    now = timezone.now()
    starting = ToolApproval.objects.filter(
        pk=approval.pk, status=Status.ALLOWED, started_at__isnull=True
    )
    if only_if is not None:
        starting = starting.filter(only_if)
    started = starting.update(started_at=now)
    if started:
        approval.started_at = now
    return bool(started)


def approvals_time_out(*, now: datetime | None = None) -> int:
    """End the pending calls whose time is up (one batch); any process may, first wins."""
    due = ToolApproval.objects.pending().filter(expires_at__lte=now or timezone.now())
    ids = list(due.order_by("expires_at").values_list("pk", flat=True)[:TIMEOUT_BATCH])
    if not ids:
        return 0
    return len(
        approvals_end(pending=ToolApproval.objects.filter(pk__in=ids), reason=Reason.TIMEOUT)
    )


def approvals_expire_stale(*, before: datetime, dry_run: bool = False) -> int:
    """Expire pending rows requested before ``before`` (purge_approvals)."""
    stale = ToolApproval.objects.stale(before=before)
    if dry_run:
        return stale.count()
    return len(approvals_end(pending=stale, reason=Reason.EXPIRED))

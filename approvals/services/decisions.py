"""Decisions on tool calls: who may decide what, the first decision wins, cards.

* ``approval_decide`` records the first decision with one conditional update
  and, after commit, lets its run go on (``calls_settled``); whatever lets
  a call run reads the rules again first (``approvals.services.rules``), on
  the arguments that would run;
* ``approvals_decide`` is one decision for several calls, first wins per row;
* ``card_changed`` tells every tab of a card that changed
  (``approvals.notify``, which draws it).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from jsonschema import Draft202012Validator

from approvals.callbacks import callbacks_nudge
from approvals.models import ToolApproval, ToolRule, arguments_hash, can_review
from approvals.notify import CardChanged, card, tell
from approvals.services.rules import (
    Verdict,
    approval_verdict,
    call_read,
    rule_create,
    rule_hit,
    speaks_for,
)
from approvals.signals import calls_settled
from studio.logs import log_context
from studio.metrics import DECISION_SECONDS
from studio.shell import Reading
from studio.text import strip_nul, strip_nul_json

logger = logging.getLogger(__name__)

Status = ToolApproval.Status
Reason = ToolApproval.Reason

Action = ToolRule.Action
Scope = ToolRule.Scope

# decision value -> (status, reason)
DECISIONS: dict[str, tuple[str, str]] = {
    "allow": (Status.ALLOWED, Reason.USER),
    "edit": (Status.ALLOWED, Reason.EDITED),
    "always": (Status.ALLOWED, Reason.ALWAYS_ALLOW),
    "deny": (Status.DENIED, Reason.USER),
}
MAX_BATCH = 100
# Tools whose calls share state kept between them (the chat's python session):
# a decision may run one in a fresh interpreter instead.
FRESH_TOOLS = frozenset(("python",))


class ApprovalNotFound(Exception):
    """Unknown id, or an approval this user may not see: both are a 404."""


class InvalidDecision(ValueError):
    """The decision (or its note) is not acceptable; the message says why."""


class DecisionForbidden(Exception):
    """The member may see the approval but not make this decision (a 403; says why)."""


@dataclass(frozen=True)
class ClientInfo:
    """Where a decision came from (the audit keeps it): address, user agent, request id."""

    ip: str = ""
    user_agent: str = ""
    request_id: str = ""


class DecideResult:
    """A decision's outcome; the card is drawn the first time someone asks for it."""

    def __init__(
        self,
        *,
        resolved: bool,
        approval: ToolApproval,
        card_html: str | None = None,
        review: bool = False,
    ):
        self.resolved = resolved
        self.approval = approval
        # Not decided: the call went to a reviewer, as a Review rule wants.
        self.review = review
        self._card_html = card_html

    @property
    def card_html(self) -> str:
        if self._card_html is None:
            self._card_html = card(self.approval)
        return self._card_html


# --- reading ---------------------------------------------------------------


def approval_now(approval_id: str) -> ToolApproval | None:
    """The row as it is now, with its conversation (None once deleted)."""
    return ToolApproval.objects.by_approval_id(approval_id)


def _check_asker(approval_id: str, user) -> None:
    if not approval_id or not isinstance(approval_id, str) or len(approval_id) > 64:
        raise ApprovalNotFound(approval_id)
    if user is None or not user.is_authenticated:
        raise ApprovalNotFound(approval_id)


def _visible(approval: ToolApproval | None, approval_id: str, user) -> ToolApproval:
    if approval is None:
        raise ApprovalNotFound(approval_id)
    # The owner first: only a call that waits for a reviewer asks for the
    # permission (two queries the member's own decisions need not make).
    if approval.conversation.owner_id == user.pk:
        return approval
    if approval.needs_review and can_review(user):
        return approval
    raise ApprovalNotFound(approval_id)


def _to_decide(approval_id: str, user) -> ToolApproval:
    """The row a decision checks before its conditional update, if ``user`` may see it."""
    _check_asker(approval_id, user)
    return _visible(ToolApproval.objects.by_approval_id(approval_id), approval_id, user)


# --- deciding -----------------------------------------------------------------


def approval_decide(
    *,
    approval_id: str,
    user,
    decision: str,
    note: str = "",
    arguments: object = None,
    pattern: str = "",
    scope: str = "",
    fresh: bool = False,
    client: ClientInfo | None = None,
) -> DecideResult:
    """Record ``user``'s decision if the row is still pending; first decision wins.

    ``allow``, ``deny`` (+ ``note``), ``edit`` (+ ``arguments``: run exactly
    those instead, checked against the tool's schema) or ``always`` (+
    optional ``pattern`` and ``scope``: also make an Allow rule). ``fresh``
    with ``allow`` or ``edit``: a python call runs in a fresh interpreter,
    not in the chat's python session.

    Whatever lets a call run goes through the rules again, on the arguments
    that would run: a Deny refuses the decision (``DecisionForbidden``) and
    the call keeps waiting; a Review the decider may not satisfy turns the
    call into a request for a reviewer (``review=True``), edits included.

    Raises ``ApprovalNotFound`` for unknown ids and other members' approvals
    (checked before anything else, so a foreign id reveals nothing) and
    ``InvalidDecision`` for a bad value. A decision on a decided row changes
    nothing and returns ``resolved=False`` with the current row.
    """
    approval = _to_decide(approval_id, user)
    if decision not in DECISIONS:
        raise InvalidDecision("decision must be one of: allow, always, deny, edit")
    _check_rights(approval, user, decision)
    note = strip_nul(note or "").strip()
    if len(note) > settings.STUDIO_NOTE_MAX_LENGTH:
        raise InvalidDecision(f"note must be at most {settings.STUDIO_NOTE_MAX_LENGTH} characters")
    status, reason = DECISIONS[decision]
    changes: dict = {}
    if fresh:
        if decision not in ("allow", "edit"):
            raise InvalidDecision("fresh goes with decision=allow or decision=edit")
        if approval.tool_name not in FRESH_TOOLS:
            raise InvalidDecision(f"fresh is for {', '.join(sorted(FRESH_TOOLS))} calls only")
        changes["fresh_interpreter"] = True
    if decision == "edit":
        edited = _edited(approval, arguments)
        if not edited:
            reason = Reason.USER  # edited back to what the model asked: a plain Allow
        changes.update(edited)
    pattern = strip_nul(pattern or "").strip()
    if decision == "always":
        scope = scope or Scope.CONVERSATION
    if status == Status.ALLOWED and approval.is_pending:
        to_run = changes.get("approved_arguments", approval.arguments_to_run)
        subject, reading = call_read(
            tool_name=approval.tool_name, arguments=to_run, schema=approval.tool_schema
        )
        if decision == "always":
            _check_always(approval, pattern, scope, subject, reading)
        verdict = approval_verdict(
            conversation=approval.conversation,
            tool_name=approval.tool_name,
            subject=subject,
            reading=reading,
            count=False,
        )
        if verdict.action == Action.DENY:
            rule_hit(verdict.rule)
            raise DecisionForbidden(_blocked_text(verdict.rule))
        if verdict.action == Action.REVIEW and not _is_reviewer_of(approval, user):
            return _to_review(approval, verdict, changes)
    now = timezone.now()
    changes.update(_audit_fields(approval, now, client))
    # One conditional UPDATE is atomic by itself: only an Always allow, whose
    # rule must commit with the decision, needs a transaction around it.
    with transaction.atomic() if decision == "always" else contextlib.nullcontext():
        updated = _still_as_read(approval).update(
            status=status, reason=reason, decided_by=user, decided_at=now, note=note, **changes
        )
        if updated and decision == "always":
            rule = rule_create(
                conversation=approval.conversation,
                user=user,
                tool=approval.tool_name,
                pattern=pattern,
                scope=scope,
            )
            changes = {"rule": rule, "rule_snapshot": rule.snapshot()}
            ToolApproval.objects.filter(pk=approval.pk).update(**changes)
    if not updated:
        result = _unchanged(approval)
        if _is_repeat(result.approval, user, status, client):
            return _repeated(result.approval)
        return result
    approval.status, approval.reason, approval.decided_by = status, reason, user
    approval.decided_at, approval.note = now, note
    for name, value in changes.items():
        setattr(approval, name, value)
    # Outside the atomic block the update is committed (inside a caller's
    # transaction, on_commit waits for it).
    result = DecideResult(resolved=True, approval=approval)
    transaction.on_commit(lambda: _decided(result))
    return result


def _still_as_read(approval: ToolApproval):
    """The row, while still pending and as this decision read it: what the
    decision checked (who decides it, what would run) holds when it lands."""
    return ToolApproval.objects.filter(
        pk=approval.pk,
        status=Status.PENDING,
        needs_review=approval.needs_review,
        approved_sha256=approval.approved_sha256,
    )


def _unchanged(approval: ToolApproval) -> DecideResult:
    """The row as it is now, for a decision that found it decided (or changed) first."""
    try:
        approval.refresh_from_db()
    except ToolApproval.DoesNotExist:
        raise ApprovalNotFound(approval.approval_id) from None  # deleted meanwhile
    return DecideResult(resolved=False, approval=approval)


def _is_repeat(approval: ToolApproval, user, status: str, client: ClientInfo | None) -> bool:
    """Whether the request that decided the row is this very one, repeated by
    the proxy because the process that recorded it stopped before it answered."""
    return (
        client is not None
        and bool(client.request_id)
        and approval.decided_request_id == client.request_id
        and approval.decided_by_id == user.pk
        and approval.status == status
    )


def _repeated(approval: ToolApproval) -> DecideResult:
    """A repeated request answers as its first copy would have; nothing is recorded twice."""
    # Its first copy's process may have stopped before it let the run go on.
    _let_its_run_go_on(approval)
    return DecideResult(resolved=True, approval=approval)


def _is_reviewer_of(approval: ToolApproval, user) -> bool:
    """A reviewer other than the call's requester: the second pair of eyes a Review wants."""
    requester = approval.requested_by_id or approval.conversation.owner_id
    return user.pk != requester and can_review(user)


def _blocked_text(rule) -> str:
    what = str(rule) if rule is not None else "a Deny rule"
    note = f": {rule.note}" if rule is not None and rule.note else ""
    return f"Blocked by the rule {what}{note}. Nothing ran; the call still waits for a decision."


def _to_review(approval: ToolApproval, verdict: Verdict, changes: dict) -> DecideResult:
    """The call (as edited, if it was) now waits for a reviewer, as a Review rule wants.

    Its arguments as the decider left them are kept as the ones to run, so a
    reviewer decides exactly what would run. Nothing runs meanwhile.
    """
    rule = verdict.rule
    values = {"needs_review": True, **changes}
    if rule is not None:
        values.update(rule=rule if rule.pk else None, rule_snapshot=rule.snapshot())
    updated = _still_as_read(approval).update(**values)
    if not updated:
        return _unchanged(approval)
    rule_hit(rule)
    for name, value in values.items():
        setattr(approval, name, value)
    result = DecideResult(resolved=False, approval=approval, review=True)
    card_changed(approval)
    return result


def _audit_fields(approval: ToolApproval, now: datetime, client: ClientInfo | None) -> dict:
    fields: dict = {"decision_seconds": max(0.0, (now - approval.requested_at).total_seconds())}
    if client is not None:
        fields["decided_ip"] = client.ip or None
        fields["decided_user_agent"] = strip_nul(client.user_agent)[:300]
        fields["decided_request_id"] = client.request_id
    return fields


def _check_rights(approval: ToolApproval, user, decision: str) -> None:
    rights = approval.rights(user)
    if decision == "deny" and not rights.deny:
        raise DecisionForbidden("Only the conversation's member or a reviewer can deny this call.")
    if decision in ("allow", "edit") and not rights.allow:
        raise DecisionForbidden(rights.refusal)
    if decision == "always" and not rights.always:
        raise DecisionForbidden(
            rights.refusal if approval.needs_review and not rights.allow
            else "A reviewer decides this call only; rules are the member's or an admin's."
        )  # fmt: skip


def _edited(approval: ToolApproval, arguments: object) -> dict:
    """The row's fields for an edit (empty when nothing changed); raises InvalidDecision."""
    if not isinstance(arguments, dict):
        raise InvalidDecision("arguments must be a JSON object")
    arguments = strip_nul_json(arguments)
    if approval.tool_schema:
        validator = Draft202012Validator(approval.tool_schema)
        problem = next(iter(sorted(validator.iter_errors(arguments), key=str)), None)
        if problem is not None:
            where = "/".join(str(p) for p in problem.absolute_path)
            raise InvalidDecision(
                f"the arguments do not fit the tool: {problem.message}"
                + (f" (at '{where}')" if where else "")
            )
        # Nothing the tool does not declare: rules could not read it (studio.shell.read_arguments).
        declared = approval.tool_schema.get("properties") or {}
        added = sorted(k for k in arguments if k not in declared and k not in approval.arguments)
        if added:
            raise InvalidDecision(
                "the edit adds arguments the tool does not declare: "
                + ", ".join(repr(k) for k in added[:5])
            )
    if arguments == approval.arguments:
        return {}
    return {"approved_arguments": arguments, "approved_sha256": arguments_hash(arguments)}


def _check_always(
    approval: ToolApproval, pattern: str, scope: str, subject: str, reading: Reading
) -> None:
    if scope not in (Scope.CONVERSATION, Scope.MEMBER):
        raise InvalidDecision("scope must be one of: conversation, member")
    if len(pattern) > 1000:
        raise InvalidDecision("pattern must be at most 1000 characters")
    probe = ToolRule(tool=approval.tool_name, pattern=pattern)
    if not speaks_for(probe, approval.tool_name, subject, reading):
        raise InvalidDecision(
            "the pattern does not match this call"
            + (f" (a pattern only allows plain commands, and {reading.why})" if reading.why else "")
        )


def approvals_decide(
    *,
    approval_ids: list[str],
    user,
    decision: str,
    note: str = "",
    client: ClientInfo | None = None,
) -> list[dict]:
    """One decision for several approvals (Allow all / Deny all); first decision wins per row.

    Returns, per id, what it got: ``resolved``, ``status`` and ``reason``, or
    ``error`` ("not found" for unknown and other members' ids alike).
    """
    if decision not in ("allow", "deny"):
        raise InvalidDecision("a batch decision must be allow or deny")
    ids = list(dict.fromkeys(approval_ids))
    if not ids or len(ids) > MAX_BATCH:
        raise InvalidDecision(f"give between 1 and {MAX_BATCH} approval ids")
    answers = []
    for approval_id in ids:
        try:
            result = approval_decide(
                approval_id=approval_id, user=user, decision=decision, note=note, client=client
            )
        except ApprovalNotFound:
            answers.append({"approval_id": approval_id, "error": "not found"})
            continue
        except DecisionForbidden as exc:
            answers.append({"approval_id": approval_id, "error": str(exc)})
            continue
        row = result.approval
        answer = {
            "approval_id": approval_id,
            "resolved": result.resolved,
            "status": row.status,
            "reason": row.reason,
        }
        if result.review:
            answer["review"] = True
        answers.append(answer)
    return answers


def _decided(result: DecideResult) -> None:
    """After a decision commits: show every tab the card, and let its run go on."""
    approval = result.approval
    outcome = "allowed" if approval.is_allowed else "denied"
    DECISION_SECONDS.labels(approval.tool_name, outcome).observe(approval.decision_seconds or 0)
    with log_context(approval_id=approval.approval_id, conversation_id=approval.conversation_id):
        logger.info("%s call %s (%s) by %s", approval.tool_name, outcome, approval.reason,
                    approval.decided_by_id)  # fmt: skip
    card_changed(approval, result.card_html)
    _let_its_run_go_on(approval)


def _let_its_run_go_on(approval: ToolApproval) -> None:
    if approval.run_id:
        calls_settled.send(sender=ToolApproval, run_ids={approval.run_id})


def card_changed(approval: ToolApproval, html: str = "") -> None:
    """Every tab's card changes (``html``: the card, if already drawn) once this
    commits; an API call's agent that asked to hear of its decision is called back."""
    tell(CardChanged(approval, html))
    if approval.callback_url and not approval.is_pending:
        transaction.on_commit(callbacks_nudge)

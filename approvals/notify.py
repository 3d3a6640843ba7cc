"""What services tell open tabs: one kind of event per change, and the one way out.

A service says what changed with ``tell(event)``, inside its transaction or
not; once the change commits (at once outside a transaction) the event is
turned into the channel messages its audiences get (``_messages``: the
presentation, a card drawn once per event) and the runtime's outbox sends
them. A tab never hears of a row a rollback took back, nor before it can
read it. Events carry the values their fragments need, or the row the
service already holds: nothing here reads the database.

The audiences are channel-layer groups: a conversation's tabs
(``Conversation.group_name``), a member's sockets on every page
(``member_group``) and the reviewers' (``REVIEWERS_GROUP``). The run's own
fragments go out through ``chat.publisher``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.template.loader import render_to_string

from approvals.models import ToolApproval
from studio.runtime import runtime

# Every socket of a member who holds "Can review approvals".
REVIEWERS_GROUP = "reviewers"


def member_group(user_id: int) -> str:
    """Every socket of one member (session checks; their approvals inbox)."""
    return f"member.{user_id}"


@dataclass(frozen=True, slots=True)
class CallAsked:
    """A call waits for a decision (its card reaches the chat with its run's step)."""

    approval: ToolApproval


@dataclass(frozen=True, slots=True)
class CardChanged:
    """A call was decided, ended or sent to a reviewer: every tab's card changes.

    ``html``: the card, when the service already drew it (a decision's answer)."""

    approval: ToolApproval
    html: str = ""


@dataclass(frozen=True, slots=True)
class RuleUsed:
    """A member's own rule decided a call: its count, where their tabs show that rule."""

    rule_id: int
    hits: int
    owner_id: int
    conversation_id: int | None


@dataclass(frozen=True, slots=True)
class SessionsCheck:
    """The member logged out or their account changed: every socket re-checks its session.

    ``ended``: the digest of the session that ended (that socket closes at once)."""

    user_id: int
    ended: str = ""


@dataclass(frozen=True, slots=True)
class RolesChanged:
    """The member's roles changed at a sign-in: every socket reconnects with them."""

    user_id: int


Event = CallAsked | CardChanged | RuleUsed | SessionsCheck | RolesChanged


def tell(event: Event) -> None:
    """Send ``event`` to its audiences once the current transaction commits."""
    transaction.on_commit(lambda: _send(event))


def _send(event: Event) -> None:
    outbox = runtime().outbox
    for group, message in _messages(event):
        outbox.group(group, message)


def card(approval: ToolApproval, viewer=None) -> str:
    """The call's card as ``viewer`` sees it (None: the conversation's owner, as in
    the chat): the same for the page, the socket and the decision's answer."""
    return render_to_string(
        "approvals/_card.html",
        {
            "approval": approval,
            "viewer": viewer,
            "note_max_length": settings.STUDIO_NOTE_MAX_LENGTH,
        },
    )


def _messages(event: Event) -> list[tuple[str, dict]]:
    """The event as each audience gets it, drawn once."""
    match event:
        case CallAsked(approval=approval):
            return _inbox(approval)
        case CardChanged(approval=approval, html=html):
            changed = {
                "type": "approval.changed",
                "approval_id": approval.approval_id,
                "status": approval.status,
                "reason": approval.reason,
                "html": html or card(approval),
            }
            return [(approval.conversation.group_name, changed), *_inbox(approval)]
        case RuleUsed(rule_id=rule_id, hits=hits, owner_id=owner_id):
            html = render_to_string(
                "approvals/_rule_hits.html", {"rule": {"pk": rule_id, "hits": hits}, "oob": True}
            )
            used = {
                "type": "rule.hit",
                "conversation_id": event.conversation_id or 0,
                "html": html,
            }
            return [(member_group(owner_id), used)]
        case SessionsCheck(user_id=user_id, ended=ended):
            return [(member_group(user_id), {"type": "session.check", "ended": ended})]
        case RolesChanged(user_id=user_id):
            return [(member_group(user_id), {"type": "roles.changed"})]
    raise TypeError(f"not an event: {event!r}")


def _inbox(approval: ToolApproval) -> list[tuple[str, dict]]:
    """Whoever may decide the call: ids only, each inbox draws its own member's card
    (``approvals.inbox``: rights differ from one reviewer to the next)."""
    changed = {
        "type": "inbox.changed",
        "approval_id": approval.approval_id,
        "pending": approval.is_pending,
    }
    told = [(member_group(approval.conversation.owner_id), changed)]
    if approval.needs_review:
        told.append((REVIEWERS_GROUP, changed))
    return told

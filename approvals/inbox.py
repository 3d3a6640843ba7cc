"""The team's approvals inbox: what waits for whom, and the live updates of it.

An approval waits for its conversation's member and, when a Review rule
matched, for every reviewer but its requester. Sockets get only ids
(``inbox.changed``) and render the change for their own member here.
"""

from __future__ import annotations

from django.db.models import Q
from django.template.loader import render_to_string

from approvals.models import InboxPreference, ToolApproval, can_review
from studio.db import one_or_none


def _waiting_for(user_pk: int, *, reviewer: bool, own_reviews: bool = True):
    """The pending approvals a member (a reviewer, if ``reviewer``) may decide.

    ``own_reviews``: also the member's own calls that wait for a reviewer
    (listed in the inbox, where the member may deny them; not counted).
    """
    mine = Q(conversation__owner_id=user_pk)
    if not own_reviews:
        mine &= Q(needs_review=False)
    if reviewer:
        mine |= Q(needs_review=True) & ~Q(requested_by_id=user_pk)
    return ToolApproval.objects.pending().filter(mine)


def touched_since(user, since) -> bool:
    """Whether any approval the member's count or sidebar shows came or was decided
    at ``since`` or later (a page drawn then may show them wrong)."""
    mine = Q(conversation__owner_id=user.pk)
    if can_review(user):
        mine |= Q(needs_review=True)
    return (
        ToolApproval.objects.filter(mine)
        .filter(Q(requested_at__gte=since) | Q(decided_at__gte=since))
        .exists()
    )


def inbox_queryset(user):
    """Every pending approval ``user`` may decide (or, as the member, deny), newest first."""
    if user is None or not user.is_authenticated:
        return ToolApproval.objects.none()
    return (
        _waiting_for(user.pk, reviewer=can_review(user))
        .select_related("conversation__owner", "requested_by", "api_token")
        .order_by("-requested_at")
    )


def decided_by(user, limit: int = 20):
    """What ``user`` decided lately, newest first ("Decided by me")."""
    return (
        ToolApproval.objects.decided()
        .filter(decided_by=user)
        .select_related("conversation")
        .order_by("-decided_at")[:limit]
    )


def inbox_filters(entries: list[dict]) -> dict:
    """The choices the inbox's filters offer: the tools and members waiting now."""
    approvals = [e["approval"] for e in entries]
    return {
        "tools": sorted({a.tool_name for a in approvals}),
        "members": sorted({a.conversation.owner.get_username() for a in approvals}),
    }


def inbox_count(user) -> int:
    if user is None or not user.is_authenticated:
        return 0
    # Only what this person can settle: their own call that waits for a
    # reviewer waits on someone else.
    return _waiting_for(user.pk, reviewer=can_review(user), own_reviews=False).count()


def wants_notifications(user) -> bool:
    return InboxPreference.objects.filter(user_id=user.pk, notify=True).exists()


def notifications_set(user, *, on: bool) -> None:
    InboxPreference.objects.update_or_create(user=user, defaults={"notify": on})


def entry_context(approval: ToolApproval, user) -> dict:
    return {"approval": approval, "viewer": user}


def count_badge(count: int, *, oob: bool = True) -> str:
    return render_to_string("approvals/_inbox_count.html", {"inbox_count": count, "oob": oob})


def decided_by_me(user) -> str:
    """The inbox's "Decided by me", to swap in for the one on the page."""
    return render_to_string(
        "approvals/_decided_by_me.html", {"decided": decided_by(user), "oob": True}
    )


def inbox_state(user) -> str:
    """What a socket sends on every connect: the count, and (inbox page) every
    entry and what the member decided (a decision may have come in between)."""
    entries = [entry_context(a, user) for a in inbox_queryset(user)]
    return (
        count_badge(inbox_count(user))
        + render_to_string("approvals/_inbox_list.html", {"entries": entries, "oob": True})
        + decided_by_me(user)
    )


def inbox_change(user, *, approval_id: str, pending: bool) -> str:
    """What the inbox page sends when an approval came or went anywhere.

    The header count, the entry added or removed, and for a new card the
    member may act on, a notification (if they opted in).
    """
    html = count_badge(inbox_count(user))
    if not pending:
        # In its place, for a moment: what became of it (studio.js removes it).
        approval = one_or_none(
            ToolApproval.objects.select_related("decided_by").filter(approval_id=approval_id)
        )
        html += render_to_string(
            "approvals/_inbox_decided.html", {"approval": approval, "approval_id": approval_id}
        )
        if approval is not None and approval.decided_by_id == user.pk:
            html += decided_by_me(user)  # from this page, another tab or the chat
        return html
    approval = one_or_none(inbox_queryset(user).filter(approval_id=approval_id))
    if approval is None:
        return html  # decided already, or not this member's to see
    context = entry_context(approval, user)
    html += render_to_string("approvals/_inbox_added.html", context)
    if wants_notifications(user):
        html += render_to_string("approvals/_inbox_notify.html", context)
    return html


def inbox_refresh(user, *, came: list[str]) -> str:
    """What any other page sends after a burst of changes: the header count, and
    one notification for the newest of the cards that ``came`` that still waits
    (if the member opted in; a card decided meanwhile notifies nobody)."""
    html = count_badge(inbox_count(user))
    if came and wants_notifications(user):
        approval = inbox_queryset(user).filter(approval_id__in=came).first()
        if approval is not None:
            context = entry_context(approval, user)
            html += render_to_string("approvals/_inbox_notify.html", context)
    return html

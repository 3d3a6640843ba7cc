"""STUDIO_APPROVAL_WEBHOOK_URL: one POST for each call that has waited too long.

Every process looks for due rows (pending, requested at least
``STUDIO_APPROVAL_WEBHOOK_AFTER`` seconds ago, never claimed) each poll. A
conditional UPDATE claims a row for exactly one process, across processes;
that process POSTs on its own small pool (never a run's thread, never the
event loop), retries with backoff, and records how it went on the row. A
call decided before the delay is never announced.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from datetime import timedelta

import httpx
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from approvals.delivery import ClaimedPosts, claim_each
from approvals.models import ToolApproval
from studio.metrics import WEBHOOK_FAILURES

logger = logging.getLogger(__name__)

SUMMARY_CHARS = 300
CLAIM_BATCH = 100


def webhook_claim_due() -> list[ToolApproval]:
    """Claim the rows due for their POST; each row is claimed by one caller only."""
    if not settings.STUDIO_APPROVAL_WEBHOOK_URL:
        return []
    now = timezone.now()
    cutoff = now - timedelta(seconds=settings.STUDIO_APPROVAL_WEBHOOK_AFTER)
    due = (
        ToolApproval.objects.pending()
        .filter(requested_at__lte=cutoff, webhook_at__isnull=True)
        .values_list("pk", flat=True)[:CLAIM_BATCH]
    )
    claimed = claim_each(ToolApproval.objects.pending(), list(due), field="webhook_at", now=now)
    if not claimed:
        return []
    return list(
        ToolApproval.objects.filter(pk__in=claimed).select_related("conversation", "requested_by")
    )


def webhook_payload(approval: ToolApproval) -> dict:
    """What the POST says: the fields, and a ``text`` chat tools show as it is.

    ``STUDIO_APPROVAL_WEBHOOK_DETAIL=summary`` (the default) names the tool,
    the member and the link only; ``full`` adds the arguments and the
    conversation's title, which a model can word as it likes.
    """
    path = reverse("chat:conversation", args=[approval.conversation_id])
    link = f"{settings.STUDIO_SITE_URL}{path}#approval-{approval.approval_id}"
    who = approval.requested_by.get_username() if approval.requested_by else "someone"
    since = approval.requested_at
    waits_for = "a reviewer" if approval.needs_review else "a decision"
    payload = {
        "approval_id": approval.approval_id,
        "tool": approval.tool_name,
        "link": link,
        "requested_by": who,
        "waiting_since": since.isoformat(),
        "needs_review": approval.needs_review,
    }
    text = (
        f"{chat_text(who)}'s {chat_text(approval.tool_name)} call has waited for {waits_for} "
        f"since {since:%H:%M} UTC — {link}"
    )
    if settings.STUDIO_APPROVAL_WEBHOOK_DETAIL == "full":
        summary = approval.subject or ""
        if len(summary) > SUMMARY_CHARS:
            summary = summary[: SUMMARY_CHARS - 1] + "…"
        title = approval.conversation.title
        payload.update(arguments_summary=summary, conversation=title)
        text = (
            f"{chat_text(who)}'s {chat_text(approval.tool_name)} call in "
            f"{chat_code(title)} has waited for {waits_for} since {since:%H:%M} UTC: "
            f"{chat_code(summary)} — {link}"
        )
    payload["text"] = text
    return payload


# Slack and Mattermost read "<", ">" and "&" as markup ("<!channel>",
# "<https://evil|a link>"); their own escapes make them plain text.
_MARKUP = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
# A word after "@" mentions someone ("@here", "@channel", "@alice"): a
# zero-width space between them keeps the text and drops the mention.
_MENTION = re.compile(r"@(?=\w)")


def chat_text(text: str) -> str:
    """``text`` as plain words in a Slack or Mattermost message: no markup, no mention."""
    return _MENTION.sub("@\u200b", text.translate(_MARKUP))


def chat_code(text: str) -> str:
    """``text`` as inline code, where neither tool makes links or markdown of it."""
    flat = " ".join(text.split()).replace("`", "\u02cb")
    return f"`{chat_text(flat)}`" if flat else "(empty)"


def webhook_post(approval: ToolApproval, *, sleep: Callable[[float], None] = time.sleep) -> str:
    """POST the payload, retrying with backoff; record and return how it went."""
    url = settings.STUDIO_APPROVAL_WEBHOOK_URL
    attempts = settings.STUDIO_APPROVAL_WEBHOOK_ATTEMPTS
    delay = settings.STUDIO_APPROVAL_WEBHOOK_BACKOFF
    payload = webhook_payload(approval)
    problem = ""
    result = ""
    with httpx.Client(timeout=10, trust_env=False, follow_redirects=False) as client:
        for attempt in range(1, attempts + 1):
            try:
                response = client.post(url, json=payload)
                if 200 <= response.status_code < 300:
                    result = f"sent (attempt {attempt})"
                    break
                problem = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"[:120]
            if attempt < attempts:
                sleep(delay)
                delay *= 3
    if not result:
        result = f"failed after {attempts} attempt(s): {problem}"
        WEBHOOK_FAILURES.inc()
        logger.warning("approval webhook for %s %s", approval.approval_id, result)
    ToolApproval.objects.filter(pk=approval.pk).update(webhook_result=result[:200])
    return result


WEBHOOK = ClaimedPosts(
    "approval webhook",
    claim=webhook_claim_due,
    post=webhook_post,
    logger=logger,
    enabled=lambda: bool(settings.STUDIO_APPROVAL_WEBHOOK_URL),
)
webhook_tick = WEBHOOK.tick
webhook_loop = WEBHOOK.loop  # (looks only when a URL is set)

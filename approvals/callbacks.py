"""An API call's callback: one signed POST to the agent when its decision comes.

Each poll (and at once after a decision commits), a process claims the
decided API rows with a ``callback_url`` never claimed (a conditional
update: one claim across processes) and POSTs each from a small pool of its
own, retrying with backoff, through ``studio.net``'s guard: the URL must
resolve to public addresses when it is sent too (an admin may allow hosts
with STUDIO_API_CALLBACK_ALLOW_HOSTS). How it went is kept on the row.

The POST carries ``Studio-Signature: t=<unix time>,v1=<hex>``: HMAC-SHA256
of ``"<t>." + body`` with the SHA-256 (hex) of the token's secret as key, so
the agent, which holds the token, can check it (studio_approvals.verify_callback).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable

import httpx
from django.conf import settings
from django.utils import timezone

from approvals.delivery import ClaimedPosts, claim_each
from approvals.models import ToolApproval
from studio.net import BlockedAddress, GuardedBackend, GuardedTransport, allowed_endpoints

logger = logging.getLogger("studio.api")

CLAIM_BATCH = 100
ATTEMPTS = 4
FIRST_DELAY = 1.0  # seconds, tripled after each failed attempt


def signature(key: str, timestamp: int, body: bytes) -> str:
    return hmac.new(key.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def callbacks_claim_due() -> list[ToolApproval]:
    """Claim the decided API rows whose callback was never sent; each by one caller only."""
    due = (
        ToolApproval.objects.decided()
        .filter(source=ToolApproval.Source.API, callback_at__isnull=True)
        .exclude(callback_url="")
        .values_list("pk", flat=True)[:CLAIM_BATCH]
    )
    claimed = claim_each(
        ToolApproval.objects.all(), list(due), field="callback_at", now=timezone.now()
    )
    if not claimed:
        return []
    return list(
        ToolApproval.objects.filter(pk__in=claimed).select_related(
            "conversation", "decided_by", "api_token"
        )
    )


def callback_post(approval: ToolApproval, *, sleep: Callable[[float], None] = time.sleep) -> str:
    """POST the decision, retrying with backoff; record and return how it went."""
    if approval.api_token is None:
        result = "not sent: its token was deleted"
    else:
        body = json.dumps({"event": "approval.decided", "approval": approval.api_answer()})
        result = _send(approval, body.encode(), approval.api_token.secret_sha256, sleep)
    ToolApproval.objects.filter(pk=approval.pk).update(callback_result=result[:200])
    logger.info(
        "api callback for %s: %s",
        approval.approval_id,
        result,
        extra={"event": "api_callback", "approval_id": approval.approval_id},
    )
    return result


def _send(approval: ToolApproval, body: bytes, key: str, sleep) -> str:
    backend = GuardedBackend(
        allow_private=False, allow=allowed_endpoints(settings.STUDIO_API_CALLBACK_ALLOW_HOSTS)
    )
    backend.scheme = approval.callback_url.split(":", 1)[0].lower()
    problem, delay = "", FIRST_DELAY
    with httpx.Client(
        transport=GuardedTransport(backend), timeout=10, follow_redirects=False
    ) as client:
        for attempt in range(1, ATTEMPTS + 1):
            stamp = int(time.time())
            headers = {
                "Content-Type": "application/json",
                "User-Agent": "Studio-Callback/1",
                "Studio-Signature": f"t={stamp},v1={signature(key, stamp, body)}",
            }
            try:
                response = client.post(approval.callback_url, content=body, headers=headers)
                if 200 <= response.status_code < 300:
                    return f"delivered (attempt {attempt}, HTTP {response.status_code})"
                problem = f"HTTP {response.status_code}"
                if 400 <= response.status_code < 500 and response.status_code not in (408, 429):
                    return f"refused by the receiver: {problem}"
            except BlockedAddress as exc:
                return f"not sent: {exc}"
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"[:120]
            if attempt < ATTEMPTS:
                sleep(delay)
                delay *= 3
    return f"failed after {ATTEMPTS} attempts: {problem}"


CALLBACKS = ClaimedPosts(
    "api callback", claim=callbacks_claim_due, post=callback_post, logger=logger
)
callbacks_tick = CALLBACKS.tick
# A decision on an API call with a callback committed: look now.
callbacks_nudge = CALLBACKS.nudge
callbacks_loop = CALLBACKS.loop

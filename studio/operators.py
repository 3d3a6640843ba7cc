"""Who may read an operator's endpoints in full: staff, or a bearer of STUDIO_HEALTH_TOKEN."""

from __future__ import annotations

import hmac

from django.conf import settings


async def is_operator(request) -> bool:
    """A staff member's session, or ``Authorization: Bearer <STUDIO_HEALTH_TOKEN>``."""
    token = settings.STUDIO_HEALTH_TOKEN
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    # As bytes: compare_digest refuses a str that is not ASCII, and a header
    # may hold anything.
    given_bytes = given.strip().encode("utf-8", "surrogateescape")
    if token and scheme.lower() == "bearer" and hmac.compare_digest(given_bytes, token.encode()):
        return True
    user = await request.auser()
    return bool(user.is_authenticated and user.is_active and user.is_staff)

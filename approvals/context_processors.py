from __future__ import annotations

from django.utils.functional import SimpleLazyObject

from approvals.inbox import inbox_count


def inbox(request) -> dict:
    """The header's count of waiting approvals (counted only by a page that shows it)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"inbox_count": SimpleLazyObject(lambda: inbox_count(user))}

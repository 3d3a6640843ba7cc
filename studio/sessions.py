"""Is a session still logged in? Asked by long-lived sockets before every action."""

from __future__ import annotations

import hashlib
from importlib import import_module

from django.conf import settings
from django.contrib import auth
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest


def session_user(session_key: str | None):
    """The user ``session_key`` still logs in, or ``AnonymousUser``.

    Anonymous when the member logged out (the session is gone), the session
    expired, the account was deactivated, or the password changed (Django's
    session hash no longer matches): exactly what a new request would see.
    """
    if not session_key:
        return AnonymousUser()
    engine = import_module(settings.SESSION_ENGINE)
    request = HttpRequest()
    request.session = engine.SessionStore(session_key)
    return auth.get_user(request)


def session_digest(session_key: str | None) -> str:
    """A session key as it may travel through the channel layer (not the key itself)."""
    return hashlib.sha256((session_key or "").encode()).hexdigest() if session_key else ""

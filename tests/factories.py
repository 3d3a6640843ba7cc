"""Plain factories: make_* functions with sensible defaults."""

from __future__ import annotations

import itertools

from django.contrib.auth import get_user_model

from approvals.models import ToolApproval, arguments_hash
from chat.models import Conversation

_seq = itertools.count(1)
PASSWORD = "correct-horse-battery-staple"


def make_user(username: str | None = None, *, staff: bool = False, superuser: bool = False):
    User = get_user_model()
    username = username or f"user{next(_seq)}"
    if superuser:
        return User.objects.create_superuser(username, f"{username}@example.com", PASSWORD)
    user = User.objects.create_user(username, f"{username}@example.com", PASSWORD)
    if staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    return user


def make_live_member(settings, username: str, **extra):
    """A member who logs in to a live server, which checks passwords with the
    real hashers, not the test settings' MD5 (``settings``: pytest-django's)."""
    from django.contrib.auth.hashers import make_password

    user = make_user(username, **extra)
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    user.password = make_password(PASSWORD)
    user.save(update_fields=["password"])
    return user


def make_reviewer(username: str | None = None):
    """A member of a "Reviewers" group holding "Can review approvals", as an admin sets it up."""
    from django.contrib.auth.models import Group, Permission

    group, _ = Group.objects.get_or_create(name="Reviewers")
    group.permissions.add(Permission.objects.get(codename="review_toolapproval"))
    user = make_user(username)
    user.groups.add(group)
    return get_user_model().objects.get(pk=user.pk)  # no cached permissions


def make_conversation(owner, **fields) -> Conversation:
    fields.setdefault("title", f"Chat {next(_seq)}")
    return Conversation.objects.create(owner=owner, **fields)


def make_approval(conversation: Conversation, **fields) -> ToolApproval:
    fields.setdefault("tool_name", "python")
    fields.setdefault("arguments", {"code": "print(1 + 1)"})
    fields.setdefault("requested_by", conversation.owner)
    fields.setdefault("arguments_sha256", arguments_hash(fields["arguments"]))
    return ToolApproval.objects.create(conversation=conversation, **fields)


def make_run(conversation: Conversation, **fields):
    from chat.models import Run

    fields.setdefault("started_by", conversation.owner)
    return Run.objects.create(conversation=conversation, **fields)

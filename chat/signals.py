"""Chat's receivers: sockets re-check sessions; a purge removes deleted chats."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import post_save
from django.dispatch import receiver

from approvals.signals import approvals_purged
from chat.services import conversations_purge_deleted, member_sessions_recheck


@receiver(user_logged_out)
def _logged_out(sender, request, user, **kwargs) -> None:
    if user is not None:
        # The session row is flushed right after this signal: name it, so
        # its sockets close without racing the flush.
        member_sessions_recheck(user_id=user.pk, ended_session=request.session.session_key)


@receiver(post_save, sender=get_user_model())
def _account_changed(sender, instance, created, **kwargs) -> None:
    # Deactivated or a new password (the session hash changes): every socket
    # of this member re-checks its own session.
    if not created:
        member_sessions_recheck(user_id=instance.pk)


@receiver(approvals_purged)
def _approvals_purged(sender, dry_run: bool, **kwargs) -> str:
    removed = conversations_purge_deleted(dry_run=dry_run)
    if not removed:
        return ""
    return (
        f"{'Would remove' if dry_run else 'Removed'} {removed} deleted chat(s) with no audit left."
    )

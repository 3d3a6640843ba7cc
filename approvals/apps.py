from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from approvals.services import approval_poll_waiters, wake_from_message
        from studio.runtime import runtime

        inbox = runtime().inbox
        inbox.register("approval.decided", wake_from_message)
        inbox.poll = approval_poll_waiters

from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from approvals.services.waiting import approval_poll_waiters, wake_from_message
        from approvals.webhook import webhook_loop
        from studio.runtime import runtime

        rt = runtime()
        rt.inbox.register("approval.decided", wake_from_message)
        rt.inbox.poll = approval_poll_waiters
        rt.services.append(webhook_loop)

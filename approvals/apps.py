from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from approvals.inbox import register_handler
        from approvals.services import wake_from_message

        register_handler("approval.decided", wake_from_message)

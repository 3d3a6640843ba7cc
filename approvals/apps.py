from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from approvals.webhook import webhook_loop
        from studio.runtime import runtime

        runtime().services.append(webhook_loop)

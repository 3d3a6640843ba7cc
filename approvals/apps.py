from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from approvals import signin  # noqa: F401  (its login and logout receivers)
        from approvals.callbacks import callbacks_loop
        from approvals.metrics import WaitingCalls
        from approvals.webhook import webhook_loop
        from studio.metrics import collector_add
        from studio.runtime import runtime

        runtime().services.append(webhook_loop)
        runtime().services.append(callbacks_loop)
        collector_add(WaitingCalls())

from __future__ import annotations

import logging

from django.apps import AppConfig

logger = logging.getLogger("studio.sandbox")


class ChatConfig(AppConfig):
    name = "chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        import chat.signals  # noqa: F401 - sockets re-check sessions on logout
        import studio.signals  # noqa: F401 - connects the SQLite permission guard
        from chat.tools import sandbox

        if sandbox.sandbox_mode() == "none":
            logger.warning(
                "!!! STUDIO_SANDBOX=none: tool calls run WITHOUT isolation. Approved code can "
                "reach the network, Redis, the database and the server's files. !!!"
            )
        elif sandbox.bwrap_path() is None:
            logger.warning("Tool sandbox: %s", sandbox.describe())

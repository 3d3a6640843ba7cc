from __future__ import annotations

import logging

from django.apps import AppConfig
from django.conf import settings

logger = logging.getLogger("studio.sandbox")


class ChatConfig(AppConfig):
    name = "chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        import chat.signals  # noqa: F401 - session re-checks; purge removes deleted chats
        import studio.signals  # noqa: F401 - connects the SQLite permission guard
        from approvals.services.rules import (
            call_reader_install,
            tool_names_install,
            tool_schema_install,
        )
        from approvals.signals import calls_settled
        from chat import mcp
        from chat.metrics import RunStates
        from chat.runs import commands, upkeep
        from chat.services import python_session_current
        from chat.toolbox import builtin_schema, call_reading, tool_names
        from chat.tools import sandbox
        from chat.tools.sessions import SESSIONS
        from studio.metrics import collector_add
        from studio.runtime import runtime

        # Decisions read an edited call the way the run reads the model's.
        call_reader_install(call_reading)
        tool_names_install(tool_names)
        tool_schema_install(builtin_schema)
        # A python session asks the conversation's row whether Stop or Restart ended it.
        SESSIONS.is_current = python_session_current
        rt = runtime()
        rt.inbox.register("run.cancel", commands.cancel_from_message)
        rt.inbox.register("runs.resume", commands.resume_from_message)
        rt.services.append(upkeep.heartbeat)
        rt.services.append(upkeep.sweep)
        rt.on_exit.append(upkeep.wind_down)
        rt.on_exit.append(lambda rt: SESSIONS.end_all())
        rt.on_exit.append(mcp.close_hub)
        calls_settled.connect(commands.on_calls_settled, dispatch_uid="chat.resume_runs")
        collector_add(RunStates())

        if sandbox.sandbox_mode() == "none":
            logger.warning(
                "!!! STUDIO_SANDBOX=none: tool calls run WITHOUT isolation. Approved code can "
                "reach the network, Redis, the database and the server's files. !!!"
            )
        elif sandbox.bwrap_path() is None:
            logger.warning("Tool sandbox: %s", sandbox.describe())
        if sandbox.under_private_dir(settings.STUDIO_WORKSPACE_ROOT):
            logger.warning(
                "STUDIO_WORKSPACE_ROOT=%s is under %s: every tool call gets a private copy "
                "of those, and the workspaces' path shows through it. Keep it elsewhere.",
                settings.STUDIO_WORKSPACE_ROOT,
                ", ".join(sandbox.PRIVATE_DIRS),
            )

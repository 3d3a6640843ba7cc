"""The commands on a run: launch (send, retry, regenerate, edit), wake, stop.

Each is called off the loop by a view or a socket, or by the inbox when
another process hands work over (``resume_from_message``,
``cancel_from_message``). A launched run is stepped here by
``chat.runs.driver``; a process that steps no runs hands it over.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from chat import display, render
from chat.models import Conversation, Run
from chat.runs.driver import drive
from chat.runs.local import local_runs
from chat.runs.state import (
    run_stop_request,
)
from chat.services import (
    ForkRefused,
    RunBusy,
    conversation_retryable,
    editable_message,
    python_sessions_reset,
    regenerate_point,
    run_create,
)
from studio.runtime import runtime, shared_channel

logger = logging.getLogger(__name__)

# A run handed over by a process that steps none: how long the process it
# prefers (where its python session is) has to claim it before any other may.
PREFERRED_FIRST_SECONDS = 1.0

REFUSALS = {
    "running": "The agent is still working on your previous message. "
    "Wait for it to finish, or press Stop. Your message was not sent.",
    "empty": "Type a message first.",
    "gone": "This conversation no longer exists.",
    "down": "The server is shutting down; your message was not sent. Try again in a moment.",
    "nothing": "There is nothing to retry.",
    "unasked": "There is no reply to regenerate yet.",
    "moved": "That message was replaced meanwhile; edit the one shown now.",
}


@dataclass(frozen=True)
class Launch:
    ok: bool
    reason: str = ""  # a key of REFUSALS
    run_id: str = ""

    @property
    def refusal(self) -> str:
        return REFUSALS.get(self.reason, "")


# --- starting, resuming and stopping ------------------------------------------------------


def run_launch(*, conversation_id: int, user, text: str) -> Launch:
    """Save the user's message and start a run for it (blocking: call off the loop)."""
    if not text.strip():
        return Launch(ok=False, reason="empty")
    return _launch(conversation_id, user, text)


def run_retry(*, conversation_id: int, user) -> Launch:
    """Ask the model again after a run that ended in an error (blocking: call off the loop)."""
    if not conversation_retryable(conversation_id):
        return Launch(ok=False, reason="nothing")
    return _launch(conversation_id, user, None)


def run_regenerate(*, conversation_id: int, user) -> Launch:
    """Run the last turn again: what answered the member's last message is folded
    away as an earlier version (blocking: call off the loop)."""
    asked, fork_from = regenerate_point(conversation_id)
    if not asked:
        return Launch(ok=False, reason="unasked")
    return _launch(conversation_id, user, None, fork_from=fork_from)


def run_edit(*, conversation_id: int, user, message_id: int, text: str) -> Launch:
    """Send an edited version of one of the member's messages: the chat forks there,
    and the old branch stays readable, folded (blocking: call off the loop)."""
    if not text.strip():
        return Launch(ok=False, reason="empty")
    if not editable_message(conversation_id=conversation_id, message_id=message_id):
        return Launch(ok=False, reason="moved")
    return _launch(conversation_id, user, text, fork_from=message_id)


def _launch(
    conversation_id: int, user, text: str | None, *, fork_from: int | None = None
) -> Launch:
    """Start a run here, or (in a process that steps no runs: a WSGI worker, a
    command) hand it to a serving process through the shared channel."""
    rt = runtime()
    if rt.stopping:
        return Launch(ok=False, reason="down")
    serving = rt.serving
    run_id = str(uuid.uuid4())
    try:
        run, first = run_create(
            run_id=run_id,
            conversation_id=conversation_id,
            user=user,
            text=text,
            owner=rt.inbox.name if serving else "",
            fork_from=fork_from,
        )
    except RunBusy:
        return Launch(ok=False, reason="running")
    except Conversation.DoesNotExist:
        return Launch(ok=False, reason="gone")
    except ForkRefused:
        return Launch(ok=False, reason="moved")
    if not serving:
        run_wake([run_id])  # were the message lost, a sweep finds the run
        return Launch(ok=True, run_id=run_id)
    if fork_from is not None:
        # Every tab redraws the chat with the old branch folded (and the edited
        # message) before the run's first fragment, which goes the same way.
        conversation = run.conversation
        items = display.transcript_items(conversation)
        for frame in render.transcript_frames(conversation, items):
            rt.outbox.group(conversation.group_name, {"type": "chat.fragment", "html": frame})
        first = None
    rt.agent_pool.submit(drive, rt, run_id, launched=(run, first))
    return Launch(ok=True, run_id=run_id)


def run_wake(run_ids) -> None:
    """Step these runs here if they can go on (a call of theirs was decided or ended).

    A process that serves no loop (a WSGI worker, a management command) hands
    them to the serving processes through the shared channel; were that
    message lost, their sweeps find the runs.
    """
    rt = runtime()
    if not rt.serving:
        # The process that stepped a run last holds its python session: it is
        # asked first (every serving process hears the shared channel).
        preferred: dict[str, list[str]] = {}
        for run_id, stepped_by in Run.objects.filter(pk__in=list(run_ids)).values_list(
            "pk", "stepped_by"
        ):
            preferred.setdefault(stepped_by, []).append(str(run_id))
        for prefer, ids in preferred.items():
            message = {"type": "runs.resume", "run_ids": ids, "prefer": prefer}
            rt.outbox.channel(shared_channel(), message)
        return
    table = local_runs(rt)
    for run_id in run_ids:
        run_id = str(run_id)
        if table.queue(run_id):
            rt.agent_pool.submit(drive, rt, run_id)


def on_calls_settled(sender, *, run_ids, **kwargs) -> None:
    """``approvals.signals.calls_settled``: their runs may go on."""
    run_wake(run_ids)


def run_stop(*, conversation_id: int, user) -> bool:
    """Stop the conversation's run, wherever it is: working in a process, or waiting."""
    run = run_stop_request(conversation_id=conversation_id, user=user)
    if run is None:
        return False
    rt = runtime()
    local = local_runs(rt).get(str(run.pk))
    if local is not None:
        local.cancel.cancel()
    elif run.owner and run.owner != rt.inbox.name:
        # (A lost message: that process's heartbeat reads the row's flag.)
        rt.outbox.channel(run.owner, {"type": "run.cancel", "run_id": str(run.pk)})
    # Nothing the run started outlives Stop: its python session ends too.
    python_sessions_reset(conversation_id=conversation_id)
    return True


def resume_from_message(message: dict) -> None:
    """Inbox handler for ``runs.resume``, handed over by a process that serves no loop.

    The process it prefers claims at once; the others a moment later, and
    only if it did not (it may have exited since).
    """
    run_ids = message.get("run_ids") or []
    prefer = message.get("prefer") or ""
    rt = runtime()
    if prefer and prefer != rt.inbox.name and rt.loop is not None:
        rt.loop.call_later(PREFERRED_FIRST_SECONDS, run_wake, run_ids)
        return
    run_wake(run_ids)


def cancel_from_message(message: dict) -> None:
    """Inbox handler for ``run.cancel`` sent by the process where Stop was pressed."""
    local = local_runs().get(str(message.get("run_id", "")))
    if local is not None:
        local.cancel.cancel()

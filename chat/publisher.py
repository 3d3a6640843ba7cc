"""A run's events as fragments for its conversation's group (the presentation of a step)."""

from __future__ import annotations

import secrets
import time

from approvals.models import ToolApproval
from approvals.services.decisions import approval_now
from chat import events, render
from chat.display import MessageView
from chat.models import Conversation, Message, Run
from studio.runtime import runtime

FLUSH_SECONDS = 0.05


class Publisher:
    """Renders a run's events, and what its driver tells as a step begins and
    ends, into fragments for the conversation's group: a step draws nothing
    itself.

    Fragments are gathered and sent as one channel message at the points
    where the run is about to wait (a status line before a tool or the model
    works, a pending card, the end), so a quick tool costs a few messages,
    not one per fragment: a decided call's result leaves with the
    "Thinking…" that follows it. Content deltas go out at most every
    FLUSH_SECONDS.
    """

    def __init__(self, conversation: Conversation, run: Run) -> None:
        self.group = conversation.group_name
        self.conversation_id = conversation.pk
        # Unique per step: a step resumed elsewhere starts its turns from 0 again.
        self.stream_key = f"{run.pk}-{secrets.token_hex(3)}"
        self.outbox = runtime().outbox
        self.turn = 0
        self.stream_open = False
        self.pending: list[str] = []
        # The batch holds a result the member waits for: deliver it before
        # the run goes on (see Outbox.group's ``wait``).
        self.urgent = False
        self.deltas: list[str] = []
        self.last_flush = 0.0

    @property
    def stream_id(self) -> str:
        return f"stream-{self.stream_key}-{self.turn}"

    @staticmethod
    def approval_of(event: events.ToolStarted) -> ToolApproval | None:
        """The card's row as it is now, with its conversation (the card's rights
        need its owner): a decision may already have come."""
        if not event.approval_id:
            return None
        approval = approval_now(event.approval_id)
        if approval is None:
            raise ToolApproval.DoesNotExist(f"no approval {event.approval_id}")
        return approval

    def send(self, html: str) -> None:
        """Queue ``html``; it leaves with the next flush."""
        self.pending.append(html)

    def flush(self) -> None:
        """Send what is queued (and the buffered deltas) as one message."""
        if self.deltas:
            if not self.stream_open:
                self.stream_open = True
                self.pending.append(render.stream_open(self.stream_id))
            self.pending.append(render.stream_delta(self.stream_id, "".join(self.deltas)))
            self.deltas.clear()
        if not self.pending:
            return
        html = "".join(self.pending)
        self.pending.clear()
        self.last_flush = time.monotonic()
        self.outbox.group(self.group, {"type": "chat.fragment", "html": html}, wait=self.urgent)
        self.urgent = False

    # -- what the driver tells, as a step begins and ends -------------------------------

    def redrawn(self, conversation: Conversation, items: list) -> None:
        """The chat redrawn (a run handed over before its first step: the tabs lack
        its message or its fork), with its title."""
        *earlier, last = render.transcript_frames(conversation, items)
        for frame in earlier:  # a long chat: each part a message of its own
            self.send(frame)
            self.flush()
        self.send(last + render.title(conversation.title))

    def asked(self, first: MessageView, title: str) -> None:
        """The member's message that launched the run; it names the conversation,
        and every open tab shows the name."""
        self.send(render.appended(render.message(first)) + render.title(title))

    def notice(self, text: str) -> None:
        self.send(render.notice(text, level="info"))

    def running(self) -> None:
        """The run controls offer Stop: sent at once, before any slow work."""
        self.send(render.run_controls(running=True, conversation_id=self.conversation_id))
        self.flush()

    def ended(self, *, failed: bool) -> None:
        """No status line; Retry after an error, else Regenerate (sent with what follows)."""
        self.send(render.run_status(""))
        self.send(
            render.run_controls(
                running=False,
                conversation_id=self.conversation_id,
                retry=failed,
                regenerate=not failed,
            )
        )

    def titled(self, title: str) -> None:
        self.send(render.title(title))
        self.flush()

    def settings(self, context: dict) -> None:
        """The settings panel (``chat.display.settings_context``): new MCP tools."""
        self.send(render.settings_panel(context, oob=True))

    def files(self, context: dict) -> None:
        """The workspace's files (``chat.display.files_context``): what tools made."""
        self.send(render.files_panel(context, oob=True))

    # -- a step's events -----------------------------------------------------------------

    def live_output(self, message_id: int, call_id: str, text: str) -> None:
        """A running call's latest output, on its card (from the call's own thread,
        which is this step's: the sandbox's watch hands it over)."""
        self.send(render.tool_live(message_id, call_id, text))
        self.flush()

    def event(self, event: events.Event) -> None:
        match event:
            case events.Delta(text=text):
                self.deltas.append(text)
                if time.monotonic() - self.last_flush >= FLUSH_SECONDS:
                    self.flush()
            case events.Status(text=text):
                # Something that may be slow comes next (the model, a tool).
                self.send(render.run_status(text))
                self.flush()
            case events.TurnSaved():
                # Drop the streaming bubble, append the final message (a tab
                # that reconnected mid-stream never had the bubble, and still
                # gets this).
                self.deltas.clear()
                drop = render.stream_drop(self.stream_id) if self.stream_open else ""
                self.send(drop + render.appended(render.turn_saved(event, self.conversation_id)))
                self.turn += 1
                self.stream_open = False
            case events.ToolStarted(awaiting=awaiting, needs_review=needs_review):
                self.send(render.tool_started(event, self.approval_of(event)))
                if awaiting:
                    waiting = (
                        "Waiting for a reviewer…" if needs_review else "Waiting for your decision…"
                    )
                    self.send(render.run_status(waiting))
                    self.flush()
            case events.TurnAsked(message_id=message_id, approval_ids=approval_ids):
                self.send(render.batch(message_id, approval_ids))
            case events.ToolFinished():
                # It leaves with what comes next: a status line (before the model
                # is asked again, or the next tool runs), a card that waits, or
                # the end; each comes before any slow work. Someone may watch
                # its card: it is delivered before the run goes on.
                self.send(render.tool_finished(event))
                self.urgent = True
            case events.Failed(message_id=message_id, text=text, created_at=created_at):
                view = MessageView(message_id, Message.Role.ERROR, text, created_at)
                self.send(render.appended(render.message(view)))
            case events.Done():
                pass

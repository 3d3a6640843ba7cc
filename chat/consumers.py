from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs

from django.db.models import Exists, OuterRef
from django.utils import timezone

from approvals.consumers import MemberSocket, off_loop
from approvals.inbox import count_badge, inbox_count, touched_since
from approvals.models import ToolApproval
from chat import display, render
from chat.limits import MAX_FRAME, MAX_MESSAGE
from chat.models import Conversation, Run
from chat.runs.commands import run_edit, run_launch, run_regenerate, run_retry, run_stop
from chat.workspace import attached_note, with_attached
from studio.db import one_or_none
from studio.logs import log_context_keep
from studio.text import strip_nul

# A page's first socket names when it was drawn; a later one may have missed
# anything, and so may a page older than this.
DRAWN_FOR = timedelta(seconds=60)


def page_drawn_at(query_string: bytes) -> datetime | None:
    """The page's ``since`` (seconds since the epoch, as the server drew it), if
    recent; None otherwise (the whole state is sent)."""
    values = parse_qs(query_string.decode("latin-1")).get("since", [])
    if len(values) != 1 or not values[0].isdigit():
        return None
    try:
        drawn = datetime.fromtimestamp(int(values[0]), tz=UTC)
    except (OverflowError, ValueError, OSError):
        return None
    age = timezone.now() - drawn
    return drawn if timedelta(0) <= age + timedelta(seconds=1) <= DRAWN_FOR else None


def _conversation_for(conversation_id: int, user) -> Conversation | None:
    """The member's conversation, with whether a run of it is going (``running``)."""
    running = Run.objects.running().filter(conversation=OuterRef("pk"))
    return one_or_none(
        Conversation.objects.owned_by(user)
        .filter(pk=conversation_id)
        .annotate(running=Exists(running))
    )


def _attached(conversation_id: int, names: object) -> tuple[str | None, str]:
    """The message's line for the files sent with it, and the files panel showing them."""
    conversation = Conversation.objects.get(pk=conversation_id)
    note = attached_note(conversation, names)
    return note, render.files_panel(display.files_context(conversation), oob=True) if note else ""


def _settings(conversation_id: int) -> str:
    conversation = Conversation.objects.get(pk=conversation_id)
    return render.settings_panel(display.settings_context(conversation), oob=True)


class ChatConsumer(MemberSocket):
    """One browser tab on one conversation (and, as every page, its member's count).

    It only forwards: the run's fragments arrive through the conversation's
    group (from any process); messages and Stop go to the run services.
    Every action first checks that the tab's session still logs its member
    in, so a tab left open after logging out (or after the account was
    deactivated or its password changed) can do nothing more.
    """

    conversation_id: int | None = None
    admitted: Conversation | None = None
    # When the page this socket belongs to was drawn (its first connect only):
    # its catch-up then sends only what the page lacks.
    drawn_at: datetime | None = None

    def admit(self) -> bool:
        conversation_id = int(self.scope["url_route"]["kwargs"]["conversation_id"])
        conversation = _conversation_for(conversation_id, self.user)
        if conversation is None:
            return False
        self.conversation_id = conversation_id
        self.group = conversation.group_name
        self.admitted = conversation  # the first catch-up's, read a moment ago
        self.drawn_at = page_drawn_at(self.scope.get("query_string", b""))
        # Off the loop, yet the socket's task keeps it: sync_to_async carries
        # context variables back to its caller.
        log_context_keep(user_id=self.user.pk, conversation_id=conversation_id)
        self.seq = 0
        return True

    def groups_to_join(self) -> list[str]:
        return [self.group, *super().groups_to_join()]

    def state(self) -> list[str]:
        conversation = self.admitted or _conversation_for(self.conversation_id, self.user)
        self.admitted = None  # a later catch-up (Redis forgot the groups) reads it again
        if conversation is None:
            return []
        drawn_at, self.drawn_at = self.drawn_at, None
        items = display.transcript_items(conversation)
        controls = display.run_controls(conversation, conversation.running)
        if drawn_at is not None and not touched_since(self.user, drawn_at):
            # The page has the panel, the count and the sidebar as they are:
            # nothing the member's count or sidebar shows changed since.
            return render.catch_up(conversation, items, controls=controls)
        panel = display.settings_context(conversation)
        *transcript, last = render.catch_up(conversation, items, controls=controls, panel=panel)
        markers = display.waiting(self.user)
        return [
            *transcript,
            last + count_badge(inbox_count(self.user)) + render.waiting_markers(markers),
        ]

    def refreshed(self, came: list[str], touched: list[str]) -> str:
        markers = display.waiting(self.user, approval_ids=touched)
        return super().refreshed(came, touched) + render.waiting_markers(markers)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if await self._session_ended():
            return
        if text_data is None:
            await self.notice("Studio only understands text messages.")
            return
        if len(text_data) > MAX_FRAME:
            await self.notice("That message is too large.")
            return
        try:
            data = json.loads(text_data)
        except (ValueError, RecursionError):
            # RecursionError: a deeply nested frame is still just unreadable.
            await self.notice("Studio could not read that message.")
            return
        if not isinstance(data, dict):
            await self.notice("Studio could not read that message.")
            return
        action = data.get("action", "send")
        if action == "stop":
            if not await off_loop(run_stop, conversation_id=self.conversation_id, user=self.user):
                await self.notice("Nothing is running.", level="info")
            return
        if action in ("retry", "regenerate"):
            again = run_retry if action == "retry" else run_regenerate
            launch = await off_loop(again, conversation_id=self.conversation_id, user=self.user)
            if not launch.ok:
                await self.notice(launch.refusal)
            return
        if action not in ("send", "edit"):
            await self.notice("Unknown action.")
            return
        text = data.get("message")
        if not isinstance(text, str):
            await self.notice("Studio could not read that message.")
            return
        text = strip_nul(text)
        if len(text) > MAX_MESSAGE:
            await self.notice(f"Messages are limited to {MAX_MESSAGE:,} characters.")
            return
        if action == "edit":
            await self.edit(data, text)
            return
        files = ""
        if data.get("files"):
            # Files sent with the message, uploaded a moment before (studio.js).
            note, files = await off_loop(_attached, self.conversation_id, data["files"])
            if note is None:
                await self.notice("Studio could not find the files sent with that message.")
                return
            text = with_attached(text, note)
        launch = await off_loop(
            run_launch, conversation_id=self.conversation_id, user=self.user, text=text
        )
        self.seq += 1
        if launch.ok:
            await self.send(
                text_data=render.notice("", level="none")
                + render.composer_state("accepted", self.seq)
                + files
            )
        else:
            await self.send(
                text_data=render.notice(launch.refusal) + render.composer_state("refused", self.seq)
            )

    async def edit(self, data: dict, text: str) -> None:
        message_id = data.get("message_id")
        if not (isinstance(message_id, str) and message_id.isdigit()):
            await self.notice("Studio could not read that message.")
            return
        launch = await off_loop(
            run_edit,
            conversation_id=self.conversation_id,
            user=self.user,
            message_id=int(message_id),
            text=text,
        )
        await self.notice(launch.refusal, level="error" if launch.refusal else "none")

    async def notice(self, text: str, *, level: str = "error") -> None:
        await self.send(text_data=render.notice(text, level=level))

    # -- group events -----------------------------------------------------------------

    async def chat_fragment(self, event: dict) -> None:
        await self.send(text_data=event["html"])

    async def rule_hit(self, event: dict) -> None:
        """A rule of the member's was used: its count, where this tab shows that rule."""
        if event.get("conversation_id") in (0, self.conversation_id):
            await self.send(text_data=event["html"])

    async def approval_changed(self, event: dict) -> None:
        html = event["html"]
        if event.get("reason") == ToolApproval.Reason.ALWAYS_ALLOW:
            html += await off_loop(_settings, self.conversation_id)
        await self.send(text_data=html)

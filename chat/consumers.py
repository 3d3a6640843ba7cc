from __future__ import annotations

import json

from channels.generic.websocket import AsyncWebsocketConsumer

from approvals.models import ToolApproval
from approvals.notify import member_group
from chat import render
from chat.engine import run_launch, run_stop
from chat.limits import MAX_FRAME, MAX_MESSAGE
from chat.models import Conversation
from chat.services import session_digest
from studio.runtime import runtime
from studio.sessions import session_user
from studio.text import strip_nul

# Close codes the page understands (studio.js): it stops reconnecting and says why.
CLOSE_LOGGED_OUT = 4401
CLOSE_NOT_FOUND = 4404

SESSION_ENDED = "Your session has ended (logged out, or the account changed). Log in again."


def _conversation_for(conversation_id: int, user) -> Conversation | None:
    return Conversation.objects.owned_by(user).filter(pk=conversation_id).first()


def _settings(conversation_id: int) -> str:
    return render.settings_panel(Conversation.objects.get(pk=conversation_id), oob=True)


def _session_alive(session_key: str | None, user_id: int) -> bool:
    user = session_user(session_key)
    return user.is_authenticated and user.pk == user_id


async def off_loop(fn, *args, **kwargs):
    """Database work for a socket, on the runtime's pool (not the one sync thread)."""
    return await runtime().off_loop(fn, *args, **kwargs)


class ChatConsumer(AsyncWebsocketConsumer):
    """One browser tab on one conversation.

    It only forwards: the run's fragments arrive through the conversation's
    group (from any process); messages and Stop go to the run services.
    Every action first checks that the tab's session still logs its member
    in, so a tab left open after logging out (or after the account was
    deactivated or its password changed) can do nothing more.
    """

    conversation_id: int | None = None

    async def connect(self) -> None:
        # Refusals accept first and then close, so the page learns the code.
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.accept()
            await self.close(code=CLOSE_LOGGED_OUT)
            return
        await runtime().start()
        conversation_id = int(self.scope["url_route"]["kwargs"]["conversation_id"])
        conversation = await off_loop(_conversation_for, conversation_id, user)
        if conversation is None:
            await self.accept()
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.user = user
        self.conversation_id = conversation_id
        self.group = conversation.group_name
        self.member_group = member_group(user.pk)
        self.seq = 0
        runtime().inbox.on_layer_reset(self._rejoin)
        # Join before accepting, then catch up: whatever happened between the
        # page render and now is in the state we send.
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.channel_layer.group_add(self.member_group, self.channel_name)
        await self.accept()
        await self.send(text_data=await off_loop(render.catch_up, conversation))

    async def disconnect(self, code: int) -> None:
        # The run belongs to the conversation: leaving does not cancel it.
        if self.conversation_id is not None:
            runtime().inbox.off_layer_reset(self._rejoin)
            await self.channel_layer.group_discard(self.group, self.channel_name)
            await self.channel_layer.group_discard(self.member_group, self.channel_name)

    async def _rejoin(self) -> None:
        """Redis restarted and forgot our groups: join again and catch the tab up."""
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.channel_layer.group_add(self.member_group, self.channel_name)
        conversation = await off_loop(_conversation_for, self.conversation_id, self.user)
        if conversation is not None:
            await self.send(text_data=await off_loop(render.catch_up, conversation))

    async def _session_ended(self, *, ended: str = "") -> bool:
        """Close the socket, saying why, when its session no longer logs the member in."""
        session = self.scope.get("session")
        key = session.session_key if session is not None else None
        if not (ended and ended == session_digest(key)) and await off_loop(
            _session_alive, key, self.user.pk
        ):
            return False
        await self._notice(SESSION_ENDED)
        await self.close(code=CLOSE_LOGGED_OUT)
        return True

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if await self._session_ended():
            return
        if text_data is None:
            await self._notice("Studio only understands text messages.")
            return
        if len(text_data) > MAX_FRAME:
            await self._notice("That message is too large.")
            return
        try:
            data = json.loads(text_data)
        except (ValueError, RecursionError):
            # RecursionError: a deeply nested frame is still just unreadable.
            await self._notice("Studio could not read that message.")
            return
        if not isinstance(data, dict):
            await self._notice("Studio could not read that message.")
            return
        action = data.get("action", "send")
        if action == "stop":
            if not await off_loop(run_stop, conversation_id=self.conversation_id, user=self.user):
                await self._notice("Nothing is running.", level="info")
            return
        if action != "send":
            await self._notice("Unknown action.")
            return
        text = data.get("message")
        if not isinstance(text, str):
            await self._notice("Studio could not read that message.")
            return
        text = strip_nul(text)
        if len(text) > MAX_MESSAGE:
            await self._notice(f"Messages are limited to {MAX_MESSAGE:,} characters.")
            return
        launch = await off_loop(
            run_launch, conversation_id=self.conversation_id, user=self.user, text=text
        )
        self.seq += 1
        if launch.ok:
            await self.send(
                text_data=render.notice("", level="none")
                + render.composer_state("accepted", self.seq)
            )
        else:
            await self.send(
                text_data=render.notice(launch.refusal) + render.composer_state("refused", self.seq)
            )

    async def _notice(self, text: str, *, level: str = "error") -> None:
        await self.send(text_data=render.notice(text, level=level))

    # -- group events -----------------------------------------------------------------

    async def chat_fragment(self, event: dict) -> None:
        await self.send(text_data=event["html"])

    async def approval_changed(self, event: dict) -> None:
        html = event["html"]
        if event.get("reason") == ToolApproval.Reason.ALWAYS_ALLOW:
            html += await off_loop(_settings, self.conversation_id)
        await self.send(text_data=html)

    async def session_check(self, event: dict) -> None:
        """The member logged out or their account changed somewhere: re-check now."""
        await self._session_ended(ended=event.get("ended", ""))

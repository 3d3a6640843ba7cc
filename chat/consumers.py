from __future__ import annotations

import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from approvals.inbox import ensure_inbox, off_layer_reset, on_layer_reset
from chat import render
from chat.models import Conversation
from chat.runs import run_launch, run_stop

MAX_FRAME = 64 * 1024
MAX_MESSAGE = 20_000

REFUSALS = {
    "busy": "The server is busy right now: all agent workers are in use. "
    "Your message was not sent; please try again in a moment.",
    "running": "The agent is still working on your previous message. "
    "Wait for it to finish, or press Stop. Your message was not sent.",
    "empty": "Type a message first.",
    "gone": "This conversation no longer exists.",
}


@database_sync_to_async
def _conversation_for(conversation_id: int, user) -> Conversation | None:
    return Conversation.objects.owned_by(user).filter(pk=conversation_id).first()


@database_sync_to_async
def _catch_up(conversation: Conversation) -> str:
    return render.catch_up(conversation)


@database_sync_to_async
def _settings(conversation_id: int) -> str:
    return render.settings_panel(Conversation.objects.get(pk=conversation_id), oob=True)


@database_sync_to_async
def _stop(conversation_id: int, user) -> bool:
    return run_stop(conversation_id=conversation_id, user=user)


class ChatConsumer(AsyncWebsocketConsumer):
    """One browser tab on one conversation.

    It only forwards: the run's fragments arrive through the conversation's
    group (from any process); messages and Stop go to the run services.
    """

    conversation_id: int | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        try:
            conversation_id = int(self.scope["url_route"]["kwargs"]["conversation_id"])
        except (KeyError, TypeError, ValueError):
            await self.close(code=4404)
            return
        conversation = await _conversation_for(conversation_id, user)
        if conversation is None:
            await self.close(code=4404)
            return
        self.user = user
        self.conversation_id = conversation_id
        self.group = conversation.group_name
        self.seq = 0
        await ensure_inbox()
        on_layer_reset(self._rejoin)
        # Join before accepting, then catch up: whatever happened between the
        # page render and now is in the state we send.
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send(text_data=await _catch_up(conversation))

    async def disconnect(self, code: int) -> None:
        # The run belongs to the conversation: leaving does not cancel it.
        if self.conversation_id is not None:
            off_layer_reset(self._rejoin)
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def _rejoin(self) -> None:
        """Redis restarted and forgot our group: join again and catch the tab up."""
        await self.channel_layer.group_add(self.group, self.channel_name)
        conversation = await _conversation_for(self.conversation_id, self.user)
        if conversation is not None:
            await self.send(text_data=await _catch_up(conversation))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data is None:
            await self._notice("Studio only understands text messages.")
            return
        if len(text_data) > MAX_FRAME:
            await self._notice("That message is too large.")
            return
        try:
            data = json.loads(text_data)
        except ValueError:
            await self._notice("Studio could not read that message.")
            return
        if not isinstance(data, dict):
            await self._notice("Studio could not read that message.")
            return
        action = data.get("action", "send")
        if action == "stop":
            if not await _stop(self.conversation_id, self.user):
                await self._notice("Nothing is running.", level="info")
            return
        if action != "send":
            await self._notice("Unknown action.")
            return
        text = data.get("message")
        if not isinstance(text, str):
            await self._notice("Studio could not read that message.")
            return
        if len(text) > MAX_MESSAGE:
            await self._notice(f"Messages are limited to {MAX_MESSAGE:,} characters.")
            return
        launch = await run_launch(conversation_id=self.conversation_id, user=self.user, text=text)
        self.seq += 1
        if launch.ok:
            await self.send(
                text_data=render.notice("", level="none")
                + render.composer_state("accepted", self.seq)
            )
        else:
            await self.send(
                text_data=render.notice(REFUSALS[launch.reason])
                + render.composer_state("refused", self.seq)
            )

    async def _notice(self, text: str, *, level: str = "error") -> None:
        await self.send(text_data=render.notice(text, level=level))

    # -- group events -----------------------------------------------------------------

    async def chat_fragment(self, event: dict) -> None:
        await self.send(text_data=event["html"])

    async def approval_changed(self, event: dict) -> None:
        html = event["html"]
        if event.get("reason") == "always_allow":
            html += await _settings(self.conversation_id)
        await self.send(text_data=html)

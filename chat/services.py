"""Chat services: conversations, messages and runs."""

from __future__ import annotations

from chat.models import Conversation


def conversation_start(*, owner, title: str = "New chat") -> Conversation:
    return Conversation.objects.create(owner=owner, title=title[:200] or "New chat")

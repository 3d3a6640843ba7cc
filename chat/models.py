from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.urls import reverse

DEFAULT_TOOLS = ["python", "terminal", "web_fetch"]


def default_tools() -> list[str]:
    return list(DEFAULT_TOOLS)


class ConversationQuerySet(models.QuerySet):
    def owned_by(self, user) -> ConversationQuerySet:
        return self.filter(owner=user)


class Conversation(models.Model):
    """One chat between a member and the agent; everything hangs off it."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    title = models.CharField(max_length=200, default="New chat")
    confirm_tool_calls = models.BooleanField(
        default=True, help_text="Ask before every tool call (unless granted)."
    )
    enabled_tools = models.JSONField(default=default_tools, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ConversationQuerySet.as_manager()

    class Meta:
        ordering = ["-updated_at"]
        indexes = [
            # The index page: a member's conversations, newest first.
            models.Index(fields=["owner", "-updated_at"], name="conv_owner_updated"),
        ]

    def __str__(self) -> str:
        return f"{self.title} (#{self.pk})"

    def get_absolute_url(self) -> str:
        return reverse("chat:conversation", args=[self.pk])

    @property
    def group_name(self) -> str:
        # ASCII and well under the channel layer's 100-character limit.
        return f"conversation.{self.pk}"


class RunQuerySet(models.QuerySet):
    def running(self) -> RunQuerySet:
        return self.filter(status=Run.Status.RUNNING)


class Run(models.Model):
    """One agent run: a user message answered, with its tool calls.

    A row, not just a thread, so that "one run per conversation" holds across
    processes and so Stop can find the process that hosts the run.
    """

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        ERROR = "error", "Error"
        CANCELLED = "cancelled", "Cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="runs")
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    # The channel of the process that hosts the run (Stop is sent there).
    inbox = models.CharField(max_length=200, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            # One run at a time per conversation, enforced by the database so
            # two processes cannot both start one.
            models.UniqueConstraint(
                fields=["conversation"],
                condition=Q(status="running"),
                name="one_running_run_per_conversation",
            )
        ]

    def __str__(self) -> str:
        return f"run {self.id} ({self.status})"


class Message(models.Model):
    """One entry of the model's transcript; a run rebuilds it from these rows."""

    class Role(models.TextChoices):
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"
        TOOL = "tool", "Tool"
        ERROR = "error", "Error"

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    # Assistant turns: [{"id", "name", "arguments": {...}}, ...]
    tool_calls = models.JSONField(default=list, blank=True)
    # Tool results: the call they answer, and its approval row if one was made.
    tool_call_id = models.CharField(max_length=100, blank=True)
    tool_name = models.CharField(max_length=100, blank=True)
    tool_arguments = models.JSONField(default=dict, blank=True)
    # The public id of the call's approval row, if one was made. Not a foreign
    # key: purging old approvals must stay one DELETE, and a transcript
    # outlives its audit rows.
    approval_id = models.CharField(max_length=64, blank=True)
    # Tool results: the call did not work (the model reads "Error: ..." in content).
    is_error = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            # Transcript rebuild and page render: a conversation's messages in order.
            models.Index(fields=["conversation", "created_at", "id"], name="msg_conv_order"),
        ]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:40]}"

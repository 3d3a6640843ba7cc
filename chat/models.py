from __future__ import annotations

import shlex
import uuid
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.urls import reverse

DEFAULT_TOOLS = ["python", "terminal", "web_fetch"]


def default_tools() -> list[str]:
    return list(DEFAULT_TOOLS)


class LanguageModel(models.Model):
    """A model members may pick for a conversation: one model of an
    OpenAI-compatible server. The deployment's own (``LLM_BASE_URL``) is the
    default entry and needs no row."""

    name = models.CharField(
        "Name", max_length=60, unique=True, help_text="What members see: in the picker, on replies."
    )
    base_url = models.URLField(
        "Base URL",
        max_length=500,
        help_text="The server's OpenAI-compatible API root, e.g. http://127.0.0.1:8080/v1.",
    )
    model_id = models.CharField(
        "Model id",
        max_length=200,
        help_text="The model asked for. Fetch models lists the server's.",
    )
    # A secret: stored, never shown back (the admin form keeps it when left blank).
    api_key = models.CharField("API key", max_length=500, blank=True)
    enabled = models.BooleanField("Enabled", default=True)
    # What the server's /models answered last ("Fetch models" in the admin).
    available = models.JSONField("Models found", default=list, blank=True)
    fetched_at = models.DateTimeField("Fetched", null=True, blank=True)
    last_error = models.TextField("Last error", blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "model"
        verbose_name_plural = "models"

    def __str__(self) -> str:
        return self.name


class ConversationQuerySet(models.QuerySet):
    def owned_by(self, user) -> ConversationQuerySet:
        """The member's conversations they have not deleted (archived ones included);
        not the ones where an API token's calls wait (they are no chats)."""
        return self.filter(owner=user, deleted_at__isnull=True, for_api=False)

    def shared(self) -> ConversationQuerySet:
        """Conversations their members share read-only with the team (not deleted)."""
        return self.filter(shared_at__isnull=False, deleted_at__isnull=True)


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
    # MCP tools are on by default; these are the ones the member switched off.
    disabled_tools = models.JSONField(default=list, blank=True)
    # Stop or Restart was pressed: python sessions started before it are ended
    # (every process's reaper and every next call read it).
    python_reset_at = models.DateTimeField(null=True, blank=True)
    # Room uploads in flight (in any process) hold in the workspace's quota.
    upload_reserved_bytes = models.BigIntegerField(default=0)
    # The model its runs ask; blank: the deployment's default.
    model = models.ForeignKey(
        LanguageModel, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Out of the sidebar until shown again; it opens and answers as ever.
    archived_at = models.DateTimeField(null=True, blank=True)
    # Shared read-only with the team since then (None: the member's alone).
    shared_at = models.DateTimeField(null=True, blank=True)
    # Deleted by its member: its messages, runs and files are gone, and the row
    # stays only so that its approval rows keep their conversation (the audit
    # outlives the chat). ``purge_approvals`` removes it with its last row.
    deleted_at = models.DateTimeField(null=True, blank=True)
    # Where an API token's calls wait (approvals.ApiToken): no messages, no
    # runs, never in the sidebar; its rules are the token's.
    for_api = models.BooleanField(default=False, editable=False)

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

    @property
    def workspace(self) -> Path:
        """The directory its python and terminal calls work in (made on first use)."""
        return settings.STUDIO_WORKSPACE_ROOT / f"conversation-{self.pk}"


class RunQuerySet(models.QuerySet):
    def running(self) -> RunQuerySet:
        return self.filter(status=Run.Status.RUNNING)


class Run(models.Model):
    """One agent run: a user message answered, with its tool calls.

    A run is durable: everything it needs to go on is in rows (its messages,
    its calls' approval rows, this one). ``owner`` names the process stepping
    it now, and is blank while it waits for a decision: a waiting run belongs
    to no process, and any process may claim it (``chat.runs.state.run_claim``).
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
    # The channel of the process stepping the run (Stop is sent there); blank
    # while it waits.
    owner = models.CharField(max_length=200, blank=True)
    # Where the owner runs (``studio.process.identity``), written with it: a
    # process on the same host sees at once that it died, without waiting
    # for its heartbeat to go stale.
    owner_process = models.CharField(max_length=120, blank=True)
    # The approval id of the call it waits on, while it waits.
    waiting_on = models.CharField(max_length=64, blank=True)
    # Stop was pressed: whoever steps the run next ends it.
    stop_requested = models.BooleanField(default=False)
    # Times a process took the run over from one that stopped or died.
    resumes = models.PositiveIntegerField(default=0)
    # The claim number: every claim raises it. A step writes only while the
    # row still names its owner and its number (``chat.runs.state.run_fence``),
    # so an owner that paused past a takeover writes nothing more.
    claim = models.PositiveBigIntegerField(default=0)
    # Started by a process that steps no runs (a WSGI worker): the first
    # serving process to claim it starts it, as new, not as taken over.
    handed_over = models.BooleanField(default=False)
    # The channel of the process that stepped it last: its python session is
    # there, so a decision handed over by a process that steps no runs goes
    # there first.
    stepped_by = models.CharField(max_length=200, blank=True)
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
        indexes = [
            # The sweep: unfinished runs by owner and heartbeat (a dead owner),
            # and waiting runs by the call they wait on.
            models.Index(
                fields=["owner", "heartbeat_at"], condition=Q(status="running"), name="run_owner"
            ),
            models.Index(fields=["waiting_on"], condition=Q(status="running"), name="run_waiting"),
        ]

    def __str__(self) -> str:
        return f"run {self.id} ({self.status})"

    @property
    def state(self) -> str:
        """working, waiting (for a decision) or ready (to be claimed), or how it ended."""
        if self.status != self.Status.RUNNING:
            return self.status
        if self.owner:
            return "working"
        return "waiting" if self.waiting_on else "ready"


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
    # A tool result cut short by Stop: who pressed it (the chat shows it, not the error).
    stopped_by = models.CharField(max_length=150, blank=True)
    # Tool results: images the call made, shown under its output
    # ([{"name", "size", "mime", "shown"}], names relative to the workspace).
    attachments = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Replaced by an edit or a regenerate from this point: the page shows it
    # folded as an earlier version; the model never reads it again. One fork
    # gives all it replaced the same time.
    superseded_at = models.DateTimeField(null=True, blank=True)
    # Assistant turns: the model that wrote it, by the name members know it by.
    model_name = models.CharField(max_length=60, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            # Transcript rebuild and page render: a conversation's messages in order.
            models.Index(fields=["conversation", "created_at", "id"], name="msg_conv_order"),
        ]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:40]}"


_KEY = r"^[A-Za-z_][A-Za-z0-9_.-]*$"


def parse_pairs(text: str, *, what: str) -> dict[str, str]:
    """``KEY=value`` lines (blank lines and ``#`` comments ignored)."""
    import re

    pairs = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not re.match(_KEY, key):
            raise ValidationError(f"{what}, line {number}: write KEY=value.")
        pairs[key] = value.strip()
    return pairs


class McpServer(models.Model):
    """An MCP server whose tools the agent may call (each call gated like a built-in)."""

    name = models.CharField(
        "Name",
        max_length=30,
        unique=True,
        validators=[RegexValidator(r"^[A-Za-z0-9-]+$", "Letters, digits and '-' only.")],
        # Plain words: the admin shows help text as HTML, where "<name>" vanished.
        help_text="Its tools are offered as NAME__TOOL: this name, two underscores, the tool.",
    )
    command = models.CharField(
        "Command",
        max_length=1000,
        blank=True,
        help_text="A stdio server: one command line, split as a shell would (no shell runs).",
    )
    url = models.URLField(
        "URL", max_length=500, blank=True, help_text="A streamable-HTTP server's endpoint."
    )
    environment = models.TextField(
        "Environment", blank=True, help_text="Extra variables for Command: KEY=value lines."
    )
    headers = models.TextField(
        "Headers", blank=True, help_text="Extra HTTP headers for URL: Name=value lines."
    )
    network = models.BooleanField(
        "May reach the network",
        default=False,
        help_text="A Command server runs sandboxed; tick to let it reach the network.",
    )
    enabled = models.BooleanField("Enabled", default=True)
    # What this deployment last learned about it (any process may write).
    last_connected_at = models.DateTimeField("Last connected", null=True, blank=True)
    last_error = models.TextField("Last error", blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    tools = models.JSONField("Tools found", default=list, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"
        verbose_name_plural = "MCP servers"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if bool(self.command.strip()) == bool(self.url.strip()):
            raise ValidationError("Give exactly one of Command (stdio) or URL (streamable HTTP).")
        if self.command.strip():
            try:
                if not shlex.split(self.command):
                    raise ValueError("empty")
            except ValueError as exc:
                raise ValidationError({"command": f"Not a command line: {exc}."}) from None
        parse_pairs(self.environment, what="Environment")
        parse_pairs(self.headers, what="Headers")

    @property
    def available(self) -> bool | None:
        """True / False after the last connection attempt; None before any."""
        if self.last_connected_at is None and self.last_error_at is None:
            return None
        if self.last_error_at is None:
            return True
        return self.last_connected_at is not None and self.last_connected_at > self.last_error_at

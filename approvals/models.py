from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from approvals.patterns import glob_match
from studio.db import one_or_none
from studio.text import canonical_json


def new_approval_id() -> str:
    """128 bits from the OS's CSPRNG, URL-safe: unguessable and unenumerable."""
    return secrets.token_urlsafe(16)


def arguments_hash(arguments: object) -> str:
    return hashlib.sha256(canonical_json(arguments).encode()).hexdigest()


REVIEW_PERMISSION = "approvals.review_toolapproval"
# What a row keeps of a tool's output (the size and hash cover all of it).
OUTPUT_SUMMARY_BYTES = 64 * 1024


def can_review(user) -> bool:
    """Holds "Can review approvals" (given through groups in the admin, or to the member).

    One query, kept on the user object for its request or socket: Django's
    ``has_perm`` reads every permission the member has, through two queries,
    to answer for this one (a tab opening asks twice).
    """
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    if user.is_superuser:
        return True
    known = getattr(user, "studio_can_review", None)
    if known is None:
        from django.contrib.auth.models import Permission

        app_label, codename = REVIEW_PERMISSION.split(".")
        known = (
            Permission.objects.filter(content_type__app_label=app_label, codename=codename)
            .filter(Q(user=user) | Q(group__user=user))
            .exists()
        )
        user.studio_can_review = known
    return known


@dataclass(frozen=True)
class Rights:
    """What one member may do with one pending card, and why not when they may not allow."""

    allow: bool  # Allow, and Allow with edits
    always: bool  # Always allow (makes a rule in the member's chat)
    deny: bool
    as_reviewer: bool = False
    refusal: str = ""


NOT_YOURS = "This call waits for a reviewer: you can deny it or stop the run."
OWN_CALL = "You cannot approve a call you requested yourself."


class ApprovalQuerySet(models.QuerySet):
    def pending(self) -> ApprovalQuerySet:
        return self.filter(status=ToolApproval.Status.PENDING)

    def decided(self) -> ApprovalQuerySet:
        return self.exclude(status=ToolApproval.Status.PENDING)

    def stale(self, *, before: datetime) -> ApprovalQuerySet:
        """Pending rows requested before ``before``: no waiter can still be alive."""
        return self.pending().filter(requested_at__lt=before)

    def decided_before(self, *, before: datetime) -> ApprovalQuerySet:
        return self.decided().filter(decided_at__lt=before)


class ApprovalManager(models.Manager.from_queryset(ApprovalQuerySet)):
    def by_approval_id(self, approval_id: str) -> ToolApproval | None:
        """The row with its conversation, or None: every decision's and wake's first read."""
        return one_or_none(self.select_related("conversation").filter(approval_id=approval_id))


class ToolApproval(models.Model):
    """The audit row of one tool call that asked for (or skipped) a human decision."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        ALLOWED = "allowed", "Allowed"
        DENIED = "denied", "Denied"

    class Reason(models.TextChoices):
        # A person decided.
        USER = "user", "Decided by a person"
        EDITED = "edited", "Allowed with edits"
        ALWAYS_ALLOW = "always_allow", "Allowed, and made a rule"
        # It ran or was blocked without asking anyone.
        RULE = "rule", "A rule"
        CONFIRM_OFF = "confirm_off", "Confirmation switched off by the member"
        POLICY = "policy", "Admin policy (STUDIO_AUTO_ALLOW_TOOLS)"
        # Nobody decided.
        TIMEOUT = "timeout", "Timed out"
        CANCELLED = "cancelled", "Cancelled"
        EXPIRED = "expired", "Expired"

    approval_id = models.CharField(
        max_length=64, unique=True, default=new_approval_id, editable=False
    )
    conversation = models.ForeignKey(
        "chat.Conversation", on_delete=models.CASCADE, related_name="approvals"
    )
    run_id = models.CharField(max_length=64, blank=True, db_index=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    tool_name = models.CharField(max_length=100)
    # What the tool's server says about it ("read-only", "destructive", ...),
    # as shown on the card when the call was requested. Hints, never trusted.
    tool_hints = models.JSONField(default=list, blank=True)
    tool_call_id = models.CharField(max_length=100, blank=True)
    # The tool's parameter schema as the model was given it (edits are checked
    # against it, and the audit keeps what the call was allowed to look like).
    tool_schema = models.JSONField(default=dict, blank=True)
    # The model's arguments, as asked for, and their hash.
    arguments = models.JSONField(default=dict, blank=True)
    arguments_sha256 = models.CharField(max_length=64)
    # What rules match against: the command, the URL, the code, or the
    # arguments as canonical JSON.
    subject = models.TextField(blank=True)
    # "Allowed with edits": the arguments that ran instead, and their hash.
    approved_arguments = models.JSONField(null=True, blank=True)
    approved_sha256 = models.CharField(max_length=64, blank=True)
    # The rule that decided it (or that an "Always allow" created), and a copy
    # of it: deleting the rule keeps the history.
    rule = models.ForeignKey(
        "approvals.ToolRule", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    rule_snapshot = models.JSONField(null=True, blank=True)
    # A Review rule matched: only a reviewer other than the requester may
    # allow it (the member may still deny it or stop the run).
    needs_review = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    reason = models.CharField(max_length=16, choices=Reason.choices, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    note = models.TextField(blank=True)
    requested_at = models.DateTimeField(default=timezone.now)
    decided_at = models.DateTimeField(null=True, blank=True)
    # A pending call left undecided until then ends as a timeout.
    expires_at = models.DateTimeField(null=True, blank=True)
    # When an allowed call began to run: set once, before it starts, so a
    # call found started with no result after a crash is never run again.
    started_at = models.DateTimeField(null=True, blank=True)
    # A call of a tool that keeps state between calls (the chat's python
    # session): allowed to run in a fresh interpreter instead, and the kept
    # interpreter it ran in (blank: one of its own).
    fresh_interpreter = models.BooleanField(default=False)
    interpreter_session = models.CharField(max_length=32, blank=True)

    class RunOutcome(models.TextChoices):
        """How an allowed call's run ended: a stop is neither a crash nor a timeout."""

        OK = "ok", "Ran"
        FAILED = "failed", "Ran and failed"
        STOPPED = "stopped", "Stopped by the member"
        INTERRUPTED = "interrupted", "Interrupted (the server stopped)"

    run_outcome = models.CharField(max_length=16, choices=RunOutcome.choices, blank=True)
    # STUDIO_APPROVAL_WEBHOOK_URL: when a process claimed the one POST for this
    # row (a conditional update: one claim across processes), and how it went.
    webhook_at = models.DateTimeField(null=True, blank=True)
    webhook_result = models.CharField(max_length=200, blank=True)
    # The audit's depth: how long the decision and the run took, what the
    # tool gave back (its first OUTPUT_SUMMARY_BYTES, its whole size and
    # hash), and where the decision came from: address, browser, and the
    # request's id, which its log lines carry too.
    decision_seconds = models.FloatField(null=True, blank=True)
    run_seconds = models.FloatField(null=True, blank=True)
    output_summary = models.TextField(blank=True)
    output_size = models.BigIntegerField(null=True, blank=True)
    output_sha256 = models.CharField(max_length=64, blank=True)
    decided_ip = models.GenericIPAddressField(null=True, blank=True)
    decided_user_agent = models.CharField(max_length=300, blank=True)
    decided_request_id = models.CharField(max_length=100, blank=True)

    class Source(models.TextChoices):
        CHAT = "chat", "Chat"
        API = "api", "API"

    # Where the call was asked: the chat's agent, or an agent outside Studio
    # through /api/v1/ with a member's token (kept if the token is deleted).
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.CHAT)
    api_token = models.ForeignKey(
        "approvals.ApiToken", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # An API request's own words: its title, a link to where it comes from,
    # and the key that makes a retried request answer with the same row.
    title = models.CharField(max_length=200, blank=True)
    context_url = models.URLField(max_length=2000, blank=True)
    idempotency_key = models.CharField(max_length=100, blank=True)
    # Where to POST the decision when it comes (approvals/callbacks.py): when a
    # process claimed that POST (one claim across processes), and how it went.
    callback_url = models.URLField(max_length=2000, blank=True)
    callback_at = models.DateTimeField(null=True, blank=True)
    callback_result = models.CharField(max_length=200, blank=True)

    objects = ApprovalManager()

    class Meta:
        ordering = ["-requested_at"]
        permissions = [("review_toolapproval", "Can review approvals")]
        indexes = [
            # Admin changelist: ORDER BY requested_at DESC, filtered by status.
            models.Index(fields=["status", "-requested_at"], name="appr_status_requested"),
            # Admin changelist without filters / date_hierarchy on requested_at.
            models.Index(fields=["-requested_at"], name="appr_requested"),
            # purge_approvals delete: decided rows WHERE decided_at < cutoff.
            models.Index(
                fields=["decided_at"], condition=~Q(status="pending"), name="appr_decided_purge"
            ),
            # Page render and WebSocket catch-up: a conversation's cards.
            models.Index(fields=["conversation", "status"], name="appr_conv_status"),
            # The sweep: pending calls whose time is up.
            models.Index(
                fields=["expires_at"], condition=Q(status="pending"), name="appr_pending_expiry"
            ),
        ]
        constraints = [
            # A retried API request finds its first row; two at once make one.
            models.UniqueConstraint(
                fields=["api_token", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="appr_one_per_idempotency_key",
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} [{self.status}] {self.approval_id[:8]}…"

    def save(self, *args, **kwargs) -> None:
        if not self.arguments_sha256:
            self.arguments_sha256 = arguments_hash(self.arguments)
        super().save(*args, **kwargs)

    @property
    def is_pending(self) -> bool:
        return self.status == self.Status.PENDING

    @property
    def is_allowed(self) -> bool:
        return self.status == self.Status.ALLOWED

    @property
    def arguments_to_run(self) -> dict:
        """What runs: the edited arguments when a person edited them, else the model's."""
        return self.arguments if self.approved_arguments is None else self.approved_arguments

    @property
    def was_edited(self) -> bool:
        return self.approved_arguments is not None

    def arguments_intact(self) -> bool:
        """True when what would run still hashes to what was asked for (or approved).

        The run executes the row's arguments, not its own copy; the hash makes
        sure nothing rewrote them between the request (or the edit) and the run.
        """
        if self.approved_arguments is not None:
            return arguments_hash(self.approved_arguments) == self.approved_sha256
        return arguments_hash(self.arguments) == self.arguments_sha256

    @property
    def wait_seconds(self) -> float | None:
        if self.decided_at is None:
            return None
        return (self.decided_at - self.requested_at).total_seconds()

    @property
    def status_label(self) -> str:
        """What the card says: a timeout or a cancel is not a person's deny,
        and a rule, the member's switch and the admin's policy are told apart."""
        if self.status == self.Status.PENDING:
            return "Waiting for a reviewer" if self.needs_review else "Waiting for your decision"
        if self.reason in ENDED_REASONS:
            return self.get_reason_display()
        if self.status == self.Status.ALLOWED:
            return {
                self.Reason.EDITED: "Allowed with edits",
                self.Reason.ALWAYS_ALLOW: "Allowed (always)",
                self.Reason.RULE: "Allowed by a rule",
                self.Reason.CONFIRM_OFF: "Ran without asking (confirmation off)",
                self.Reason.POLICY: "Allowed by admin policy",
            }.get(self.reason, "Allowed")
        if self.reason == self.Reason.RULE:
            return "Blocked by a rule"
        return "Denied"

    def rights(self, user=None) -> Rights:
        """What ``user`` (None: the conversation's owner) may decide on this call.

        Ordinary calls: the owner decides. A call that waits for a reviewer:
        any reviewer but its requester may allow it; the owner may only deny.
        Someone who may not even see the row gets no rights at all.
        """
        owner_id = self.conversation.owner_id
        is_owner = user is None or user.pk == owner_id
        if not self.needs_review:
            return Rights(allow=is_owner, always=is_owner, deny=is_owner)
        requester = self.requested_by_id or owner_id
        if user is not None and user.pk != requester and can_review(user):
            return Rights(allow=True, always=False, deny=True, as_reviewer=True)
        reviewer = user is not None and can_review(user)
        return Rights(
            allow=False, always=False, deny=is_owner, refusal=OWN_CALL if reviewer else NOT_YOURS
        )

    def api_answer(self) -> dict:
        """What the API (and a callback) says of the row: its status, who decided and
        why, what may run."""
        decided = not self.is_pending
        return {
            "id": self.approval_id,
            "tool": self.tool_name,
            "title": self.title,
            "status": self.status,
            "reason": self.reason,
            "reason_label": self.status_label,
            "needs_review": self.needs_review,
            "requested_at": self.requested_at.isoformat(),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "decided_at": self.decided_at.isoformat() if decided and self.decided_at else None,
            "decided_by": self.decided_by.get_username() if self.decided_by_id else None,
            "note": self.note,
            "arguments": self.arguments,
            "arguments_sha256": self.arguments_sha256,
            # What may run: the edited arguments when a person edited them.
            "approved_arguments": self.arguments_to_run if self.is_allowed else None,
            "approved_sha256": (self.approved_sha256 or self.arguments_sha256)
            if self.is_allowed
            else None,
            "edited": self.was_edited,
            "rule": self.rule_snapshot,
            "result_recorded": bool(self.run_outcome),
        }

    @property
    def reviewed_by(self):
        """Who decided a call that waited for a reviewer (None if the member did)."""
        if self.needs_review and self.decided_by_id not in (None, self.requested_by_id):
            return self.decided_by
        return None


# A call that ended without anyone's decision: recorded as denied, never a deny.
ENDED_REASONS = (
    ToolApproval.Reason.TIMEOUT,
    ToolApproval.Reason.CANCELLED,
    ToolApproval.Reason.EXPIRED,
)


class RuleQuerySet(models.QuerySet):
    def active(self) -> RuleQuerySet:
        return self.filter(revoked_at__isnull=True)

    def applying_to(self, conversation) -> RuleQuerySet:
        """Rules for everyone, for the conversation's member, and for the conversation."""
        return self.applying_in(conversation.owner_id, conversation.pk)

    def applying_in(self, owner_id: int, conversation_id: int) -> RuleQuerySet:
        return self.active().filter(
            Q(scope=ToolRule.Scope.EVERYONE)
            | Q(scope=ToolRule.Scope.MEMBER, member_id=owner_id)
            | Q(scope=ToolRule.Scope.CONVERSATION, conversation_id=conversation_id)
        )


class ToolRule(models.Model):
    """For Tool, when a call matches Pattern, the Action is Allow, Ask, Review or Deny.

    Patterns are shell-style globs (``git status*``, ``https://docs.python.org/*``)
    matched against the call's subject: the command line (terminal), the URL
    (web_fetch), the code (python), the arguments as canonical JSON (any other
    tool). An empty pattern matches every call of the tool.
    """

    class Action(models.TextChoices):
        ALLOW = "allow", "Allow"
        ASK = "ask", "Ask"
        REVIEW = "review", "Review (a reviewer decides)"
        DENY = "deny", "Deny"

    class Scope(models.TextChoices):
        EVERYONE = "everyone", "Everyone"
        MEMBER = "member", "One member (all their chats)"
        CONVERSATION = "conversation", "One conversation"

    tool = models.CharField("Tool", max_length=100, help_text="A tool's name, or * for any tool.")
    pattern = models.CharField(
        "Pattern",
        max_length=1000,
        blank=True,
        help_text="A shell-style glob over the call (command line, URL, code, or the "
        "arguments as JSON); empty matches every call.",
    )
    action = models.CharField("Action", max_length=16, choices=Action.choices)
    scope = models.CharField(max_length=16, choices=Scope.choices, default=Scope.EVERYONE)
    member = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    conversation = models.ForeignKey(
        "chat.Conversation", on_delete=models.CASCADE, null=True, blank=True, related_name="rules"
    )
    note = models.CharField(
        "Note", max_length=500, blank=True, help_text="Said to the model when it blocks a call."
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    hits = models.PositiveIntegerField(default=0)
    last_hit_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = RuleQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "tool rule"
        indexes = [
            # Every gated call: the active rules of a conversation and its member.
            models.Index(fields=["scope", "conversation"], name="rule_scope_conv"),
            models.Index(fields=["scope", "member"], name="rule_scope_member"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(scope="everyone", member__isnull=True, conversation__isnull=True)
                | Q(scope="member", member__isnull=False, conversation__isnull=True)
                | Q(scope="conversation", conversation__isnull=False),
                name="rule_scope_has_its_target",
            )
        ]

    def __str__(self) -> str:
        pattern = f" {self.pattern!r}" if self.pattern else ""
        return f"{self.get_action_display()} {self.tool}{pattern} ({self.get_scope_display()})"

    def matches(self, tool_name: str, subject: str) -> bool:
        if self.tool not in ("*", tool_name):
            return False
        return not self.pattern or glob_match(subject, self.pattern)

    def snapshot(self) -> dict:
        """What the audit row keeps of the rule, should the rule go."""
        return {
            "id": self.pk,
            "tool": self.tool,
            "pattern": self.pattern,
            "action": self.action,
            "scope": self.scope,
            "note": self.note,
        }


class ApiToken(models.Model):
    """A member's key for an agent outside the chat: it requests approvals, nothing else.

    Shown once when made (``studio_<lookup>_<secret>``); Studio keeps the
    lookup to find it and the secret's SHA-256 to check it (a random 256-bit
    secret needs no slow hash). Its calls wait in a conversation of its own
    (``conversation``, out of the sidebar), so the member's rules, the
    "Always allow" of its cards and the audit work on them as on chat calls.
    """

    PREFIX = "studio_"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=80)
    lookup = models.CharField(max_length=16, unique=True, editable=False)
    secret_sha256 = models.CharField(max_length=64, editable=False)
    conversation = models.OneToOneField(
        "chat.Conversation", on_delete=models.RESTRICT, related_name="api_token", editable=False
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    uses = models.PositiveIntegerField(default=0, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.PREFIX}{self.lookup}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @staticmethod
    def secret_hash(secret: str) -> str:
        return hashlib.sha256(secret.encode()).hexdigest()


class InboxPreference(models.Model):
    """A member's choices about their approvals inbox (stored, so every browser agrees)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="inbox_preference"
    )
    # Browser notifications for new cards while the page is hidden (opt-in).
    notify = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"inbox preferences of {self.user}"


class ProviderIdentity(models.Model):
    """Who a member is at the team's OpenID Connect provider: its issuer and
    subject, which never change, link the account (approvals/signin.py)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="provider_identity"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    linked_at = models.DateTimeField(auto_now_add=True)
    # The provider's groups at the last sign-in, as its claim said (for the admin).
    groups = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="one_account_per_identity")
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"


def signed_in_as(user) -> str:
    """Who ``user`` is at the sign-in provider ("subject at issuer"), or "" for a local account."""
    if user is None:
        return ""
    try:
        identity = user.provider_identity
    except ProviderIdentity.DoesNotExist:
        return ""
    return str(identity)

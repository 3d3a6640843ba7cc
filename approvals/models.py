from __future__ import annotations

import hashlib
import json
import secrets
from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


def new_approval_id() -> str:
    """128 bits from the OS's CSPRNG, URL-safe: unguessable and unenumerable."""
    return secrets.token_urlsafe(16)


def canonical_json(arguments: object) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def arguments_hash(arguments: object) -> str:
    return hashlib.sha256(canonical_json(arguments).encode()).hexdigest()


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


class ToolApproval(models.Model):
    """The audit row of one tool call that asked for (or skipped) a human decision."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        ALLOWED = "allowed", "Allowed"
        DENIED = "denied", "Denied"

    class Reason(models.TextChoices):
        USER = "user", "User decision"
        ALWAYS_ALLOW = "always_allow", "Always-allow grant"
        POLICY = "policy", "Admin policy"
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
    arguments = models.JSONField(default=dict, blank=True)
    arguments_sha256 = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    reason = models.CharField(max_length=16, choices=Reason.choices, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    note = models.TextField(blank=True)
    requested_at = models.DateTimeField(default=timezone.now)
    decided_at = models.DateTimeField(null=True, blank=True)
    # The channel-layer inbox of the process whose run waits on this row;
    # a decision made in another process is sent there.
    waiter_inbox = models.CharField(max_length=200, blank=True)

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        ordering = ["-requested_at"]
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

    def arguments_intact(self) -> bool:
        """True when the stored arguments still hash to what was asked for.

        The run executes the row's arguments, not its own copy; the hash makes
        sure nothing rewrote them between the request and the decision.
        """
        return arguments_hash(self.arguments) == self.arguments_sha256

    @property
    def wait_seconds(self) -> float | None:
        if self.decided_at is None:
            return None
        return (self.decided_at - self.requested_at).total_seconds()

    @property
    def status_label(self) -> str:
        """What the card says: a timeout or a cancel is not a user's deny."""
        if self.status == self.Status.PENDING:
            return "Waiting for your decision"
        if self.reason in (self.Reason.TIMEOUT, self.Reason.CANCELLED, self.Reason.EXPIRED):
            return self.get_reason_display()
        if self.status == self.Status.ALLOWED:
            if self.reason == self.Reason.ALWAYS_ALLOW:
                return "Allowed (always allow)"
            if self.reason == self.Reason.POLICY:
                return "Allowed by policy"
            return "Allowed"
        return "Denied"


class ToolGrantQuerySet(models.QuerySet):
    def active(self) -> ToolGrantQuerySet:
        return self.filter(revoked_at__isnull=True)


class ToolGrant(models.Model):
    """ "Always allow": one tool in one conversation, until revoked."""

    conversation = models.ForeignKey(
        "chat.Conversation", on_delete=models.CASCADE, related_name="grants"
    )
    tool_name = models.CharField(max_length=100)
    granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    granted_at = models.DateTimeField(default=timezone.now)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ToolGrantQuerySet.as_manager()

    class Meta:
        ordering = ["-granted_at"]
        constraints = [
            # At most one live grant per tool and conversation; the gate's
            # "is this tool granted here?" lookup uses this index too.
            models.UniqueConstraint(
                fields=["conversation", "tool_name"],
                condition=Q(revoked_at__isnull=True),
                name="one_active_grant_per_tool",
            )
        ]

    def __str__(self) -> str:
        state = "revoked" if self.revoked_at else "active"
        return f"always allow {self.tool_name} in #{self.conversation_id} ({state})"

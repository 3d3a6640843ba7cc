from __future__ import annotations

import csv
import json

from django import forms
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html

from approvals.models import ToolApproval, ToolRule
from approvals.services import policy_rules
from approvals.templatetags.approvals_tags import edit_diff

CSV_FIELDS = [
    "approval_id",
    "requested_at",
    "conversation_id",
    "conversation_title",
    "requested_by",
    "tool_name",
    "arguments",
    "arguments_sha256",
    "status",
    "reason",
    "decided_by",
    "decided_at",
    "wait_seconds",
    "note",
    "run_id",
    "approved_arguments",
    "approved_sha256",
    "rule_id",
    "rule",
    "needs_review",
    "reviewed_by",
]


@admin.action(description="Export selected approvals as CSV")
def export_csv(modeladmin, request: HttpRequest, queryset) -> HttpResponse:
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="tool-approvals-{stamp}.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_FIELDS)
    rows = queryset.select_related("conversation", "requested_by", "decided_by").order_by(
        "requested_at"
    )
    for a in rows.iterator():
        cells = [
            a.approval_id,
            a.requested_at.isoformat(),
            a.conversation_id,
            a.conversation.title,
            a.requested_by.get_username() if a.requested_by else "",
            a.tool_name,
            json.dumps(a.arguments, ensure_ascii=False),
            a.arguments_sha256,
            a.status,
            a.reason,
            a.decided_by.get_username() if a.decided_by else "",
            a.decided_at.isoformat() if a.decided_at else "",
            "" if a.wait_seconds is None else f"{a.wait_seconds:.3f}",
            a.note,
            a.run_id,
            ""
            if a.approved_arguments is None
            else json.dumps(a.approved_arguments, ensure_ascii=False),
            a.approved_sha256,
            a.rule_id or "",
            rule_text(a.rule_snapshot),
            "yes" if a.needs_review else "",
            a.reviewed_by.get_username() if a.reviewed_by else "",
        ]
        writer.writerow([csv_safe(str(cell)) for cell in cells])
    return response


def rule_text(snapshot: dict | None) -> str:
    """A rule as the audit keeps it: ``deny terminal "rm -rf*" (everyone) — note``."""
    if not snapshot:
        return ""
    pattern = f' "{snapshot["pattern"]}"' if snapshot.get("pattern") else ""
    note = f" — {snapshot['note']}" if snapshot.get("note") else ""
    return f"{snapshot['action']} {snapshot['tool']}{pattern} ({snapshot['scope']}){note}"


def csv_safe(value: str) -> str:
    """Every cell, ids and usernames too: these first characters run as formulas."""
    if value and value[0] in "=+-@\t\r":
        return "'" + value
    return value


@admin.register(ToolApproval)
class ToolApprovalAdmin(admin.ModelAdmin):
    list_display = [
        "requested_at",
        "conversation",
        "requested_by",
        "tool_name",
        "status",
        "reason",
        "decided_by",
        "reviewer",
        "decided_at",
        "wait_time",
    ]
    list_filter = ["status", "reason", "needs_review", "tool_name", "requested_at"]
    search_fields = [
        "tool_name",
        "arguments",
        "approval_id",
        "requested_by__username",
        "decided_by__username",
        "conversation__title",
    ]
    date_hierarchy = "requested_at"
    list_select_related = ["conversation", "requested_by", "decided_by"]
    actions = [export_csv]
    readonly_fields = ["why", "reviewer", "edits", *(f.name for f in ToolApproval._meta.fields)]
    show_full_result_count = False

    @admin.display(description="reviewed by")
    def reviewer(self, obj: ToolApproval) -> str:
        reviewer = obj.reviewed_by
        if reviewer is not None:
            return reviewer.get_username()
        return "waiting" if obj.needs_review and obj.is_pending else "—"

    @admin.display(description="why")
    def why(self, obj: ToolApproval) -> str:
        rule = rule_text(obj.rule_snapshot)
        return f"{obj.status_label}" + (f" · rule: {rule}" if rule else "")

    @admin.display(description="edits")
    def edits(self, obj: ToolApproval) -> str:
        if not obj.was_edited:
            return "—"
        lines = "\n".join(line["text"] for line in edit_diff(obj))
        return format_html('<pre class="edit-diff">{}</pre>', lines)

    @admin.display(description="wait")
    def wait_time(self, obj: ToolApproval) -> str:
        seconds = obj.wait_seconds
        if seconds is None:
            return "—"
        if seconds < 60:
            return f"{seconds:.1f} s"
        if seconds < 3600:
            return f"{seconds / 60:.1f} min"
        return f"{seconds / 3600:.1f} h"

    # Audit rows are written by the gate only.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return request.user.is_superuser


class ToolRuleForm(forms.ModelForm):
    class Meta:
        model = ToolRule
        fields = ["tool", "pattern", "action", "note", "scope", "member", "conversation"]

    def clean(self):
        data = super().clean()
        scope = data.get("scope")
        if scope == ToolRule.Scope.EVERYONE and (data.get("member") or data.get("conversation")):
            raise forms.ValidationError("A rule for everyone names no member or conversation.")
        if scope == ToolRule.Scope.MEMBER and (not data.get("member") or data.get("conversation")):
            raise forms.ValidationError("A member's rule names the member (and no conversation).")
        if scope == ToolRule.Scope.CONVERSATION and not data.get("conversation"):
            raise forms.ValidationError("A conversation's rule names the conversation.")
        return data


@admin.register(ToolRule)
class ToolRuleAdmin(admin.ModelAdmin):
    """Tool rules: for Tool, when a call matches Pattern, the Action.

    Precedence: any matching Deny, then Review, then Ask, then Allow, then
    the conversation's Confirm switch. Members' own rules are listed too.
    """

    form = ToolRuleForm
    list_display = ["tool", "pattern", "action", "scope", "member", "hits", "last_hit_at", "active"]
    list_filter = ["action", "scope", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["tool", "pattern", "note", "member__username"]
    list_select_related = ["member", "conversation"]
    raw_id_fields = ["member", "conversation"]
    readonly_fields = [
        "hits",
        "last_hit_at",
        "created_by",
        "created_at",
        "revoked_by",
        "revoked_at",
    ]
    actions = ["revoke"]

    @admin.display(boolean=True, description="active")
    def active(self, obj: ToolRule) -> bool:
        return obj.revoked_at is None

    @admin.action(description="Revoke the selected rules")
    def revoke(self, request: HttpRequest, queryset) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_by=request.user
        )
        self.message_user(request, f"Revoked {count} rule(s).")

    def changelist_view(self, request: HttpRequest, extra_context=None):
        # STUDIO_AUTO_ALLOW_TOOLS: Allow rules for everyone that live in the
        # environment, not in this table (so they cannot be edited here).
        tools = [rule.tool for rule in policy_rules()]
        if tools and request.method == "GET":
            self.message_user(
                request,
                "Also allowed for everyone by STUDIO_AUTO_ALLOW_TOOLS (read-only): "
                + ", ".join(tools),
            )
        return super().changelist_view(request, extra_context)

    def save_model(self, request, obj: ToolRule, form, change: bool) -> None:
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)

from __future__ import annotations

import csv
import json

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from approvals.models import ToolApproval, ToolGrant

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
        ]
        writer.writerow([csv_safe(str(cell)) for cell in cells])
    return response


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
        "decided_at",
        "wait_time",
    ]
    list_filter = ["status", "reason", "tool_name", "requested_at"]
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
    readonly_fields = [f.name for f in ToolApproval._meta.fields]
    show_full_result_count = False

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


@admin.register(ToolGrant)
class ToolGrantAdmin(admin.ModelAdmin):
    list_display = [
        "conversation",
        "tool_name",
        "granted_by",
        "granted_at",
        "revoked_by",
        "revoked_at",
    ]
    list_filter = ["tool_name", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["tool_name", "conversation__title", "granted_by__username"]
    list_select_related = ["conversation", "granted_by", "revoked_by"]
    readonly_fields = [
        "conversation",
        "tool_name",
        "granted_by",
        "granted_at",
        "revoked_by",
        "revoked_at",
    ]
    date_hierarchy = "granted_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

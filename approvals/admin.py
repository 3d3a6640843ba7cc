from __future__ import annotations

import csv
import json

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.html import format_html

from approvals.dashboard import OUTCOMES, PERIODS, charts, dashboard_data
from approvals.export import jsonl_line
from approvals.models import (
    ENDED_REASONS,
    ApiToken,
    ProviderIdentity,
    ToolApproval,
    ToolRule,
    signed_in_as,
)
from approvals.services.api import token_create, token_revoke
from approvals.services.rules import policy_rules, tool_names
from approvals.templatetags.approvals_tags import edit_diff
from studio.text import canonical_json, short

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
    "decision_seconds",
    "run_seconds",
    "run_outcome",
    "fresh_interpreter",
    "interpreter_session",
    "output_size",
    "output_sha256",
    "decided_ip",
    "decided_user_agent",
    "decided_request_id",
    "decided_by_identity",
    "source",
    "api_token",
    "title",
    "context_url",
]


@admin.action(description="Export selected approvals as CSV")
def export_csv(modeladmin, request: HttpRequest, queryset) -> HttpResponse:
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="tool-approvals-{stamp}.csv"'
    writer = csv.writer(response)
    writer.writerow(CSV_FIELDS)
    rows = queryset.select_related(
        "conversation", "requested_by", "decided_by__provider_identity", "api_token"
    ).order_by("requested_at")
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
            "" if a.decision_seconds is None else f"{a.decision_seconds:.3f}",
            "" if a.run_seconds is None else f"{a.run_seconds:.3f}",
            a.run_outcome,
            "yes" if a.fresh_interpreter else "",
            a.interpreter_session,
            "" if a.output_size is None else a.output_size,
            a.output_sha256,
            a.decided_ip or "",
            a.decided_user_agent,
            a.decided_request_id,
            signed_in_as(a.decided_by),
            a.source,
            str(a.api_token) if a.api_token else "",
            a.title,
            a.context_url,
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


@admin.action(description="Export selected approvals as JSON lines (every field)")
def export_jsonl(modeladmin, request: HttpRequest, queryset) -> HttpResponse:
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    rows = queryset.order_by("requested_at").iterator(chunk_size=2000)
    response = StreamingHttpResponse(
        (jsonl_line(a) for a in rows), content_type="application/x-ndjson; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="tool-approvals-{stamp}.jsonl"'
    return response


def pretty_json(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def duration(seconds: float | None) -> str:
    """Seconds as a person reads them: "54 ms", "3.2 s", "2 min 5 s", "3 h 10 min"."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    return f"{minutes // 60} h {minutes % 60} min"


def state_of(approval: ToolApproval) -> tuple[str, str]:
    """(key, label) of the row's state: its status, or how it ended without a decision."""
    if approval.reason in ENDED_REASONS:
        return approval.reason, approval.get_reason_display()
    return approval.status, approval.get_status_display()


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [
            (ToolApproval.Status.PENDING, "Pending"),
            (ToolApproval.Status.ALLOWED, "Allowed"),
            (ToolApproval.Status.DENIED, "Denied"),
            *((reason, ToolApproval.Reason(reason).label) for reason in ENDED_REASONS),
        ]

    def queryset(self, request, queryset):
        value = self.value()
        if value in ENDED_REASONS:
            return queryset.filter(reason=value)
        if value == ToolApproval.Status.DENIED:
            return queryset.filter(status=value).exclude(reason__in=ENDED_REASONS)
        if value in (ToolApproval.Status.PENDING, ToolApproval.Status.ALLOWED):
            return queryset.filter(status=value)
        return queryset


@admin.register(ToolApproval)
class ToolApprovalAdmin(admin.ModelAdmin):
    """Read-only audit rows: a list that fits a laptop, a detail page with the context."""

    change_list_template = "admin/approvals/toolapproval/change_list.html"
    list_display = [
        "when",
        "status_badge",
        "tool_name",
        "summary",
        "requested_by",
        "decider",
        "reason_short",
        "chat",
    ]
    list_filter = [
        StateFilter, "source", "reason", "run_outcome", "needs_review", "fresh_interpreter",
        "tool_name", "requested_at",
    ]  # fmt: skip
    search_fields = [
        "tool_name",
        "arguments",
        "approval_id",
        "requested_by__username",
        "decided_by__username",
        "conversation__title",
    ]
    date_hierarchy = "requested_at"
    list_select_related = ["conversation", "requested_by", "decided_by__provider_identity"]
    actions = [export_csv, export_jsonl]
    show_full_result_count = False
    fieldsets = [
        ("The call", {"fields": ["tool_name", "arguments_pretty", "approved_pretty", "edits",
                                 "tool_hints", "subject"]}),
        ("The decision", {"fields": ["status", "reason", "why", "requested_by", "requested_at",
                                     "decided_by", "decided_by_identity", "reviewer", "decided_at",
                                     "decision_time",
                                     "decided_ip", "decided_user_agent", "decided_request_id",
                                     "note", "rule"]}),
        ("What it gave back", {"fields": ["run_outcome", "run_time", "interpreter_session",
                                          "fresh_interpreter", "output_size", "output_sha256",
                                          "output"]}),
        ("Where it was asked", {"fields": ["source", "api_token", "title", "context_url",
                                           "idempotency_key", "callback_url", "callback_at",
                                           "callback_result", "conversation", "context",
                                           "run_id", "tool_call_id"]}),
        ("Record", {"classes": ["collapse"], "fields": [
            "approval_id", "arguments_sha256", "approved_sha256", "needs_review",
            "rule_snapshot", "tool_schema", "expires_at", "started_at", "webhook_at",
            "webhook_result"]}),
    ]  # fmt: skip
    readonly_fields = [
        "decision_time",
        "decided_by_identity",
        "run_time",
        "arguments_pretty",
        "approved_pretty",
        "edits",
        "why",
        "reviewer",
        "output",
        "context",
        *(f.name for f in ToolApproval._meta.fields),
    ]

    class Media:
        css = {"all": ["studio/admin.css"]}

    # -- the list ------------------------------------------------------------------------

    @admin.display(description="time to the decision")
    def decision_time(self, obj: ToolApproval) -> str:
        return duration(obj.decision_seconds)

    @admin.display(description="run time")
    def run_time(self, obj: ToolApproval) -> str:
        return duration(obj.run_seconds)

    @admin.display(description="requested", ordering="requested_at")
    def when(self, obj: ToolApproval) -> str:
        return timezone.localtime(obj.requested_at).strftime("%b %d, %H:%M")

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: ToolApproval) -> str:
        key, label = state_of(obj)
        return format_html('<span class="audit-status audit-{}">{}</span>', key, label)

    @admin.display(description="arguments")
    def summary(self, obj: ToolApproval) -> str:
        text = obj.subject or canonical_json(obj.arguments)
        return format_html('<span title="{}">{}</span>', text[:1000], short(text, 44))

    @admin.display(description="decided by", ordering="decided_by__username")
    def decider(self, obj: ToolApproval) -> str:
        if obj.decided_by is None:
            return "—"
        # Signed in through the team's provider: who it says they are, on hover.
        who = format_html(
            '<span title="{}">{}</span>',
            signed_in_as(obj.decided_by) or "a local account",
            obj.decided_by.get_username(),
        )
        if obj.needs_review:  # four eyes: the one who decided was a reviewer
            return format_html("{} <small>(reviewer)</small>", who)
        return who

    @admin.display(description="decided by, at the sign-in provider")
    def decided_by_identity(self, obj: ToolApproval) -> str:
        if obj.decided_by is None:
            return "—"
        return signed_in_as(obj.decided_by) or "a local account (no sign-in provider)"

    @admin.display(description="reason", ordering="reason")
    def reason_short(self, obj: ToolApproval) -> str:
        if not obj.reason:
            return "—"
        return format_html('<span title="{}">{}</span>', obj.get_reason_display(), obj.reason)

    @admin.display(description="conversation", ordering="conversation__title")
    def chat(self, obj: ToolApproval) -> str:
        # An API call's conversation is its token's ("API: <token>").
        title = obj.conversation.title
        return format_html('<span title="{}">{}</span>', title, short(title, 44))

    # -- the detail page -----------------------------------------------------------------

    @admin.display(description="arguments")
    def arguments_pretty(self, obj: ToolApproval) -> str:
        return format_html('<pre class="audit-pre">{}</pre>', pretty_json(obj.arguments))

    @admin.display(description="approved arguments")
    def approved_pretty(self, obj: ToolApproval) -> str:
        if not obj.was_edited:
            return "— (ran as the model asked)" if obj.is_allowed else "—"
        return format_html('<pre class="audit-pre">{}</pre>', pretty_json(obj.approved_arguments))

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

    @admin.display(description="output (first 64 KB)")
    def output(self, obj: ToolApproval) -> str:
        if obj.output_size is None:
            return "— (did not run)"
        cut = " …" if obj.output_size > len(obj.output_summary.encode()) else ""
        return format_html('<pre class="audit-pre">{}{}</pre>', obj.output_summary, cut)

    @admin.display(description="context")
    def context(self, obj: ToolApproval) -> str:
        """The assistant message that asked for the call (through the conversation's
        messages; approvals knows nothing of chat's models)."""
        asked = None
        turns = obj.conversation.messages.filter(role="assistant", run_id=obj.run_id or None)
        for message in turns.order_by("-created_at")[:50]:
            if any(c.get("id") == obj.tool_call_id for c in message.tool_calls or []):
                asked = message
                break
        if asked is None:
            return "— (the message is gone)"
        return format_html(
            '<div class="audit-context"><p class="help">The assistant, {}:</p>'
            '<pre class="audit-pre">{}</pre></div>',
            timezone.localtime(asked.created_at).strftime("%b %d, %H:%M:%S"),
            short(asked.content, 4000) or "(no text, only tool calls)",
        )

    # -- the dashboard -------------------------------------------------------------------

    def get_urls(self):
        dashboard = path(
            "dashboard/",
            self.admin_site.admin_view(self.dashboard_view),
            name="approvals_toolapproval_dashboard",
        )
        return [dashboard, *super().get_urls()]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            days = int(request.GET.get("days", 30))
        except ValueError:
            days = 30
        if days not in PERIODS:
            days = 30
        board = dashboard_data(days)
        context = {
            **self.admin_site.each_context(request),
            "title": "Approvals dashboard",
            "opts": self.model._meta,
            "board": board,
            "charts": charts(board),
            "periods": PERIODS,
            "outcomes": OUTCOMES,
        }
        return TemplateResponse(request, "admin/approvals/dashboard.html", context)

    # Audit rows are written by the gate only.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    # Not even a superuser deletes the audit here: purge_approvals is the one
    # way rows leave, by age and with its own record.
    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class ToolRuleForm(forms.ModelForm):
    # A choice of the tools there are, not free text: "termnal" is refused, not saved.
    tool = forms.ChoiceField(help_text="A tool, or * for any tool.")

    class Meta:
        model = ToolRule
        fields = ["tool", "pattern", "action", "note", "scope", "member", "conversation"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        names = sorted(set(tool_names()))
        if self.instance.pk and self.instance.tool not in ("*", *names):
            names.append(self.instance.tool)  # a rule for a tool since removed stays editable
        self.fields["tool"].choices = [("*", "* (any tool)"), *((n, n) for n in names)]

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


class RuleStateFilter(admin.SimpleListFilter):
    """Active or revoked, in words (not "revoked at: empty / not empty")."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("active", "Active"), ("revoked", "Revoked")]

    def queryset(self, request, queryset):
        if self.value() == "active":
            return queryset.filter(revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


@admin.register(ToolRule)
class ToolRuleAdmin(admin.ModelAdmin):
    """Tool rules: for Tool, when a call matches Pattern, the Action.

    Precedence: any matching Deny, then Review, then Ask, then Allow, then
    the conversation's Confirm switch. Members' own rules are listed too.
    """

    form = ToolRuleForm
    list_display = [
        "tool", "pattern", "action", "scope", "applies_to", "hits", "last_hit_at", "active",
    ]  # fmt: skip
    list_filter = ["action", "scope", RuleStateFilter]
    search_fields = ["tool", "pattern", "note", "member__username"]
    list_select_related = ["member", "conversation__owner"]
    autocomplete_fields = ["member", "conversation"]
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

    @admin.display(description="applies to", ordering="member__username")
    def applies_to(self, obj: ToolRule) -> str:
        """Who the rule is for: everyone, a member, or one conversation (and whose)."""
        if obj.scope == ToolRule.Scope.CONVERSATION and obj.conversation is not None:
            return f"“{obj.conversation.title}” ({obj.conversation.owner.get_username()})"
        if obj.scope == ToolRule.Scope.MEMBER and obj.member is not None:
            return obj.member.get_username()
        return "everyone"

    def get_readonly_fields(self, request: HttpRequest, obj=None):
        # A new rule has no hits, author or revocation to show yet.
        return self.readonly_fields if obj is not None else []

    def get_exclude(self, request: HttpRequest, obj=None):
        if obj is None:
            return [*self.readonly_fields]
        return super().get_exclude(request, obj)

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


@admin.register(ProviderIdentity)
class ProviderIdentityAdmin(admin.ModelAdmin):
    """Which member each sign-in provider identity is (made at their first sign-in).

    Read-only but for deleting one: the member's next sign-in then makes a new
    account, or links by email where STUDIO_OIDC_LINK_BY_EMAIL allows."""

    list_display = ["user", "subject", "issuer", "groups", "linked_at"]
    search_fields = ["user__username", "subject"]
    list_select_related = ["user"]
    readonly_fields = ["user", "issuer", "subject", "groups", "linked_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.action(description="Revoke the selected tokens")
def revoke_tokens(modeladmin, request: HttpRequest, queryset) -> None:
    revoked = sum(token_revoke(token=token, by=request.user) for token in queryset)
    modeladmin.message_user(request, f"{revoked} token(s) revoked.")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Members' API tokens: an admin may make one for a member (its secret is shown
    once, on the next page) and revoke any; a token's secret is never stored."""

    list_display = ["name", "user", "shown_as", "created_at", "last_used_at", "uses", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "user__username", "lookup"]
    list_select_related = ["user"]
    actions = [revoke_tokens]
    fields = ["user", "name"]
    readonly_fields = ["shown_as", "created_at", "created_by", "last_used_at", "uses",
                       "revoked_at", "revoked_by", "conversation"]  # fmt: skip

    @admin.display(description="token")
    def shown_as(self, obj: ApiToken) -> str:
        return f"{ApiToken.PREFIX}{obj.lookup}…"

    def get_fields(self, request: HttpRequest, obj=None):
        return self.fields if obj is None else ["user", "name", *self.readonly_fields]

    def get_readonly_fields(self, request: HttpRequest, obj=None):
        return [] if obj is None else ["user", "name", *self.readonly_fields]

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: ApiToken, form, change: bool) -> None:
        token, secret = token_create(user=obj.user, name=obj.name, created_by=request.user)
        obj.pk, obj.lookup, obj.conversation = token.pk, token.lookup, token.conversation
        obj.created_at = token.created_at
        self.message_user(
            request,
            f"The token for {obj.user.get_username()}: {secret} — give it to them now; "
            "Studio keeps only its hash and cannot show it again.",
        )

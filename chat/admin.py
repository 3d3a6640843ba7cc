from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from chat.export import conversation_json_text
from chat.llm import LLMError, server_models
from chat.models import Conversation, LanguageModel, McpServer, Message, Run, parse_pairs
from chat.tools.mcp import clashing


class MessageInline(admin.TabularInline):
    model = Message
    fields = ["created_at", "role", "content", "tool_name", "tool_call_id"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False


@admin.action(description="Export as JSON (messages, tool calls and their approval rows)")
def export_json(modeladmin, request: HttpRequest, queryset) -> HttpResponse:
    response = HttpResponse(
        conversation_json_text(queryset.select_related("owner").order_by("pk")),
        content_type="application/json",
    )
    response["Content-Disposition"] = 'attachment; filename="conversations.json"'
    return response


class SharedFilter(admin.SimpleListFilter):
    """Shared with the team, or not (the admin lists what is shared)."""

    title = "shared with the team"
    parameter_name = "shared"

    def lookups(self, request, model_admin):
        return [("yes", "Shared"), ("no", "Not shared")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(shared_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(shared_at__isnull=True)
        return queryset


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    actions = [export_json]
    list_display = [
        "title", "owner", "confirm_tool_calls", "created_at", "updated_at", "shared_at", "gone",
    ]  # fmt: skip
    list_filter = [
        "confirm_tool_calls",
        SharedFilter,
        ("archived_at", admin.EmptyFieldListFilter),
        ("deleted_at", admin.EmptyFieldListFilter),
        "created_at",
    ]
    search_fields = ["title", "owner__username"]
    list_select_related = ["owner"]
    date_hierarchy = "created_at"
    readonly_fields = ["created_at", "updated_at", "archived_at", "deleted_at", "shared_at"]

    def has_add_permission(self, request) -> bool:
        return False  # members start conversations in the chat, not here

    inlines = [MessageInline]

    @admin.display(description="Deleted or archived")
    def gone(self, conversation: Conversation) -> str:
        if conversation.deleted_at:
            return f"deleted {conversation.deleted_at:%Y-%m-%d %H:%M}"
        if conversation.archived_at:
            return f"archived {conversation.archived_at:%Y-%m-%d %H:%M}"
        return ""

    def has_delete_permission(self, request, obj=None) -> bool:
        # Deleting here would take its approval rows with it; members delete
        # their chats (which keeps the audit) and purge_approvals does the rest.
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "conversation", "started_by", "status", "started_at", "finished_at"]
    list_filter = ["status"]
    list_select_related = ["conversation", "started_by"]
    readonly_fields = [f.name for f in Run._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


class SecretLines(forms.CharField):
    """KEY=value lines that are stored but never shown back: only their keys are."""

    widget = forms.Textarea(attrs={"rows": 3, "autocomplete": "off", "spellcheck": "false"})


class McpServerForm(forms.ModelForm):
    """Environment and Headers hold secrets: a blank field keeps what is stored,
    anything written replaces it all, and a single "-" clears it."""

    url = forms.URLField(
        label="URL",
        required=False,
        assume_scheme="https",
        max_length=500,
        help_text=McpServer._meta.get_field("url").help_text,
    )
    environment = SecretLines(label="Environment", required=False)
    headers = SecretLines(label="Headers", required=False)

    class Meta:
        model = McpServer
        fields = ["name", "command", "url", "environment", "headers", "network", "enabled"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for name, what in (("environment", "Environment"), ("headers", "Headers")):
            stored = getattr(self.instance, name, "") if self.instance.pk else ""
            keys = ", ".join(parse_pairs(stored, what=what)) if stored else ""
            field = self.fields[name]
            self.initial[name] = ""  # the stored value is never sent back to the browser
            field.help_text = (
                f"Set now: {keys}. " if keys else "Nothing set. "
            ) + "Leave blank to keep; KEY=value lines replace everything; a single - clears."

    def _secret(self, name: str) -> str:
        value = self.cleaned_data.get(name, "").strip()
        if value == "-":
            return ""
        if not value and self.instance.pk:
            return getattr(McpServer.objects.get(pk=self.instance.pk), name)
        return value

    def clean_environment(self) -> str:
        return self._secret("environment")

    def clean_headers(self) -> str:
        return self._secret("headers")


@admin.action(description="Refresh tools (connect and list them now)")
def refresh_tools(modeladmin, request: HttpRequest, queryset) -> None:
    from chat.mcp import refresh_tools as refresh
    from chat.tools.mcp import McpUnavailable

    for server in queryset:
        try:
            count = refresh(server)
        except McpUnavailable as exc:
            modeladmin.message_user(request, str(exc), messages.ERROR)
        else:
            modeladmin.message_user(request, f"MCP server {server.name}: {count} tool(s) found.")
            server.refresh_from_db()
            for name, remotes in clashing(server.name, [t["name"] for t in server.tools]).items():
                modeladmin.message_user(
                    request,
                    f"MCP server {server.name}: {' and '.join(remotes)} would both be {name}; "
                    "neither is offered. Rename one on the server.",
                    messages.ERROR,
                )


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    form = McpServerForm
    list_display = ["name", "transport", "enabled", "state", "tool_count", "last_connected_at"]
    list_filter = ["enabled"]
    search_fields = ["name", "command", "url"]
    readonly_fields = ["last_connected_at", "last_error", "tool_list"]
    actions = [refresh_tools]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "name",
                    "command",
                    "url",
                    "environment",
                    "headers",
                    "network",
                    "enabled",
                ]
            },
        ),
        ("Status", {"fields": ["last_connected_at", "last_error", "tool_list"]}),
    ]

    @admin.display(description="transport")
    def transport(self, obj: McpServer) -> str:
        return "stdio" if obj.command.strip() else "HTTP"

    @admin.display(description="state")
    def state(self, obj: McpServer) -> str:
        return {None: "not connected yet", True: "available", False: "unavailable"}[obj.available]

    @admin.display(description="tools")
    def tool_count(self, obj: McpServer) -> int:
        return len(obj.tools)

    @admin.display(description="Tools found")
    def tool_list(self, obj: McpServer) -> str:
        names = [t["name"] for t in obj.tools]
        listed = ", ".join(names) or "—"
        refused = clashing(obj.name, names)
        if not refused:
            return listed
        clashes = "; ".join(
            f"{' and '.join(remotes)} would both be {name}" for name, remotes in refused.items()
        )
        return f"{listed}. Not offered, so that one never stands in for another: {clashes}."

    def save_model(self, request, obj: McpServer, form, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if change:
            from chat.mcp import hub

            hub().forget(obj.name)  # this process reconnects with the new settings

    def delete_model(self, request, obj: McpServer) -> None:
        from chat.mcp import hub

        hub().forget(obj.name)
        super().delete_model(request, obj)


class LanguageModelForm(forms.ModelForm):
    """The API key is a secret: a blank field keeps what is stored, anything
    written replaces it, and a single "-" clears it. It is never sent back."""

    base_url = forms.URLField(
        label="Base URL",
        assume_scheme="https",
        max_length=500,
        help_text=LanguageModel._meta.get_field("base_url").help_text,
    )
    api_key = forms.CharField(
        label="API key",
        required=False,
        max_length=500,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
    )

    class Meta:
        model = LanguageModel
        fields = ["name", "base_url", "model_id", "api_key", "enabled"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        stored = self.instance.api_key if self.instance.pk else ""
        self.fields["api_key"].help_text = (
            "Set now. " if stored else "Nothing set. "
        ) + "Leave blank to keep; a new key replaces it; a single - clears it."
        if self.instance.available:
            found = ", ".join(self.instance.available)
            self.fields["model_id"].help_text += f" Found last time: {found}."

    def clean_api_key(self) -> str:
        value = self.cleaned_data.get("api_key", "").strip()
        if value == "-":
            return ""
        if not value and self.instance.pk:
            return LanguageModel.objects.get(pk=self.instance.pk).api_key
        return value


@admin.action(description="Fetch models (ask each server's /models)")
def fetch_models(modeladmin, request: HttpRequest, queryset) -> None:
    for choice in queryset:
        try:
            found = server_models(base_url=choice.base_url, api_key=choice.api_key)
        except LLMError as exc:
            # For the admin who set it up: the address asked and the library's words.
            said = f"{exc} Asked {choice.base_url}/models" + (
                f": {exc.detail}" if exc.detail else ""
            )
            LanguageModel.objects.filter(pk=choice.pk).update(last_error=said)
            modeladmin.message_user(request, f"{choice.name}: {said}", messages.ERROR)
            continue
        LanguageModel.objects.filter(pk=choice.pk).update(
            available=found, fetched_at=timezone.now(), last_error=""
        )
        offered = ", ".join(found) or "none"
        level = messages.SUCCESS if choice.model_id in found else messages.WARNING
        missing = "" if choice.model_id in found else f" (not {choice.model_id}!)"
        modeladmin.message_user(
            request, f"{choice.name}: the server offers {offered}{missing}.", level
        )


@admin.register(LanguageModel)
class LanguageModelAdmin(admin.ModelAdmin):
    """The models members may pick; the deployment's LLM_BASE_URL is the default."""

    form = LanguageModelForm
    actions = [fetch_models]
    list_display = ["name", "model_id", "base_url", "enabled", "key_set", "fetched_at"]
    list_filter = ["enabled"]
    search_fields = ["name", "model_id", "base_url"]
    readonly_fields = ["available", "fetched_at", "last_error"]

    @admin.display(boolean=True, description="API key")
    def key_set(self, choice: LanguageModel) -> bool:
        return bool(choice.api_key)

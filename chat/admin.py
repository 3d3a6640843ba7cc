from __future__ import annotations

from django.contrib import admin

from chat.models import Conversation, Message, Run


class MessageInline(admin.TabularInline):
    model = Message
    fields = ["created_at", "role", "content", "tool_name", "tool_call_id"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ["title", "owner", "confirm_tool_calls", "created_at", "updated_at"]
    list_filter = ["confirm_tool_calls", "created_at"]
    search_fields = ["title", "owner__username"]
    list_select_related = ["owner"]
    date_hierarchy = "created_at"
    readonly_fields = ["created_at", "updated_at"]
    inlines = [MessageInline]


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "conversation", "started_by", "status", "started_at", "finished_at"]
    list_filter = ["status"]
    list_select_related = ["conversation", "started_by"]
    readonly_fields = [f.name for f in Run._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

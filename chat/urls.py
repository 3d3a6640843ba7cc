from __future__ import annotations

from django.urls import path

from chat import views

app_name = "chat"
urlpatterns = [
    path("", views.index, name="index"),
    path("c/", views.conversation_list, name="list"),
    path("c/new/", views.conversation_new, name="new"),
    path("c/<int:conversation_id>/rename/", views.conversation_rename, name="rename"),
    path("c/<int:conversation_id>/archive/", views.conversation_archive, name="archive"),
    path("c/<int:conversation_id>/delete/", views.conversation_delete, name="delete"),
    path("c/<int:conversation_id>/share/", views.conversation_share, name="share"),
    path("c/<int:conversation_id>/", views.conversation_detail, name="conversation"),
    path("c/<int:conversation_id>/send/", views.conversation_send, name="send"),
    path("c/<int:conversation_id>/stop/", views.conversation_stop, name="stop"),
    path("c/<int:conversation_id>/retry/", views.conversation_retry, name="retry"),
    path("c/<int:conversation_id>/regenerate/", views.conversation_regenerate, name="regenerate"),
    path("c/<int:conversation_id>/edit/", views.conversation_edit, name="edit"),
    path("c/<int:conversation_id>/settings/", views.conversation_settings, name="settings"),
    path("c/<int:conversation_id>/export.<str:kind>", views.conversation_export, name="export"),
    path("c/<int:conversation_id>/files/<path:key>", views.conversation_file, name="file"),
    path("c/<int:conversation_id>/upload/", views.workspace_upload, name="upload"),
    path("c/<int:conversation_id>/python/restart/", views.python_restart, name="python_restart"),
    path(
        "c/<int:conversation_id>/workspace/<path:name>",
        views.workspace_download,
        name="download",
    ),
    path(
        "c/<int:conversation_id>/rules/<int:rule_id>/revoke/",
        views.rule_revoke,
        name="rule_revoke",
    ),
]

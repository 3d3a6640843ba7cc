from __future__ import annotations

from django.urls import path

from chat import views

app_name = "chat"
urlpatterns = [
    path("", views.index, name="index"),
    path("c/new/", views.conversation_new, name="new"),
    path("c/<int:conversation_id>/", views.conversation_detail, name="conversation"),
]

from __future__ import annotations

from django.urls import path

from approvals import views

app_name = "approvals"
urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("notifications/", views.notifications, name="notifications"),
    path("decide/", views.decide_batch, name="decide_batch"),
    path("tokens/", views.api_tokens, name="api_tokens"),
    path("tokens/new/", views.api_token_create, name="api_token_create"),
    path("tokens/<int:token_id>/revoke/", views.api_token_revoke, name="api_token_revoke"),
    path("<str:approval_id>/decide/", views.decide, name="decide"),
]

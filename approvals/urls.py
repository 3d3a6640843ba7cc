from __future__ import annotations

from django.urls import path

from approvals import views

app_name = "approvals"
urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("notifications/", views.notifications, name="notifications"),
    path("decide/", views.decide_batch, name="decide_batch"),
    path("<str:approval_id>/decide/", views.decide, name="decide"),
]

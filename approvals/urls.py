from __future__ import annotations

from django.urls import path

from approvals import views

app_name = "approvals"
urlpatterns = [
    path("<str:approval_id>/decide/", views.decide, name="decide"),
]

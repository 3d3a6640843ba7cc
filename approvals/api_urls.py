"""/api/v1/ (``GET approvals/<id>`` is served by ``approvals.api.ApprovalWait``, in studio.asgi)."""

from __future__ import annotations

from django.urls import path

from approvals import api

app_name = "api"
urlpatterns = [
    path("approvals", api.approvals_create, name="approvals"),
    path("approvals/<str:approval_id>/result", api.approval_result, name="result"),
    path("schema", api.schema, name="schema"),
]

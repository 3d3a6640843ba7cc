"""/api/v1/. Under daphne, ``GET approvals/<id>`` is ``approvals.api.ApprovalWait``
(routed in studio.asgi before Django, so it can wait); ``approval_status`` is
that path where Django alone serves (a WSGI worker, the test client)."""

from __future__ import annotations

from django.urls import path

from approvals import api

app_name = "api"
urlpatterns = [
    path("approvals", api.approvals_create, name="approvals"),
    path("approvals/<str:approval_id>", api.approval_status, name="approval"),
    path("approvals/<str:approval_id>/result", api.approval_result, name="result"),
    path("schema", api.schema, name="schema"),
]

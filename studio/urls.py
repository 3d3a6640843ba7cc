from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.decorators import login_not_required
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from studio import health

urlpatterns = [
    # Pages name their icon; this answers browsers that ask for the old name
    # anyway (the admin's pages, a bookmark), signed in or not.
    path(
        "favicon.ico",
        login_not_required(RedirectView.as_view(url=static("studio/favicon.svg"), permanent=True)),
    ),
    # For load balancers and monitoring (studio.health, studio.metrics).
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
    path("accounts/", include("approvals.signin_urls")),
    path("admin/", admin.site.urls),
    path("approvals/", include("approvals.urls")),
    path("api/v1/", include("approvals.api_urls")),
    path("", include("chat.urls")),
]

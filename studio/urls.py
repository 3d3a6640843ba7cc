from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

# The admin's index lists the models; its side copy of that list costs the
# approvals list 300 px it needs at 1280 px.
admin.site.enable_nav_sidebar = False
admin.site.site_header = "Studio administration"
admin.site.site_title = "Studio admin"

urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("approvals/", include("approvals.urls")),
    path("", include("chat.urls")),
]

"""The admin site, as Django documents overriding the default one."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig


class StudioAdminSite(admin.AdminSite):
    site_header = "Studio administration"
    site_title = "Studio admin"
    # The admin's index lists the models; its side copy of that list costs the
    # approvals list 300 px it needs at 1280 px.
    enable_nav_sidebar = False


class StudioAdminConfig(AdminConfig):
    default_site = "studio.admin.StudioAdminSite"

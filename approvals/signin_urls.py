"""Sign-in and sign-out (approvals/signin.py), at /accounts/, names not namespaced:
Django's LOGIN_URL and mozilla-django-oidc look them up by these names."""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.urls import path

from approvals import signin

urlpatterns = [
    path("login/", signin.SignInPage.as_view(), name="login"),
    path("logout/", signin.SignOut.as_view(), name="logout"),
    # The provider's way in and back: before anyone is logged in.
    path(
        "oidc/authenticate/",
        login_not_required(signin.SignInStart.as_view()),
        name="oidc_authentication_init",
    ),
    path(
        "oidc/callback/",
        login_not_required(signin.SignInCallback.as_view()),
        name="oidc_authentication_callback",
    ),
]

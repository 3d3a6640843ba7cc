"""Sign-in with the team's OpenID Connect provider, and password logins that can be off.

Built on mozilla-django-oidc: a small, kept library whose views and backend
are Django's own kinds (a ``View``, an authentication backend), with state,
nonce and PKCE in the session; django-allauth would bring its own account
pages, tables and middleware to a project that needs one button. What it
leaves to its users is here, each through a public method it documents for
overriding:

- the endpoints come from the provider's discovery document (its issuer
  checked), refreshed hourly; the signing keys from its JWKS at each sign-in,
  so keys the provider rotates are picked up;
- the ID token's issuer, audience (and ``azp``), expiry and issue time are
  checked, not only its signature and nonce;
- an account is linked by the provider's issuer and subject, never by a
  name; by a verified email only when STUDIO_OIDC_LINK_BY_EMAIL allows;
- roles (reviewer, staff, superuser) follow the groups claim at each login,
  and open sockets of a member whose roles changed reconnect with them;
- every failure is a page that says what went wrong, never a 500.
"""

from __future__ import annotations

import logging
import threading
import time
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.contrib.auth.views import LoginView, LogoutView
from django.core.exceptions import PermissionDenied, SuspiciousOperation, ValidationError
from django.db import transaction
from django.dispatch import receiver
from django.http import Http404
from django.shortcuts import render
from django.urls import reverse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from approvals.models import REVIEW_PERMISSION, ProviderIdentity
from approvals.notify import RolesChanged, tell

logger = logging.getLogger("studio.signin")

# The Django group sign-in puts reviewers in; it holds "Can review approvals".
REVIEWERS_ROLE = "Reviewers"
# The discovery document is read again after this long (a provider may move
# an endpoint); its keys are read at every sign-in.
DISCOVERY_SECONDS = 3600
# Clocks of the provider and of Studio may differ by this much.
CLOCK_LEEWAY_SECONDS = 30


class ProviderDown(Exception):
    """The provider's discovery document could not be read or does not fit."""


class Discovery:
    """The provider's discovery document, read once an hour per process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.document: dict | None = None
        self.read_at = 0.0

    def get(self) -> dict:
        with self.lock:
            if self.document is None or time.monotonic() - self.read_at > DISCOVERY_SECONDS:
                self.document = self.read(settings.STUDIO_OIDC_ISSUER)
                self.read_at = time.monotonic()
            return self.document

    def forget(self) -> None:
        with self.lock:
            self.document = None

    @staticmethod
    def read(issuer: str) -> dict:
        url = f"{issuer}/.well-known/openid-configuration"
        try:
            response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
            response.raise_for_status()
            document = response.json()
        except (requests.RequestException, ValueError) as exc:
            raise ProviderDown(f"{url} could not be read ({exc.__class__.__name__})") from exc
        if not isinstance(document, dict) or document.get("issuer") != issuer:
            raise ProviderDown(f"{url} names another issuer than {issuer}")
        for key in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(document.get(key), str):
                raise ProviderDown(f"{url} has no {key}")
        return document


DISCOVERY = Discovery()


# --- passwords --------------------------------------------------------------------------


class PasswordsOff:
    """Before Django's ModelBackend: with STUDIO_PASSWORD_LOGIN off, refuses every
    password login but the break-glass superuser's (PermissionDenied ends the
    login at once, as Django documents)."""

    # No **kwargs: Django passes it only a username and password, never the
    # provider's callback (its nonce and code verifier).
    def authenticate(self, request, username=None, password=None):
        if settings.STUDIO_PASSWORD_LOGIN or password is None:
            return None
        emergency = settings.STUDIO_BREAK_GLASS_USER
        if not emergency or username != emergency:
            raise PermissionDenied("password sign-in is off")
        if (
            not get_user_model()
            .objects.filter(username=emergency, is_superuser=True, is_active=True)
            .exists()
        ):
            raise PermissionDenied("the break-glass account is not an active superuser")
        # ModelBackend checks the password. (No get_user: sessions are never ours.)
        return None


class SignInPage(LoginView):
    """Django's login page, with the provider's button, and the password form
    only where passwords are on (or asked for by the break-glass account)."""

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["provider_label"] = (
            settings.STUDIO_OIDC_LABEL if settings.STUDIO_OIDC_ISSUER else ""
        )
        context["password_login"] = settings.STUDIO_PASSWORD_LOGIN
        context["show_password_form"] = settings.STUDIO_PASSWORD_LOGIN or (
            self.request.method == "POST" or "break-glass" in self.request.GET
        )
        return context


# --- the provider -----------------------------------------------------------------------


def failure(request, problem: str, *, status: int):
    """The page a failed sign-in lands on: what went wrong, and a way back."""
    logger.warning("sign-in failed: %s", problem, extra={"event": "login_failed", "method": "oidc"})
    return render(
        request,
        "registration/signin_failed.html",
        {"problem": problem, "provider_label": settings.STUDIO_OIDC_LABEL},
        status=status,
    )


class SignInStart(OIDCAuthenticationRequestView):
    """To the provider's login page, with state, nonce and a PKCE challenge."""

    def get(self, request):
        if not settings.STUDIO_OIDC_ISSUER:
            raise Http404("No sign-in provider is set up.")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = DISCOVERY.get()["authorization_endpoint"]
        except ProviderDown as exc:
            return failure(request, f"The sign-in provider is unreachable: {exc}.", status=503)
        return super().get(request)


class SignInCallback(OIDCAuthenticationCallbackView):
    """Back from the provider: the library checks state, nonce and PKCE; any
    failure becomes a page saying which."""

    def get(self, request):
        if not settings.STUDIO_OIDC_ISSUER:
            raise Http404("No sign-in provider is set up.")
        try:
            return super().get(request)
        except ProviderDown as exc:
            return failure(request, f"The sign-in provider is unreachable: {exc}.", status=503)
        except SuspiciousOperation as exc:
            return failure(request, refusal(exc), status=400)
        except requests.RequestException as exc:
            return failure(
                request,
                f"The sign-in provider did not answer as expected ({exc.__class__.__name__}).",
                status=502,
            )

    def login_failure(self):
        problem = getattr(self.request, "signin_problem", "")
        if not problem and self.request.GET.get("error"):
            said = self.request.GET.get("error_description") or self.request.GET["error"]
            problem = f"The sign-in provider said: {said[:200]}"
        return failure(self.request, problem or "Sign-in did not complete.", status=403)


def refusal(exc: SuspiciousOperation) -> str:
    text = str(exc)
    if "state not found" in text:
        return "This sign-in link was used already or has expired. Sign in again."
    return f"The sign-in was refused: {text}"


class ProviderBackend(OIDCAuthenticationBackend):
    """Signs a member in from the provider's code, linking the account by subject."""

    def authenticate(self, request, **kwargs):
        if not settings.STUDIO_OIDC_ISSUER or request is None or "nonce" not in kwargs:
            return None  # a password login: not ours
        provider = DISCOVERY.get()
        self.OIDC_OP_TOKEN_ENDPOINT = provider["token_endpoint"]
        self.OIDC_OP_USER_ENDPOINT = provider.get("userinfo_endpoint") or ""
        self.OIDC_OP_JWKS_ENDPOINT = provider["jwks_uri"]
        return super().authenticate(request, **kwargs)

    def get_user(self, user_id):
        # As Django's ModelBackend: a deactivated member's session ends.
        user = super().get_user(user_id)
        return user if user is not None and user.is_active else None

    def get_payload_data(self, token, key):
        """The ID token, its signature and every claim a relying party must check."""
        try:
            algorithm = jwt.get_unverified_header(token).get("alg")
            if algorithm != self.OIDC_RP_SIGN_ALGO:
                raise SuspiciousOperation(f"the token is signed with {algorithm!r}")
            payload = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=settings.STUDIO_OIDC_ISSUER,
                leeway=CLOCK_LEEWAY_SECONDS,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise SuspiciousOperation("the sign-in token has expired") from exc
        except jwt.InvalidAudienceError as exc:
            raise SuspiciousOperation("the sign-in token is for another application") from exc
        except jwt.InvalidSignatureError as exc:
            raise SuspiciousOperation("the sign-in token is not signed by the provider") from exc
        except jwt.InvalidTokenError as exc:
            raise SuspiciousOperation(f"the sign-in token is not valid ({exc})") from exc
        audience = payload["aud"]
        if isinstance(audience, list) and len(audience) > 1:
            if payload.get("azp") != self.OIDC_RP_CLIENT_ID:
                raise SuspiciousOperation("the sign-in token was issued to another application")
        return payload

    def retrieve_matching_jwk(self, token):
        try:
            jwt.get_unverified_header(token)["kid"]
        except (jwt.InvalidTokenError, KeyError) as exc:
            raise SuspiciousOperation("the sign-in token names no signing key") from exc
        return super().retrieve_matching_jwk(token)

    def get_userinfo(self, access_token, id_token, payload):
        """The ID token's claims, with the userinfo endpoint's over them (same subject)."""
        claims = dict(payload)
        if self.OIDC_OP_USER_ENDPOINT:
            info = super().get_userinfo(access_token, id_token, payload)
            if not isinstance(info, dict) or info.get("sub") != payload["sub"]:
                raise SuspiciousOperation("the provider's userinfo is about someone else")
            claims.update(info)
        return claims

    def verify_claims(self, claims):
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            self.request.signin_problem = "The provider named no subject for this account."
            return False
        return True

    def filter_users_by_claims(self, claims):
        users = get_user_model().objects
        linked = users.filter(
            provider_identity__issuer=settings.STUDIO_OIDC_ISSUER,
            provider_identity__subject=claims["sub"],
        )
        if linked.exists():
            return linked
        email = claims.get("email")
        if settings.STUDIO_OIDC_LINK_BY_EMAIL and email and claims.get("email_verified") is True:
            return users.filter(email__iexact=email, provider_identity__isnull=True)
        return users.none()

    def get_username(self, claims):
        name = claims.get(settings.STUDIO_OIDC_USERNAME_CLAIM) or claims.get("email") or ""
        return str(name)[:150]

    def create_user(self, claims):
        username = self.get_username(claims)
        User = get_user_model()
        try:
            UnicodeUsernameValidator()(username)
        except ValidationError as exc:
            self.request.signin_problem = (
                f"The provider's {settings.STUDIO_OIDC_USERNAME_CLAIM!r} claim "
                f"({username!r}) cannot be a Studio username."
            )
            raise SuspiciousOperation("unusable username") from exc
        if User.objects.filter(username__iexact=username).exists():
            self.request.signin_problem = (
                f"Studio already has an account named {username!r} that this sign-in is not "
                "linked to. An admin can link it (STUDIO_OIDC_LINK_BY_EMAIL) or rename it."
            )
            raise SuspiciousOperation("username taken")
        with transaction.atomic():
            user = User(username=username, email=claims.get("email") or "")
            user.set_unusable_password()
            user.save()
            return self.update_user(user, claims)

    def update_user(self, user, claims):
        if not user.is_active:
            self.request.signin_problem = "This account is deactivated in Studio."
            return user  # the callback refuses an inactive account
        groups = claims.get(settings.STUDIO_OIDC_GROUPS_CLAIM) or []
        groups = {groups} if isinstance(groups, str) else {str(g) for g in groups}
        with transaction.atomic():
            ProviderIdentity.objects.update_or_create(
                user=user,
                defaults={
                    "issuer": settings.STUDIO_OIDC_ISSUER,
                    "subject": claims["sub"],
                    "groups": sorted(groups),
                },
            )
            changed = roles_follow(user, groups)
            user.first_name = str(claims.get("given_name") or claims.get("name") or "")[:150]
            user.last_name = str(claims.get("family_name") or "")[:150]
            if claims.get("email"):
                user.email = str(claims["email"])[:254]
            user.save()
        if changed:
            member_roles_changed(user.pk)
        return user


def member_roles_changed(user_id: int) -> None:
    """After commit, every open socket of the member reconnects, joining the
    groups its roles give now (a reviewer no more leaves the reviewers')."""
    tell(RolesChanged(user_id))


def roles_follow(user, groups: set[str]) -> bool:
    """Reviewer, staff and superuser as the provider's groups say (each only
    where a mapping is set); True when any changed."""
    changed = False
    if settings.STUDIO_OIDC_REVIEWER_GROUPS:
        role = reviewers_role()
        wanted = bool(groups & set(settings.STUDIO_OIDC_REVIEWER_GROUPS))
        if wanted != user.groups.filter(pk=role.pk).exists():
            (user.groups.add if wanted else user.groups.remove)(role)
            changed = True
    for flag, mapped in (
        ("is_staff", settings.STUDIO_OIDC_STAFF_GROUPS),
        ("is_superuser", settings.STUDIO_OIDC_SUPERUSER_GROUPS),
    ):
        if mapped and getattr(user, flag) != bool(groups & set(mapped)):
            setattr(user, flag, bool(groups & set(mapped)))
            changed = True
    return changed


def reviewers_role() -> Group:
    role, _ = Group.objects.get_or_create(name=REVIEWERS_ROLE)
    app_label, codename = REVIEW_PERMISSION.split(".")
    role.permissions.add(
        Permission.objects.get(content_type__app_label=app_label, codename=codename)
    )
    return role


def provider_logout_url(request) -> str:
    """The provider's end-of-session address for this session ("" when it has none)."""
    id_token = request.session.get("oidc_id_token")
    if not id_token or not settings.STUDIO_OIDC_ISSUER:
        return ""
    try:
        end = DISCOVERY.get().get("end_session_endpoint")
    except ProviderDown:
        return ""
    if not isinstance(end, str) or not end:
        return ""
    query = urlencode(
        {
            "id_token_hint": id_token,
            "client_id": settings.OIDC_RP_CLIENT_ID,
            "post_logout_redirect_uri": request.build_absolute_uri(reverse("login")),
        }
    )
    return f"{end}?{query}"


class SignOut(LogoutView):
    """Django's logout, then the provider's (RP-initiated logout) where it offers one."""

    def post(self, request, *args, **kwargs):
        self.provider_url = provider_logout_url(request)  # before the session is flushed
        return super().post(request, *args, **kwargs)

    def get_success_url(self):
        return getattr(self, "provider_url", "") or super().get_success_url()


# --- the log ----------------------------------------------------------------------------


def _method(user) -> str:
    backend = getattr(user, "backend", "") or ""
    return "oidc" if backend.endswith("ProviderBackend") else "password"


@receiver(user_logged_in)
def _logged_in(sender, request, user, **kwargs) -> None:
    logger.info(
        "login",
        extra={"event": "login", "user": user.get_username(), "method": _method(user)},
    )


@receiver(user_logged_out)
def _logged_out(sender, request, user, **kwargs) -> None:
    if user is not None:
        logger.info("logout", extra={"event": "logout", "user": user.get_username()})


@receiver(user_login_failed)
def _login_failed(sender, credentials, request=None, **kwargs) -> None:
    # A password login's; a provider's sign-in that failed is logged, with
    # why, by ``failure`` (its credentials name nobody). Names only: Django
    # has masked anything that looks like a secret.
    if "username" not in credentials:
        return
    logger.info(
        "login failed",
        extra={
            "event": "login_failed",
            "method": "password",
            "user": str(credentials["username"])[:150],
        },
    )

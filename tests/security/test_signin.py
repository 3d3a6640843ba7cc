"""Sign-in with a real OpenID Connect provider (oidc-provider under Node.js on
loopback): the code flow with PKCE, accounts, roles, logout and each refusal."""

from __future__ import annotations

import csv
import json
import logging
import time
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from approvals.consumers import CLOSE_ROLES_CHANGED
from approvals.models import ProviderIdentity, ToolApproval, can_review
from approvals.signin import DISCOVERY
from tests.factories import PASSWORD, make_approval, make_conversation, make_user
from tests.helpers.oidc import CLIENT_ID, Provider, callback_query, provider_login, signing_key
from tests.helpers.sockets import closed_with, open_socket, receive_until

pytestmark = pytest.mark.django_db

CALLBACK = "http://testserver/accounts/oidc/callback/"
ALICE = {
    "email": "alice@example.com",
    "email_verified": True,
    "name": "Alice",
    "preferred_username": "alice",
    "groups": ["staff-all", "approvers"],
}


@pytest.fixture
def provider(tmp_path, settings):
    idp = Provider(
        tmp_path, redirect_uris=[CALLBACK], logout_uri="http://testserver/accounts/login/"
    )
    idp.accounts({"alice-sub": ALICE})
    idp.start()
    for name, value in idp.settings().items():
        setattr(settings, name, value)
    DISCOVERY.forget()
    yield idp
    idp.stop()
    DISCOVERY.forget()


def sign_in(client: Client, login: str = "alice-sub"):
    """The whole flow: Studio's start, the provider's pages, Studio's callback."""
    start = client.get("/accounts/oidc/authenticate/?next=/approvals/")
    assert start.status_code == 302
    back = provider_login(start["Location"], login)
    assert back.startswith(CALLBACK), back
    return client.get("/accounts/oidc/callback/", callback_query(back)), back


def test_the_code_flow_with_pkce_creates_the_member_with_their_roles(provider, caplog):
    client = Client()
    start = client.get("/accounts/oidc/authenticate/")
    asked = {k: v[0] for k, v in parse_qs(urlsplit(start["Location"]).query).items()}
    assert start["Location"].startswith(provider.issuer)
    assert asked["code_challenge_method"] == "S256" and asked["code_challenge"]
    assert asked["state"] and asked["nonce"] and asked["client_id"] == CLIENT_ID

    caplog.set_level(logging.INFO, logger="studio.signin")
    answer, _ = sign_in(client)
    assert answer.status_code == 302 and answer["Location"] == "/approvals/"
    user = get_user_model().objects.get(username="alice")
    assert (user.email, user.first_name, user.has_usable_password()) == (
        "alice@example.com",
        "Alice",
        False,
    )
    assert can_review(user) and not user.is_staff
    identity = ProviderIdentity.objects.get(user=user)
    assert (identity.issuer, identity.subject) == (provider.issuer, "alice-sub")
    assert client.get("/approvals/").status_code == 200
    # Logged as JSON-ready fields, with no token in them.
    [line] = [r for r in caplog.records if getattr(r, "event", "") == "login"]
    assert (line.user, line.method) == ("alice", "oidc")
    assert "eyJ" not in json.dumps({k: str(v) for k, v in vars(line).items()})


def test_roles_follow_the_provider_at_each_login(provider):
    sign_in(Client())
    user = get_user_model().objects.get(username="alice")
    assert can_review(user)
    provider.accounts({"alice-sub": {**ALICE, "groups": ["admins"], "email": "a2@example.com"}})
    answer, _ = sign_in(Client())
    assert answer.status_code == 302
    user = get_user_model().objects.get(username="alice")
    assert not can_review(user), "removed from the reviewers' group at the provider"
    assert user.is_staff and user.email == "a2@example.com"


def test_a_local_account_of_the_same_name_is_not_taken_over(provider, caplog):
    make_user("alice")
    caplog.set_level(logging.INFO, logger="studio.signin")
    answer, _ = sign_in(Client())
    # One line for the refusal, saying why (not a second, nameless one).
    [line] = [r for r in caplog.records if getattr(r, "event", "") == "login_failed"]
    assert line.method == "oidc" and "already has an account" in line.getMessage()
    assert answer.status_code == 403
    assert "already has an account named &#x27;alice&#x27;" in answer.content.decode()
    assert not ProviderIdentity.objects.exists()


def test_linking_by_verified_email_only_when_allowed(provider, settings):
    local = make_user("alice-local")
    local.email = "alice@example.com"
    local.save()
    settings.STUDIO_OIDC_LINK_BY_EMAIL = True
    answer, _ = sign_in(Client())
    assert answer.status_code == 302
    assert ProviderIdentity.objects.get(subject="alice-sub").user == local


def test_a_deactivated_member_is_refused_with_a_valid_token(provider):
    sign_in(Client())
    get_user_model().objects.filter(username="alice").update(is_active=False)
    client = Client()
    answer, _ = sign_in(client)
    assert answer.status_code == 403 and "deactivated" in answer.content.decode()
    assert client.get("/").status_code == 302


def test_a_replayed_state_is_refused_with_a_page(provider):
    client = Client()
    answer, back = sign_in(client)
    assert answer.status_code == 302
    again = client.get("/accounts/oidc/callback/", callback_query(back))
    assert again.status_code in (400, 403)
    assert "Sign-in did not work" in again.content.decode()


def test_an_expired_token_is_refused_with_a_page(provider):
    # The provider's clock two hours behind: what it issues has expired.
    provider.restart(OIDC_SKEW_SECONDS=str(-2 * 3600))
    client = Client()
    answer, _ = sign_in(client)
    assert answer.status_code == 400
    assert "expired" in answer.content.decode()
    assert client.get("/").status_code == 302


def test_keys_the_provider_rotates_are_picked_up(provider):
    sign_in(Client())
    provider.restart(rotate=True)
    answer, _ = sign_in(Client())
    assert answer.status_code == 302


@pytest.mark.parametrize(
    "change, said",
    [
        ({"aud": "another-app"}, "another application"),
        ({"iss": "http://127.0.0.1:1"}, "not valid"),
        ({"exp": 1}, "expired"),
        ({"signed_by": "another"}, "not signed by the provider"),
    ],
)
def test_a_token_that_fails_a_check_is_refused(provider, change, said):
    """What the backend is handed is checked against the provider's published
    keys (fetched from it): issuer, audience, expiry and signature."""
    from django.core.exceptions import SuspiciousOperation

    from approvals.signin import ProviderBackend

    now = int(time.time())
    claims = {"iss": provider.issuer, "aud": CLIENT_ID, "sub": "alice-sub", "iat": now}
    claims |= {"exp": now + 300, "nonce": "n"}
    key = signing_key() if change.pop("signed_by", None) else None
    if key:
        key["kid"] = provider.key["kid"]  # the provider's key id, another key
    token = provider.token(claims | change, key=key)
    backend = ProviderBackend()
    backend.OIDC_OP_JWKS_ENDPOINT = DISCOVERY.get()["jwks_uri"]
    with pytest.raises(SuspiciousOperation, match=said):
        backend.verify_token(token, nonce="n")
    good = provider.token(claims)
    assert backend.verify_token(good, nonce="n")["sub"] == "alice-sub"


def test_an_unreachable_provider_is_a_page_not_a_500(provider, settings):
    settings.STUDIO_OIDC_ISSUER = "http://127.0.0.1:1"
    DISCOVERY.forget()
    answer = Client().get("/accounts/oidc/authenticate/")
    assert answer.status_code == 503 and "unreachable" in answer.content.decode()


def test_logout_ends_the_providers_session_too(provider):
    client = Client()
    sign_in(client)
    out = client.post("/accounts/logout/")
    assert out.status_code == 302
    end = urlsplit(out["Location"])
    assert f"{end.scheme}://{end.netloc}" == provider.issuer
    query = parse_qs(end.query)
    assert query["id_token_hint"][0].count(".") == 2
    assert query["post_logout_redirect_uri"] == ["http://testserver/accounts/login/"]
    assert client.get("/").status_code == 302
    # The provider takes the hint (its session cookie is the browser's: the
    # browser test confirms the sign-out there).
    confirm = requests.get(out["Location"], timeout=10)
    assert confirm.status_code == 200 and "invalid_request" not in confirm.text


def test_passwords_off_but_for_the_break_glass_superuser(provider, settings):
    make_user("bob")
    root = make_user("root", superuser=True)
    settings.STUDIO_PASSWORD_LOGIN = False
    settings.STUDIO_BREAK_GLASS_USER = root.username
    page = Client().get("/accounts/login/").content.decode()
    assert "Sign in with Test IdP" in page and 'name="password"' not in page
    bob = Client()
    refused = bob.post("/accounts/login/", {"username": "bob", "password": PASSWORD})
    assert refused.status_code == 200 and "Password sign-in is off" in refused.content.decode()
    for name, status in (("bob", 200), ("root", 302)):
        answer = Client().post("/accounts/login/", {"username": name, "password": PASSWORD})
        assert answer.status_code == status, name
    assert 'name="password"' in Client().get("/accounts/login/?break-glass").content.decode()
    # The provider's sign-in is not a password login: it goes through.
    answer, _ = sign_in(Client())
    assert answer.status_code == 302


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_reviewer_dropped_at_the_provider_loses_the_reviewers_sockets(
    provider, stop_runtime
):
    """Their open tabs close and reconnect at the next sign-in, joining what
    their roles give now; the reviewers' group reaches them no more."""
    client = Client()
    await sync_to_async(sign_in)(client)
    user = await get_user_model().objects.aget(username="alice")
    assert await sync_to_async(can_review)(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    comm, connected, _ = await open_socket(0, user, cookie=cookie, path="/ws/inbox/")
    assert connected
    await receive_until(comm, "approvals-count")

    provider.accounts({"alice-sub": {**ALICE, "groups": []}})
    await sync_to_async(sign_in)(Client())
    await closed_with(comm, CLOSE_ROLES_CHANGED)
    user = await get_user_model().objects.aget(username="alice")
    assert not await sync_to_async(can_review)(user)
    again, connected, _ = await open_socket(0, user, cookie=cookie, path="/ws/inbox/")
    assert connected
    await receive_until(again, "approvals-count")
    await again.disconnect()


def test_the_audit_shows_who_decided_at_the_provider(provider):
    sign_in(Client())
    alice = get_user_model().objects.get(username="alice")
    approval = make_approval(make_conversation(alice))
    ToolApproval.objects.filter(pk=approval.pk).update(
        status="allowed", reason="user", decided_by=alice, decided_at=timezone.now()
    )
    admin = Client()
    admin.force_login(make_user("root", superuser=True))
    listing = admin.get("/admin/approvals/toolapproval/").content.decode()
    assert f'title="alice-sub at {provider.issuer}">alice</span>' in listing
    detail = admin.get(f"/admin/approvals/toolapproval/{approval.pk}/change/").content.decode()
    assert f"alice-sub at {provider.issuer}" in detail
    exported = admin.post(
        "/admin/approvals/toolapproval/",
        {"action": "export_csv", "_selected_action": [approval.pk]},
    ).content.decode()
    header, row = list(csv.reader(exported.splitlines()))[:2]
    assert row[header.index("decided_by_identity")] == f"alice-sub at {provider.issuer}"

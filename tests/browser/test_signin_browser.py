"""Issue 56 in Chromium: a member signs in through a real OpenID Connect
provider's own login page, lands in Studio with the roles its groups give,
decides a card, and logs out of Studio and of the provider."""

from __future__ import annotations

import os
import re

import pytest
from django.contrib.auth import get_user_model

from approvals.models import ToolApproval, can_review
from deploy.cluster import free_port
from tests.browser.ui import TIMEOUT, card_for, new_chat, run_finished
from tests.helpers.live import LiveServer
from tests.helpers.oidc import Provider

pytestmark = pytest.mark.django_db(transaction=True)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM checks beside Playwright's loop


@pytest.fixture
def signin_server(tmp_path, workspace_root, artifacts):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    idp = Provider(
        tmp_path,
        redirect_uris=[f"{url}/accounts/oidc/callback/"],
        logout_uri=f"{url}/accounts/login/",
    )
    idp.accounts(
        {
            "dana-sub": {
                "email": "dana@example.com",
                "email_verified": True,
                "name": "Dana",
                "preferred_username": "dana",
                "groups": ["approvers", "admins"],
            }
        }
    )
    idp.start()
    server = LiveServer(
        log_path=artifacts / "daphne-signin.log",
        port=port,
        STUDIO_WORKSPACE_ROOT=str(workspace_root),
        STUDIO_PASSWORD_LOGIN="false",
        **idp.env(),
    )
    server.start()
    yield server, idp
    server.stop()
    idp.stop()


@pytest.mark.parametrize("width", [390, 1280])
def test_sign_in_decide_and_log_out_through_the_provider(browser, signin_server, width, artifacts):
    server, idp = signin_server
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(TIMEOUT)
    page = context.new_page()
    try:
        page.goto(server.url + "/")
        assert "/accounts/login/" in page.url
        # Passwords are off: the provider's button, no password form.
        assert page.locator("input[name=password]").count() == 0
        page.click("text=Sign in with Test IdP")
        # The provider's own pages: its login form, then its consent.
        page.wait_for_url(re.compile(re.escape(idp.issuer) + r"/interaction/.*"))
        page.fill("input[name=login]", "dana-sub")
        page.fill("input[name=password]", "anything")
        page.click("button[type=submit]")
        page.locator("button", has_text="Continue").click()
        page.wait_for_url(server.url + "/")
        page.screenshot(path=str(artifacts / f"56-signed-in-{width}.png"))

        dana = get_user_model().objects.get(username="dana")
        assert can_review(dana) and dana.is_staff
        header = page.locator("header")
        assert "dana" in header.inner_text()
        assert page.locator("header a", has_text="Admin").count() == 1

        new_chat(page)
        card = card_for(page, "run python: print(6 * 7)")
        card.locator("button[value=allow]").click()
        page.locator(".tool-result pre", has_text=re.compile(r"^\s*42\s*$")).wait_for()
        run_finished(page)
        row = ToolApproval.objects.get()
        assert (row.status, row.decided_by.username) == ("allowed", "dana")

        # Out of Studio, and of the provider (its own page asks to confirm).
        if page.locator("header button", has_text="Log out").is_visible():
            page.locator("header button", has_text="Log out").click()
        else:
            page.evaluate("document.querySelector('header form.inline').requestSubmit()")
        page.wait_for_url(re.compile(re.escape(idp.issuer) + r"/session/end.*"))
        page.locator("button", has_text="Yes, sign me out").click()
        page.wait_for_url(re.compile(re.escape(server.url) + r"/accounts/login/.*"))
        page.goto(server.url + "/")
        assert "/accounts/login/" in page.url
        # Signed out at the provider too: signing in asks for the login again.
        page.click("text=Sign in with Test IdP")
        page.wait_for_url(re.compile(re.escape(idp.issuer) + r"/interaction/.*"))
        assert page.locator("input[name=login]").count() == 1
    finally:
        context.close()

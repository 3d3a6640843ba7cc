"""An agent outside the chat asks through /api/v1/ and a member decides in Chromium,
on a daphne serving Studio on PostgreSQL and Redis.

The agent is a process of its own using the shipped client (studio_approvals);
its card comes into the member's open inbox live, the member allows it there,
and the agent's blocking call returns the decision.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from approvals.models import ToolApproval
from tests.browser.ui import login
from tests.helpers.procs import ROOT, read_line

# PostgreSQL and Redis under the server (the services pass), as in production.
pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM checks beside Playwright's loop

BOUND = 30


@pytest.mark.parametrize("width", [390, 1280])
def test_an_agents_call_is_allowed_from_the_inbox(studio_server, member, sized, artifacts, width):
    page = sized
    login(page, studio_server)
    # The member makes the token on their page and copies it from there (once).
    page.goto(studio_server.url + "/approvals/")
    page.click("text=API tokens")
    page.fill("#token-name", "nightly job")
    page.click("text=Make a token")
    secret = page.locator("#token-secret").inner_text().strip()
    assert secret.startswith("studio_")
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    page.screenshot(path=str(artifacts / f"57-api-token-{width}.png"))
    page.goto(studio_server.url + "/approvals/")
    page.locator(".inbox-empty:not([hidden])").wait_for()
    agent = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/helpers/api_client_proc.py"), studio_server.url,
         secret, "approve", "terminal", json.dumps({"command": "make release"})],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert read_line(agent, BOUND).strip() == "asking"
        entry = page.locator(".inbox-entry").first
        entry.wait_for()
        assert "Ship it · via API (nightly job)" in entry.inner_text()
        assert "make release" in entry.inner_text()
        page.locator("#approvals-count[data-pending-count='1']").wait_for(state="attached")
        # The card fits the screen: nothing to scroll sideways for on a phone.
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0
        page.screenshot(path=str(artifacts / f"57-api-inbox-{width}.png"))
        entry.locator("button[value=allow]").click()
        out = json.loads(read_line(agent, BOUND))
    finally:
        agent.kill()
        agent.wait(10)
    assert out["status"] == "allowed" and out["arguments"] == {"command": "make release"}
    assert out["decided_by"] == "carol"
    row = ToolApproval.objects.get(approval_id=out["id"])
    assert row.source == "api" and row.decided_by == member and row.decided_ip

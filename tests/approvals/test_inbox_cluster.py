"""The inbox and the webhook across two daphne processes on PostgreSQL and Redis."""

from __future__ import annotations

import re
import time

import pytest

from approvals.models import ToolApproval, ToolRule
from tests.factories import make_conversation, make_reviewer
from tests.helpers.clients import APPROVAL_ID, Browserish, Tab, session_cookie
from tests.helpers.live import two_servers
from tests.helpers.receiver import Receiver

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

BOUND = 30
COUNT = re.compile(r'data-pending-count="(\d+)"')


@pytest.fixture
def hook():
    with Receiver() as receiver:
        yield receiver


@pytest.fixture
def cluster(workspace_root, tmp_path, hook, settings):
    env = {
        "REDIS_URL": settings.REDIS_URL,
        "STUDIO_WORKSPACE_ROOT": str(workspace_root),
        "STUDIO_APPROVAL_POLL_SECONDS": "0.3",
        "STUDIO_APPROVAL_WEBHOOK_URL": hook.url,
        "STUDIO_APPROVAL_WEBHOOK_AFTER": "1",
    }
    with two_servers(tmp_path, **env) as pair:
        yield pair


def test_review_calls_come_and_go_live_in_inboxes_of_another_process(cluster, alice, hook):
    a, b = cluster
    reviewer = make_reviewer("rita")
    conversation = make_conversation(alice, title="Prod")
    ToolRule.objects.create(tool="terminal", action="review")
    alice_session, rita_session = session_cookie(alice), session_cookie(reviewer)
    # Rita's inbox and Alice's other page live on process b; the run on a.
    inbox = Tab(b.ws_url, None, rita_session, origin=b.url, path="/ws/inbox/")
    alice_page = Tab(b.ws_url, None, alice_session, origin=b.url, path="/ws/me/")
    assert COUNT.findall(inbox.until('id="inbox-list"'))[-1] == "0"
    alice_page.until("approvals-count")
    chat = Tab(a.ws_url, conversation.pk, alice_session, origin=a.url)
    chat.until('id="transcript"')
    chat.send("$ echo reviewed")
    approval_id = APPROVAL_ID.findall(chat.until('data-status="pending"'))[-1]

    added = inbox.until('hx-swap-oob="afterbegin"')
    assert f'data-inbox-entry="{approval_id}"' in added and COUNT.findall(added)[-1] == "1"
    # Alice's own call waits on Rita, not on her: her header hears of it and
    # does not count it (issue 37).
    assert COUNT.findall(alice_page.until('data-pending-count="0"'))[-1] == "0"

    # It waited past STUDIO_APPROVAL_WEBHOOK_AFTER: one POST, whichever process claimed it.
    (post,) = hook.wait_for(1, timeout=BOUND)
    assert post["approval_id"] == approval_id and post["needs_review"] is True

    # Rita decides through process a; her inbox on b turns the card into
    # what became of it (the page then lets it go).
    rita = Browserish(a.url, rita_session)
    assert rita.decide(approval_id, "allow").status_code == 200
    removed = inbox.until("data-decided")
    assert f'id="inbox-entry-{approval_id}"' in removed and COUNT.findall(removed)[-1] == "0"
    assert "Allowed by rita" in removed
    alice_page.until('data-pending-count="0"')
    chat.until('class="output">reviewed')
    row = ToolApproval.objects.get(approval_id=approval_id)
    assert (row.decided_by, row.requested_by) == (reviewer, alice)

    # Both processes kept polling for due rows meanwhile: still one POST.
    time.sleep(1.0)
    assert len(hook.posts) == 1
    for tab in (inbox, alice_page, chat):
        tab.close()
    rita.close()

"""Four eyes: calls a Review rule sends to a reviewer, and who may decide what."""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from django.test import Client
from django.urls import reverse

from approvals.models import NOT_YOURS, OWN_CALL, ToolApproval, ToolRule
from approvals.services.decisions import DecisionForbidden, approval_decide, approvals_decide
from chat.events import ToolFinished, ToolStarted
from chat.models import Message
from tests.factories import make_approval, make_conversation, make_reviewer, make_user
from tests.helpers.driver import AgentDriver
from tests.helpers.scripted import call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anydb]
BOUND = 10.0


@pytest.fixture
def reviewer(db):
    return make_reviewer("rita")


def review_call(conversation, **fields):
    return make_approval(conversation, needs_review=True, **fields)


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def decide(user, approval, decision, **extra):
    return client_for(user).post(
        reverse("approvals:decide", args=[approval.approval_id]),
        {"decision": decision, **extra},
        HTTP_ACCEPT="application/json",
    )


def test_the_owner_cannot_allow_a_review_call_but_may_deny_it(conversation, alice):
    row = review_call(conversation)
    for decision in ("allow", "edit", "always"):
        answer = decide(alice, row, decision, arguments='{"code": "print(2)"}')
        assert (answer.status_code, answer.json()["error"]) == (403, NOT_YOURS), decision
    assert ToolApproval.objects.get(pk=row.pk).status == "pending"  # nothing changed
    assert decide(alice, row, "deny").status_code == 200
    row.refresh_from_db()
    assert (row.status, row.decided_by, row.reviewed_by) == ("denied", alice, None)


def test_a_reviewer_allows_it_and_the_row_says_who_asked_and_who_reviewed(
    conversation, alice, reviewer
):
    row = review_call(conversation)
    answer = decide(reviewer, row, "allow")
    assert answer.status_code == 200 and answer.json()["status"] == "allowed"
    row.refresh_from_db()
    assert (row.requested_by, row.decided_by, row.reviewed_by) == (alice, reviewer, reviewer)
    # A reviewer edits, but makes no rules in someone else's chat.
    other = review_call(conversation)
    assert decide(reviewer, other, "always").status_code == 403
    assert ToolRule.objects.count() == 0


def test_a_reviewer_cannot_approve_their_own_call(reviewer):
    own = review_call(make_conversation(reviewer))
    answer = decide(reviewer, own, "allow")
    assert (answer.status_code, answer.json()["error"]) == (403, OWN_CALL)
    assert decide(reviewer, own, "deny").status_code == 200  # as the member, they may deny


def test_who_may_not_see_it_gets_404(conversation, alice, reviewer):
    review = review_call(conversation)
    ordinary = make_approval(conversation)
    stranger = make_user("mallory")
    assert decide(stranger, review, "allow").status_code == 404
    assert decide(stranger, review, "deny").status_code == 404
    # A reviewer sees review calls only, not a member's ordinary ones.
    assert decide(reviewer, ordinary, "deny").status_code == 404
    assert ToolApproval.objects.filter(status="pending").count() == 2


def test_a_batch_says_per_row_what_was_refused(conversation, alice, reviewer):
    review, ordinary = review_call(conversation), make_approval(conversation)
    answers = approvals_decide(
        approval_ids=[review.approval_id, ordinary.approval_id], user=alice, decision="allow"
    )
    assert answers[0] == {"approval_id": review.approval_id, "error": NOT_YOURS}
    assert answers[1]["status"] == "allowed"


def test_owner_deny_racing_reviewer_allow_first_wins(conversation, alice, reviewer):
    for _ in range(5):
        row = review_call(conversation)
        barrier = threading.Barrier(2, timeout=BOUND)
        won: dict[str, bool] = {}

        def act(user, decision, row=row, barrier=barrier, won=won):
            barrier.wait()
            try:
                won[decision] = approval_decide(
                    approval_id=row.approval_id, user=user, decision=decision
                ).resolved
            finally:
                connections.close_all()

        threads = [
            threading.Thread(target=act, args=(alice, "deny")),
            threading.Thread(target=act, args=(reviewer, "allow")),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(BOUND)
        assert sorted(won.values()) == [False, True]
        row.refresh_from_db()
        winner = "deny" if won["deny"] else "allow"
        assert row.status == {"deny": "denied", "allow": "allowed"}[winner]
        assert row.decided_by == (alice if winner == "deny" else reviewer)


def test_forbidden_is_checked_before_first_wins(conversation, alice, reviewer):
    row = review_call(conversation)
    approval_decide(approval_id=row.approval_id, user=reviewer, decision="allow")
    # Already decided, but the owner was never allowed to allow: 403, not 409.
    with pytest.raises(DecisionForbidden):
        approval_decide(approval_id=row.approval_id, user=alice, decision="allow")
    assert decide(reviewer, row, "deny").status_code == 409


def test_a_review_rule_makes_the_run_wait_for_a_reviewer(conversation, alice, reviewer):
    conversation.confirm_tool_calls = False  # a Review rule holds even so
    conversation.save()
    ToolRule.objects.create(tool="python", action="review", note="Deploys need a second pair.")
    turns = [("", [call("python", {"code": "print('shipped')"})]), ("Done.", [])]
    driver = AgentDriver.scripted(conversation, alice, turns)
    started = driver.wait_for(ToolStarted)
    assert started.awaiting is True
    row = ToolApproval.objects.get(approval_id=started.approval_id)
    assert (row.needs_review, row.status, row.rule_snapshot["action"]) == (
        True,
        "pending",
        "review",
    )
    with pytest.raises(DecisionForbidden):
        approval_decide(approval_id=row.approval_id, user=alice, decision="allow")
    assert approval_decide(approval_id=row.approval_id, user=reviewer, decision="allow").resolved
    assert driver.wait_for(ToolFinished).result.strip() == "shipped"
    driver.finish()


# --- the reviewer's view of the conversation ----------------------------------------------


def test_a_reviewer_reads_the_conversation_while_a_call_waits_for_them(
    conversation, alice, reviewer
):
    url = reverse("chat:conversation", args=[conversation.pk])
    assert client_for(reviewer).get(url).status_code == 404  # nothing waits for them yet
    row = review_call(conversation, arguments={"code": "print('deploy')"}, tool_call_id="c1")
    Message.objects.create(
        conversation=conversation,
        role="assistant",
        content="Deploying.",
        tool_calls=[{"id": "c1", "name": "python", "arguments": row.arguments}],
    )
    page = client_for(reviewer).get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "data-read-only" in html and "print(&#x27;deploy&#x27;)" in html
    assert 'id="message-input"' not in html and 'id="settings"' not in html
    assert 'value="allow"' in html  # the card, as a reviewer sees it
    # Reading only: no sending, no settings, no stopping.
    reviewer_client = client_for(reviewer)
    for name in ("chat:send", "chat:settings", "chat:stop"):
        assert reviewer_client.post(reverse(name, args=[conversation.pk])).status_code == 404
    # The owner's own view of the same card: no Allow, a word why.
    owner_html = client_for(alice).get(url).content.decode()
    assert "data-review-note" in owner_html and 'value="allow"' not in owner_html
    # Once decided, the conversation is the member's alone again.
    approval_decide(approval_id=row.approval_id, user=reviewer, decision="deny")
    assert client_for(reviewer).get(url).status_code == 404
    assert client_for(make_user("mallory")).get(url).status_code == 404


def test_the_admin_shows_who_asked_and_who_reviewed(conversation, alice, reviewer, admin_user):
    row = review_call(conversation)
    approval_decide(approval_id=row.approval_id, user=reviewer, decision="allow")
    admin = client_for(admin_user)
    listing = admin.get(reverse("admin:approvals_toolapproval_changelist")).content.decode()
    assert "rita</span> <small>(reviewer)</small>" in listing and "alice" in listing
    detail = admin.get(reverse("admin:approvals_toolapproval_change", args=[row.pk]))
    assert "rita" in detail.content.decode()

"""POST /approvals/<id>/decide/: status codes, CSRF, JSON, HTMX and plain posts."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client
from django.urls import reverse

from approvals.models import ToolApproval
from approvals.signals import calls_settled
from tests.factories import make_approval

# The view decides on a worker thread of its own: it must see committed rows.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anydb]


@pytest.fixture
def approval(conversation):
    return make_approval(conversation, arguments={"code": "print('hi')"})


def url(approval_id: str) -> str:
    return reverse("approvals:decide", args=[approval_id])


def test_anonymous_is_sent_to_login_and_nothing_changes(client, approval):
    response = client.post(url(approval.approval_id), {"decision": "allow"})
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    assert ToolApproval.objects.get(pk=approval.pk).status == "pending"


def test_get_is_not_allowed(alice_client, approval):
    assert alice_client.get(url(approval.approval_id)).status_code == 405


def test_unknown_id_is_404(alice_client):
    assert alice_client.post(url("does-not-exist"), {"decision": "allow"}).status_code == 404


def test_other_members_approval_is_404_and_unchanged(bob, approval):
    client = Client()
    client.force_login(bob)
    response = client.post(url(approval.approval_id), {"decision": "allow"})
    assert response.status_code == 404
    assert ToolApproval.objects.get(pk=approval.pk).status == "pending"


@pytest.mark.parametrize("decision", ["", "ALLOW", "yes", "allow ", "approve"])
def test_bad_decision_is_400_with_a_message(alice_client, approval, decision):
    response = alice_client.post(url(approval.approval_id), {"decision": decision})
    assert response.status_code == 400
    assert b"decision must be one of" in response.content
    assert ToolApproval.objects.get(pk=approval.pk).status == "pending"


def test_note_too_long_is_400(alice_client, approval):
    response = alice_client.post(
        url(approval.approval_id), {"decision": "deny", "note": "x" * 5000}
    )
    assert response.status_code == 400
    assert ToolApproval.objects.get(pk=approval.pk).status == "pending"


def test_plain_form_post_redirects_to_the_conversation(alice_client, approval, conversation):
    response = alice_client.post(url(approval.approval_id), {"decision": "allow"})
    assert response.status_code == 302
    assert response["Location"] == conversation.get_absolute_url()
    row = ToolApproval.objects.get(pk=approval.pk)
    assert (row.status, row.reason, row.decided_by.username) == ("allowed", "user", "alice")


def test_json_response(alice_client, approval):
    response = alice_client.post(
        url(approval.approval_id),
        {"decision": "deny", "note": "no"},
        HTTP_ACCEPT="application/json",
    )
    assert response.status_code == 200
    assert response.json() == {"resolved": True, "status": "denied", "reason": "user"}
    again = alice_client.post(
        url(approval.approval_id), {"decision": "allow"}, HTTP_ACCEPT="application/json"
    )
    assert again.status_code == 409
    assert again.json() == {"resolved": False, "status": "denied", "reason": "user"}
    assert ToolApproval.objects.get(pk=approval.pk).note == "no"


def test_htmx_gets_the_card_partial(alice_client, approval):
    response = alice_client.post(
        url(approval.approval_id), {"decision": "allow"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith("<article")
    assert f'data-approval-id="{approval.approval_id}"' in html
    assert 'data-status="allowed"' in html
    assert "Allowed by alice" in html
    assert "<html" not in html


def test_htmx_answer_and_the_other_tabs_share_one_drawing_of_the_card(
    alice_client, approval, monkeypatch
):
    from approvals import notify
    from approvals.services import decisions as services

    drawn = []
    card = notify.card
    monkeypatch.setattr(notify, "card", lambda a, v=None: drawn.append(a) or card(a, v))
    monkeypatch.setattr(services, "card", notify.card)

    response = alice_client.post(
        url(approval.approval_id), {"decision": "allow"}, HTTP_HX_REQUEST="true"
    )

    assert 'data-status="allowed"' in response.content.decode()
    assert len(drawn) == 1


def test_already_decided_is_409_with_the_current_card(alice_client, approval):
    alice_client.post(url(approval.approval_id), {"decision": "deny"})
    response = alice_client.post(
        url(approval.approval_id), {"decision": "allow"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 409
    assert 'data-status="denied"' in response.content.decode()
    plain = alice_client.post(url(approval.approval_id), {"decision": "allow"})
    assert plain.status_code == 409
    assert b"already decided" in plain.content
    assert ToolApproval.objects.get(pk=approval.pk).status == "denied"


def test_csrf_is_enforced(alice, approval):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = client.post(url(approval.approval_id), {"decision": "allow"})
    assert response.status_code == 403
    assert ToolApproval.objects.get(pk=approval.pk).status == "pending"


def test_csrf_header_as_htmx_sends_it_is_accepted(alice, approval, conversation):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    page = client.get(conversation.get_absolute_url())
    token = page.cookies["csrftoken"].value
    response = client.post(
        url(approval.approval_id),
        {"decision": "allow"},
        HTTP_HX_REQUEST="true",
        HTTP_X_CSRFTOKEN=token,
    )
    assert response.status_code == 200
    assert ToolApproval.objects.get(pk=approval.pk).status == "allowed"


def test_always_creates_a_rule(alice_client, approval, conversation):
    response = alice_client.post(
        url(approval.approval_id), {"decision": "always"}, HTTP_ACCEPT="application/json"
    )
    assert response.json() == {"resolved": True, "status": "allowed", "reason": "always_allow"}
    assert conversation.rules.active().filter(tool="python", pattern="").count() == 1


@pytest.mark.parametrize("field", ["decision", "note"])
def test_a_repeated_parameter_is_400_not_last_one_wins(alice_client, approval, field):
    data = {"decision": "deny", "note": "n", field: ["deny", "allow"]}
    response = alice_client.post(url(approval.approval_id), data, HTTP_ACCEPT="application/json")
    assert response.status_code == 400
    assert response.json() == {"error": f"{field} must be given once"}
    assert ToolApproval.objects.get(pk=approval.pk).status == "pending"


def test_the_proxys_repeat_of_the_deciding_request_answers_as_its_first_copy(
    alice_client, approval, settings
):
    """nginx sends a POST on to the next process when the one that took it
    stopped before answering (a restart): a decision it had recorded must
    not come back to its member as a 409."""
    settings.STUDIO_HTTPS = True  # the proxy's X-Request-ID is trusted
    approval.run_id = run_id = str(uuid.uuid4())
    approval.save(update_fields=["run_id"])
    woken = []

    def wake(sender, *, run_ids, **kwargs):
        woken.append(set(run_ids))

    def post(decision: str, request_id: str):
        return alice_client.post(
            url(approval.approval_id),
            {"decision": decision, "note": "no"},
            HTTP_ACCEPT="application/json",
            HTTP_X_REQUEST_ID=request_id,
            secure=True,
        )

    assert post("deny", "req-1").status_code == 200
    first = ToolApproval.objects.get(pk=approval.pk)
    assert first.decided_request_id == "req-1"

    calls_settled.connect(wake)
    try:
        repeat = post("deny", "req-1")
    finally:
        calls_settled.disconnect(wake)
    assert repeat.status_code == 200
    assert repeat.json() == {"resolved": True, "status": "denied", "reason": "user"}
    # Its first copy's process may have gone before it let the run go on.
    assert woken == [{run_id}]

    # Another request, or another decision under the same id, is a replay.
    assert post("deny", "req-2").status_code == 409
    assert post("allow", "req-1").status_code == 409
    after = ToolApproval.objects.get(pk=approval.pk)
    assert (after.status, after.decided_at, after.decided_request_id) == (
        "denied",
        first.decided_at,
        "req-1",
    )


def test_an_untrusted_request_id_never_makes_a_repeat(alice_client, approval, settings):
    settings.STUDIO_HTTPS = False  # no trusted proxy: each request gets its own id
    answers = [
        alice_client.post(
            url(approval.approval_id), {"decision": "deny"}, HTTP_X_REQUEST_ID="chosen"
        )
        for _ in range(2)
    ]
    assert [a.status_code for a in answers] == [302, 409]
    row = ToolApproval.objects.get(pk=approval.pk)
    assert row.decided_request_id == answers[0]["X-Request-ID"] != "chosen"


# --- issue 52: allow a python call in a fresh interpreter -------------------------------------


@pytest.mark.parametrize(
    ("tool", "decision", "status", "fresh"),
    [
        ("python", "allow", 200, True),
        ("python", "deny", 400, False),
        ("terminal", "allow", 400, False),
    ],
)
def test_fresh_goes_with_an_allow_of_a_python_call(alice, tool, decision, status, fresh):
    from tests.factories import make_conversation

    row = make_approval(make_conversation(alice), tool_name=tool, arguments={"code": "1"})
    client = Client()
    client.force_login(alice)
    answer = client.post(
        f"/approvals/{row.approval_id}/decide/",
        {"decision": decision, "fresh": "1"},
        HTTP_ACCEPT="application/json",
    )
    assert answer.status_code == status
    row = ToolApproval.objects.get(pk=row.pk)
    assert row.fresh_interpreter is fresh
    assert row.status == ("allowed" if status == 200 else "pending")

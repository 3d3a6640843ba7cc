"""/api/v1/: tokens, asking, rules, idempotency, results and bad input.

Through Django's test client (the views) and Channels' HTTP communicator
(the long poll, on the event loop); real processes: tests/faults/test_api_processes.py.
"""

from __future__ import annotations

import json
import threading

import pytest
from channels.testing import HttpCommunicator
from django.db import connections
from django.test import Client

from approvals.models import ApiToken, ToolApproval, ToolRule, arguments_hash
from approvals.services.api import token_authenticate, token_create
from approvals.services.decisions import InvalidDecision, approval_decide
from chat.models import Conversation
from studio.asgi import application
from tests.factories import make_reviewer, make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anydb]


@pytest.fixture
def token(alice):
    token, secret = token_create(user=alice, name="laptop")
    token.secret = secret
    return token


def ask(secret: str | None, body: object, **headers) -> object:
    client = Client()
    if secret is not None:
        headers["authorization"] = f"Bearer {secret}"
    raw = body if isinstance(body, bytes | str) else json.dumps(body)
    return client.post("/api/v1/approvals", raw, content_type="application/json", headers=headers)


def test_a_token_is_shown_once_and_kept_as_a_hash(alice, token):
    row = ApiToken.objects.get(pk=token.pk)
    assert token.secret.startswith("studio_" + row.lookup + "_")
    assert token.secret.split("_", 2)[2] not in json.dumps(
        list(ApiToken.objects.values().filter(pk=token.pk)), default=str
    )
    assert row.secret_sha256 == ApiToken.secret_hash(token.secret.split("_", 2)[2])
    # Its calls wait in a conversation of its own, out of the member's chats.
    assert row.conversation.for_api and row.conversation.owner == alice
    assert not Conversation.objects.owned_by(alice).filter(pk=row.conversation_id).exists()


def test_a_pending_call_waits_in_the_members_inbox(alice, token, alice_client):
    answer = ask(token.secret, {"tool": "deploy", "arguments": {"env": "prod"}, "title": "Ship"})
    assert answer.status_code == 201, answer.content
    data = answer.json()
    assert data["status"] == "pending" and data["tool"] == "deploy"
    assert answer["Location"] == f"/api/v1/approvals/{data['id']}"
    row = ToolApproval.objects.get(approval_id=data["id"])
    assert row.source == "api" and row.api_token_id == token.pk and row.requested_by == alice
    page = alice_client.get("/approvals/")
    assert data["id"] in page.content.decode()
    assert "Ship · via API (laptop)" in page.content.decode()
    assert ApiToken.objects.get(pk=token.pk).uses == 1


def test_a_deny_rule_answers_403_naming_it(alice, token):
    ToolRule.objects.create(
        tool="terminal", pattern="rm *", action="deny", scope="everyone", note="no deletes"
    )
    answer = ask(token.secret, {"tool": "terminal", "arguments": {"command": "ls; rm -rf /"}})
    assert answer.status_code == 403
    data = answer.json()
    assert data["status"] == "denied" and data["reason"] == "rule"
    assert data["rule"]["note"] == "no deletes" and data["rule"]["pattern"] == "rm *"
    row = ToolApproval.objects.get(approval_id=data["id"])
    assert row.status == "denied" and row.source == "api"


def test_an_allow_rule_answers_at_once_but_only_for_what_bash_runs(alice, token):
    ToolRule.objects.create(tool="terminal", pattern="ls*", action="allow", scope="everyone")
    allowed = ask(token.secret, {"tool": "terminal", "arguments": {"command": "ls -la"}})
    assert allowed.status_code == 201 and allowed.json()["status"] == "allowed"
    assert allowed.json()["approved_arguments"] == {"command": "ls -la"}
    # A builtin that evaluates its words is not a plain "ls": a person decides.
    sneaky = ask(token.secret, {"tool": "terminal", "arguments": {"command": "ls; curl x | sh"}})
    assert sneaky.status_code == 201 and sneaky.json()["status"] == "pending"


def test_a_review_rule_waits_for_a_reviewer_not_the_member(alice, token):
    ToolRule.objects.create(tool="deploy", action="review", scope="everyone")
    data = ask(token.secret, {"tool": "deploy", "arguments": {"env": "prod"}}).json()
    assert data["status"] == "pending" and data["needs_review"] is True
    row = ToolApproval.objects.get(approval_id=data["id"])
    assert row.rights(alice).allow is False
    reviewer = make_reviewer("rita")
    assert row.rights(reviewer).allow is True


def test_an_edit_reaches_the_agent_with_its_hash(alice, token):
    data = ask(
        token.secret,
        {
            "tool": "deploy",
            "arguments": {"env": "prod"},
            "schema": {"type": "object", "properties": {"env": {"type": "string"}}},
        },
    ).json()
    with pytest.raises(InvalidDecision, match="do not fit the tool"):
        approval_decide(approval_id=data["id"], user=alice, decision="edit", arguments={"env": 1})
    approval_decide(
        approval_id=data["id"], user=alice, decision="edit", arguments={"env": "staging"}
    )
    answer = ToolApproval.objects.get(approval_id=data["id"]).api_answer()
    assert answer["status"] == "allowed" and answer["edited"] is True
    assert answer["approved_arguments"] == {"env": "staging"}
    assert answer["approved_sha256"] == arguments_hash({"env": "staging"})
    assert answer["arguments"] == {"env": "prod"}


def test_the_schema_is_for_members_and_tokens(alice_client, token):
    assert Client().get("/api/v1/schema").status_code == 401
    for answer in (
        alice_client.get("/api/v1/schema"),
        Client().get("/api/v1/schema", headers={"authorization": f"Bearer {token.secret}"}),
    ):
        assert answer.status_code == 200
        schema = answer.json()
        assert schema["openapi"].startswith("3.1")
        assert {"/approvals", "/approvals/{id}", "/approvals/{id}/result"} <= set(schema["paths"])


def test_a_replayed_key_answers_with_the_same_row(token):
    body = {"tool": "deploy", "arguments": {"env": "prod"}, "idempotency_key": "job-41"}
    first = ask(token.secret, body)
    again = ask(token.secret, body)
    assert first.status_code == 201 and again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert ToolApproval.objects.filter(idempotency_key="job-41").count() == 1
    other = ask(token.secret, {**body, "arguments": {"env": "dev"}})
    assert other.status_code == 409 and "another call" in other.json()["error"]


def test_two_requests_with_one_key_at_once_make_one_row(token):
    body = {"tool": "deploy", "arguments": {"env": "prod"}, "idempotency_key": "once"}
    start = threading.Barrier(2, timeout=10)
    answers = []

    def one() -> None:
        try:
            start.wait()
            answers.append(ask(token.secret, body))
        finally:
            connections.close_all()  # this thread's own, before the database goes

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(a.status_code for a in answers) == [200, 201]
    assert len({a.json()["id"] for a in answers}) == 1
    assert ToolApproval.objects.filter(idempotency_key="once").count() == 1


def test_a_revoked_token_is_refused(alice, token, alice_client):
    page = alice_client.post(f"/approvals/tokens/{token.pk}/revoke/")
    assert page.status_code == 302
    answer = ask(token.secret, {"tool": "deploy"})
    assert answer.status_code == 401 and answer["WWW-Authenticate"].startswith("Bearer")
    assert token_authenticate(f"Bearer {token.secret}") is None


def test_another_members_token_cannot_be_revoked(bob, token):
    client = Client()
    client.force_login(bob)
    assert client.post(f"/approvals/tokens/{token.pk}/revoke/").status_code == 404
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None


def test_the_member_makes_a_token_and_sees_it_once(alice_client):
    made = alice_client.post("/approvals/tokens/", {"name": "ci"})
    assert made.status_code == 405  # (the list is GET; making one is tokens/new/)
    made = alice_client.post("/approvals/tokens/new/", {"name": "nightly job"})
    assert made.status_code == 201
    token = ApiToken.objects.get(name="nightly job")
    html = made.content.decode()
    secret = html.split('id="token-secret" class="token-secret">')[1].split("<")[0]
    assert token_authenticate(f"Bearer {secret}").pk == token.pk
    assert secret not in alice_client.get("/approvals/tokens/").content.decode()
    assert alice_client.post("/approvals/tokens/new/", {"name": ""}).status_code == 400


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"arguments": {}}, 400, "tool must be"),
        ({"tool": "a b"}, 400, "tool must be"),
        ({"tool": "deploy", "arguments": [1]}, 400, "arguments must be a JSON object"),
        ({"tool": "deploy", "arguments": {"x": "y" * 70_000}}, 400, "at most 65536 bytes"),
        ({"tool": "deploy", "bogus": 1}, 400, "unknown field: bogus"),
        ({"tool": "deploy", "timeout": 0}, 400, "timeout must be"),
        ({"tool": "deploy", "context_url": "javascript:alert(1)"}, 400, "context_url"),
        ({"tool": "deploy", "schema": {"type": 5}}, 400, "not a valid JSON Schema"),
        ({"tool": "terminal", "arguments": {"cmd": "ls"}}, 400, "do not fit the terminal"),
        ([1, 2], 400, "JSON object"),
        ("{not json", 400, "not valid JSON"),
    ],
)
def test_bad_input_gets_a_precise_400_and_no_row(token, body, status, words):
    answer = ask(token.secret, body)
    assert answer.status_code == status, answer.content
    assert words in answer.json()["error"]
    assert not ToolApproval.objects.exists()


def test_no_token_no_session_no_csrf(alice, alice_client, token):
    assert ask(None, {"tool": "deploy"}).status_code == 401
    assert ask("studio_nope", {"tool": "deploy"}).status_code == 401
    wrong = token.secret[:-1] + ("B" if token.secret.endswith("A") else "A")
    assert ask(wrong, {"tool": "deploy"}).status_code == 401
    # A signed-in browser's cookie is not a token: a page cannot ask for a member.
    answer = alice_client.post(
        "/api/v1/approvals", json.dumps({"tool": "deploy"}), content_type="application/json"
    )
    assert answer.status_code == 401
    assert not ToolApproval.objects.exists()
    big = ask(token.secret, "x" * 300_000)
    assert big.status_code == 413


def test_a_result_is_kept_once_and_only_for_an_allowed_call(alice, token):
    data = ask(token.secret, {"tool": "deploy", "arguments": {"env": "prod"}}).json()
    client = Client(headers={"authorization": f"Bearer {token.secret}"})
    url = f"/api/v1/approvals/{data['id']}/result"
    report = {"exit_status": 0, "output": "deployed\n", "seconds": 1.5}
    early = client.post(url, report, content_type="application/json")
    assert early.status_code == 409 and "not allowed" in early.json()["error"]
    approval_decide(approval_id=data["id"], user=alice, decision="allow")
    kept = client.post(url, report, content_type="application/json")
    assert kept.status_code == 200 and kept.json()["result_recorded"] is True
    row = ToolApproval.objects.get(approval_id=data["id"])
    assert row.run_outcome == "ok" and row.output_summary == "deployed\n"
    assert row.run_seconds == 1.5 and row.started_at is not None
    again = client.post(url, report, content_type="application/json")
    assert again.status_code == 409
    bad = client.post(url, {"exit_status": "0"}, content_type="application/json")
    assert bad.status_code == 400


def test_another_tokens_approval_is_unknown(bob, token):
    data = ask(token.secret, {"tool": "deploy"}).json()
    _, other = token_create(user=bob, name="bob's")
    client = Client(headers={"authorization": f"Bearer {other}"})
    answer = client.post(
        f"/api/v1/approvals/{data['id']}/result",
        {"exit_status": 0},
        content_type="application/json",
    )
    assert answer.status_code == 404


def test_an_always_allow_on_an_api_card_answers_the_next_call(alice, token):
    data = ask(token.secret, {"tool": "terminal", "arguments": {"command": "make test"}}).json()
    approval_decide(approval_id=data["id"], user=alice, decision="always", pattern="make test")
    again = ask(token.secret, {"tool": "terminal", "arguments": {"command": "make test"}})
    assert again.status_code == 201 and again.json()["status"] == "allowed"
    assert again.json()["reason"] == "rule"
    # The rule is the token's conversation's: another token of hers still asks.
    _, other = token_create(user=alice, name="other")
    elsewhere = ask(other, {"tool": "terminal", "arguments": {"command": "make test"}})
    assert elsewhere.json()["status"] == "pending"


# -- the long poll, on the event loop ------------------------------------------------------


async def long_poll(secret: str, approval_id: str, wait: float) -> tuple[int, dict]:
    communicator = HttpCommunicator(
        application,
        "GET",
        f"/api/v1/approvals/{approval_id}",
        headers=[(b"authorization", f"Bearer {secret}".encode())],
    )
    communicator.scope["query_string"] = f"wait={wait}".encode()
    response = await communicator.get_response(timeout=wait + 10)
    return response["status"], json.loads(response["body"] or b"{}")


@pytest.mark.asyncio
async def test_a_long_poll_returns_when_the_call_is_decided(rt, alice, token):
    import asyncio

    from asgiref.sync import sync_to_async

    data = await sync_to_async(ask)(token.secret, {"tool": "deploy"})
    approval_id = data.json()["id"]
    status, now = await long_poll(token.secret, approval_id, 0)
    assert status == 200 and now["status"] == "pending"
    waiting = asyncio.ensure_future(long_poll(token.secret, approval_id, 30))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    loop = asyncio.get_running_loop()
    decided_at = loop.time()
    await sync_to_async(approval_decide)(approval_id=approval_id, user=alice, decision="allow")
    status, answer = await asyncio.wait_for(waiting, 10)
    # Woken by the card's message, not by the fallback read two seconds on.
    assert loop.time() - decided_at < 1.0
    assert status == 200 and answer["status"] == "allowed" and answer["decided_by"] == "alice"


@pytest.mark.asyncio
async def test_a_long_poll_refuses_bad_asks(rt, token, bob):
    from asgiref.sync import sync_to_async

    data = await sync_to_async(ask)(token.secret, {"tool": "deploy"})
    approval_id = data.json()["id"]
    assert (await long_poll(token.secret, approval_id, 61))[0] == 400
    assert (await long_poll(token.secret, "no-such-id", 0))[0] == 404
    _, other = await sync_to_async(token_create)(user=bob, name="b")
    assert (await long_poll(other, approval_id, 0))[0] == 404
    assert (await long_poll("studio_x", approval_id, 0))[0] == 401
    user = await sync_to_async(make_user)("carol")
    assert user.pk


# -- callbacks -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, words",
    [
        ("http://127.0.0.1:9/hook", "127.0.0.1 is a loopback address"),
        ("http://localhost/hook", "loopback address"),
        ("http://[::ffff:10.0.0.1]/x", "wrapping 10.0.0.1"),
        ("http://169.254.169.254/latest/meta-data", "link-local address"),
        ("ftp://example.com/x", "must be an http or https URL"),
        ("http://no-such-host.invalid/x", "cannot resolve"),
    ],
)
def test_a_callback_to_a_private_address_is_refused(token, url, words):
    answer = ask(token.secret, {"tool": "deploy", "callback_url": url})
    assert answer.status_code == 400 and words in answer.json()["error"], answer.json()
    assert not ToolApproval.objects.exists()


def test_the_decision_is_posted_signed_and_retried(alice, token, settings):
    from studio_approvals import verify_callback

    from tests.helpers.procs import until
    from tests.helpers.receiver import Receiver

    with Receiver(fail_first=1) as receiver:
        port = receiver.server.server_address[1]
        # An intranet receiver an admin allows (loopback stands in for it).
        settings.STUDIO_API_CALLBACK_ALLOW_HOSTS = [f"127.0.0.1:{port}"]
        data = ask(token.secret, {"tool": "deploy", "callback_url": receiver.url}).json()
        approval_decide(approval_id=data["id"], user=alice, decision="deny", note="not today")
        posts = receiver.wait_for(2, timeout=15)  # the first answered 500: tried again
        assert posts[0] == posts[1]
        headers, body = receiver.requests[1]
        decided = verify_callback(token.secret, body, headers["Studio-Signature"])
        assert decided["event"] == "approval.decided"
        assert decided["approval"]["status"] == "denied"
        assert decided["approval"]["note"] == "not today"
        with pytest.raises(ValueError, match="does not match"):
            verify_callback(token.secret, body + b" ", headers["Studio-Signature"])
        row = until(
            lambda: ToolApproval.objects.filter(
                approval_id=data["id"], callback_result__startswith="delivered"
            ).first(),
            "the callback's outcome on the row",
            10,
        )
        assert row.callback_result == "delivered (attempt 2, HTTP 200)"
        # One POST per decision, however many processes look.
        from approvals.callbacks import callbacks_tick

        assert callbacks_tick() == 0
        assert len(receiver.posts) == 2


def test_purge_treats_api_calls_like_the_others(alice, token, tmp_path):
    from datetime import timedelta

    from django.core.management import call_command
    from django.utils import timezone

    old = ask(token.secret, {"tool": "deploy", "arguments": {"n": 1}}).json()
    new = ask(token.secret, {"tool": "deploy", "arguments": {"n": 2}}).json()
    waiting = ask(token.secret, {"tool": "deploy", "arguments": {"n": 3}}).json()
    for data in (old, new):
        approval_decide(approval_id=data["id"], user=alice, decision="allow")
    long_ago = timezone.now() - timedelta(days=120)
    ToolApproval.objects.filter(approval_id=old["id"]).update(
        requested_at=long_ago, decided_at=long_ago
    )
    ToolApproval.objects.filter(approval_id=waiting["id"]).update(requested_at=long_ago)
    archive = tmp_path / "archive.jsonl"
    call_command(
        "purge_approvals", "--older-than", "90", "--expire-pending-older-than", "30",
        "--archive", str(archive),
    )  # fmt: skip
    left = dict(ToolApproval.objects.values_list("approval_id", "status"))
    assert old["id"] not in left and left[new["id"]] == "allowed"
    assert left[waiting["id"]] == "denied"  # expired, as a chat call would be
    assert old["id"] in archive.read_text()
    # The token and its conversation stay: it goes on asking.
    assert ask(token.secret, {"tool": "deploy", "arguments": {"n": 4}}).status_code == 201


def test_the_audit_export_names_the_source_and_token_in_their_columns(alice, token):
    import csv

    data = ask(token.secret, {"tool": "deploy", "title": "Ship"}).json()
    approval_decide(approval_id=data["id"], user=alice, decision="allow")
    client = Client(headers={"authorization": f"Bearer {token.secret}"})
    report = {"exit_status": 3, "output": "boom", "seconds": 2}
    client.post(f"/api/v1/approvals/{data['id']}/result", report, content_type="application/json")
    admin = Client()
    admin.force_login(make_user("root", superuser=True))
    row_pk = ToolApproval.objects.get(approval_id=data["id"]).pk
    exported = admin.post(
        "/admin/approvals/toolapproval/", {"action": "export_csv", "_selected_action": [row_pk]}
    ).content.decode()
    header, row = list(csv.reader(exported.splitlines()))
    # Every column holds its own field (three once sat one place off).
    assert len(row) == len(header)
    cell = dict(zip(header, row, strict=True))
    assert cell["source"] == "api" and cell["api_token"].startswith("laptop (studio_")
    assert cell["title"] == "Ship" and cell["run_outcome"] == "failed"
    assert cell["run_seconds"] == "2.000" and cell["output_size"] == "4"
    listing = admin.get("/admin/approvals/toolapproval/?source__exact=api").content.decode()
    assert "API: laptop" in listing
    dashboard = admin.get("/admin/approvals/toolapproval/dashboard/").content.decode()
    assert "Where calls were asked" in dashboard and "API: laptop (alice)" in dashboard


def test_an_admin_makes_a_token_for_a_member_and_revokes_it(alice):
    admin = Client()
    root = make_user("root", superuser=True)
    admin.force_login(root)
    made = admin.post(
        "/admin/approvals/apitoken/add/", {"user": alice.pk, "name": "ci runner"}, follow=True
    )
    assert made.status_code == 200
    token = ApiToken.objects.get(name="ci runner")
    assert token.user == alice and token.created_by == root and token.conversation.for_api
    html = made.content.decode()
    secret = html.split("The token for alice: ")[1].split(" ")[0]
    assert token_authenticate(f"Bearer {secret}").pk == token.pk
    # Never shown again, and never editable.
    page = admin.get(f"/admin/approvals/apitoken/{token.pk}/change/").content.decode()
    assert secret not in page and secret.split("_", 2)[2] not in page
    admin.post(
        "/admin/approvals/apitoken/",
        {"action": "revoke_tokens", "_selected_action": [token.pk]},
    )
    token.refresh_from_db()
    assert token.revoked_at is not None and token.revoked_by == root
    assert token_authenticate(f"Bearer {secret}") is None


def test_a_member_with_tokens_can_be_deleted(alice, token):
    ask(token.secret, {"tool": "deploy"})
    alice.delete()
    assert not ApiToken.objects.exists() and not ToolApproval.objects.exists()


def test_a_tokens_conversation_is_not_deleted_under_it(token):
    from django.db.models import RestrictedError

    with pytest.raises(RestrictedError):
        token.conversation.delete()


def test_where_django_alone_serves_the_call_is_read_without_waiting(token, bob):
    data = ask(token.secret, {"tool": "deploy"}).json()
    client = Client(headers={"authorization": f"Bearer {token.secret}"})
    now = client.get(f"/api/v1/approvals/{data['id']}")
    assert now.status_code == 200 and now.json()["status"] == "pending"
    waiting = client.get(f"/api/v1/approvals/{data['id']}?wait=30")
    assert waiting.status_code == 400 and "route /api/v1/ to daphne" in waiting.json()["error"]
    _, other = token_create(user=bob, name="b")
    foreign = Client(headers={"authorization": f"Bearer {other}"})
    assert foreign.get(f"/api/v1/approvals/{data['id']}").status_code == 404
    assert Client().get(f"/api/v1/approvals/{data['id']}").status_code == 401

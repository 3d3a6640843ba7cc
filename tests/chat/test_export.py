"""A conversation exported: Markdown for people, JSON with its approval rows."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from approvals.models import ToolApproval, arguments_hash
from chat.models import Message
from tests.factories import make_approval, make_conversation, make_run, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def chat(alice):
    conversation = make_conversation(alice, title="Budget")
    run = make_run(conversation, status="done")
    Message.objects.create(conversation=conversation, run=run, role="user", content="sum it")
    arguments = {"code": "print(1 + 1)"}
    Message.objects.create(
        conversation=conversation,
        run=run,
        role="assistant",
        content="Let me run it.",
        tool_calls=[{"id": "c1", "name": "python", "arguments": arguments}],
    )
    approval = make_approval(
        conversation, arguments=arguments, tool_call_id="c1", run_id=str(run.pk),
        status="allowed", reason="user", decided_by=alice, note="fine",
    )  # fmt: skip
    Message.objects.create(
        conversation=conversation, run=run, role="tool", content="2\n```\nfence",
        tool_call_id="c1", tool_name="python", tool_arguments=arguments,
        approval_id=approval.approval_id,
    )  # fmt: skip
    Message.objects.create(conversation=conversation, run=run, role="assistant", content="It is 2.")
    return conversation


def owner_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_owner_exports_json_with_every_approval_field(chat, alice):
    response = owner_client(alice).get(f"/c/{chat.pk}/export.json")
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="conversation-{chat.pk}.json"'
    document = json.loads(response.content)
    assert document["conversation"]["title"] == "Budget"
    assert [m["role"] for m in document["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert document["messages"][1]["tool_calls"][0]["name"] == "python"
    [row] = document["approvals"]
    stored = ToolApproval.objects.get()
    assert (row["approval_id"], row["status"], row["reason"], row["note"]) == (
        stored.approval_id, "allowed", "user", "fine",
    )  # fmt: skip
    assert row["arguments_sha256"] == arguments_hash({"code": "print(1 + 1)"})
    assert row["decided_by_id"] == alice.pk


def test_the_owner_exports_markdown_a_person_reads(chat, alice):
    response = owner_client(alice).get(f"/c/{chat.pk}/export.md")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/markdown")
    text = response.content.decode()
    assert text.startswith("# Budget\n")
    assert "**You**" in text and "sum it" in text and "It is 2." in text
    assert "**python** call (Allowed)" in text
    # The output holds a fence of its own: the export's fence is longer.
    assert "````\n2\n```\nfence\n````" in text


def test_nobody_else_exports_it(chat, bob):
    client = owner_client(bob)
    assert client.get(f"/c/{chat.pk}/export.json").status_code == 404
    assert client.get(f"/c/{chat.pk}/export.md").status_code == 404
    assert Client().get(f"/c/{chat.pk}/export.json").status_code == 302  # login first


def test_an_unknown_kind_is_a_404(chat, alice):
    assert owner_client(alice).get(f"/c/{chat.pk}/export.pdf").status_code == 404


def test_staff_export_conversations_from_the_admin(chat, alice):
    other = make_conversation(alice, title="Other")
    admin = make_user("root", superuser=True)
    response = owner_client(admin).post(
        "/admin/chat/conversation/",
        {"action": "export_json", "_selected_action": [chat.pk, other.pk]},
    )
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    documents = json.loads(response.content)
    assert [d["conversation"]["title"] for d in documents] == ["Budget", "Other"]
    assert len(documents[0]["approvals"]) == 1


def test_an_earlier_version_is_exported_and_says_so(chat, alice):
    from django.utils import timezone

    Message.objects.filter(conversation=chat, content="It is 2.").update(
        superseded_at=timezone.now()
    )
    client = owner_client(alice)
    text = client.get(f"/c/{chat.pk}/export.md").content.decode()
    assert "(earlier version: replaced by an edit or a regenerate):\n\nIt is 2." in text
    document = json.loads(client.get(f"/c/{chat.pk}/export.json").content)
    assert [m["superseded_at"] is not None for m in document["messages"]] == [
        False, False, False, True,
    ]  # fmt: skip

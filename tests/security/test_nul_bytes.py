"""NUL characters (PostgreSQL refuses them) from every door: never a 500, never a crashed run.

Marked ``anydb``: the point is the PostgreSQL pass, where an unstripped NUL
is an error, not just an odd character.
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from approvals.models import ToolApproval
from chat.models import Message, Run
from tests.factories import make_approval
from tests.helpers.driver import AgentDriver
from tests.helpers.scripted import ScriptedModel, call
from tests.helpers.sockets import open_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anydb]


def test_a_note_with_nul_is_stored_without_it(conversation, alice):
    approval = make_approval(conversation)
    client = Client()
    client.force_login(alice)
    response = client.post(
        f"/approvals/{approval.approval_id}/decide/",
        {"decision": "deny", "note": "no\x00pe"},
        HTTP_ACCEPT="application/json",
    )
    assert response.status_code == 200
    approval.refresh_from_db()
    assert (approval.status, approval.note) == ("denied", "nope")


def test_tool_output_and_arguments_with_nul_are_stored_without_it(conversation, alice):
    conversation.confirm_tool_calls = False
    conversation.save()
    model = ScriptedModel(
        [("", [call("python", {"code": "print('a\\x00b')"})]), ("done\x00 now", [])]
    )
    from tests.factories import make_run

    driver = AgentDriver.start(
        conversation=conversation, model=model, user=alice, run=make_run(conversation)
    )
    driver.finish()
    result = Message.objects.get(role="tool")
    assert result.content.strip() == "ab"
    assert "\x00" not in Message.objects.filter(role="assistant").last().content


@pytest.mark.asyncio
async def test_a_socket_message_with_nul_starts_a_run_without_it(conversation, alice, rt):
    # (``rt``: its own runtime, stopped after, as every test whose run steps here.)
    comm, connected, _ = await open_socket(conversation.pk, alice)
    assert connected
    await comm.receive_from(timeout=10)
    await comm.send_to(text_data=json.dumps({"message": "hel\x00lo"}))
    while 'data-running="false"' not in await comm.receive_from(timeout=15):
        pass
    await comm.disconnect()
    first = await sync_to_async(lambda: Message.objects.filter(role="user").get().content)()
    assert first == "hello"
    assert await sync_to_async(Run.objects.filter(status="done").count)() == 1
    assert not await sync_to_async(ToolApproval.objects.exists)()

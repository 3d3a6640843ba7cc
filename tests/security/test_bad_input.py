"""Hostile input: only 4xx, never a 500, never a changed row."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from approvals.models import ToolApproval
from chat.models import Message, Run
from tests.factories import make_approval, make_conversation, make_user
from tests.helpers.sockets import open_socket

pytestmark = pytest.mark.django_db(transaction=True)

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
VALID = {"allow", "always", "deny"}


@pytest.fixture
def world():
    alice, bob = make_user("alice"), make_user("bob")
    mine = make_approval(make_conversation(alice))
    theirs = make_approval(make_conversation(bob))
    client = Client(raise_request_exception=False)
    client.force_login(alice)
    return {"alice": alice, "mine": mine, "theirs": theirs, "client": client}


def snapshot() -> list[tuple]:
    return list(
        ToolApproval.objects.order_by("pk").values_list(
            "pk", "status", "reason", "decided_by", "decided_at", "note"
        )
    )


ids = st.one_of(
    st.sampled_from(["mine", "theirs"]),
    st.text(min_size=1, max_size=80).filter(lambda s: s.strip("/.") != ""),
)


@FUZZ
@given(
    approval=ids,
    decision=st.one_of(st.text(max_size=30), st.sampled_from(sorted(VALID))),
    note=st.text(max_size=3000),
    accept=st.sampled_from(["", "application/json", "text/html", "*/*"]),
    htmx=st.booleans(),
)
def test_decision_endpoint_fuzz(world, approval, decision, note, accept, htmx):
    target = world[approval].approval_id if approval in ("mine", "theirs") else approval
    # The one input that may legitimately change a row: a valid decision on
    # alice's own pending approval with an acceptable note.
    assume(not (approval == "mine" and decision in VALID and len(note.strip()) <= 2000))
    before = snapshot()
    headers = {"HTTP_ACCEPT": accept} if accept else {}
    if htmx:
        headers["HTTP_HX_REQUEST"] = "true"
    url = f"/approvals/{quote(target, safe='')}/decide/"
    response = world["client"].post(url, {"decision": decision, "note": note}, **headers)
    assert 400 <= response.status_code < 500, (response.status_code, url, decision)
    assert snapshot() == before


@FUZZ
@given(
    body=st.binary(max_size=4096),
    content_type=st.sampled_from(
        [
            "application/json",
            "text/plain",
            "multipart/form-data; boundary=x",
            "application/x-www-form-urlencoded",
            "application/octet-stream",
            "",
            "x/y; charset=nope",
        ]
    ),
)
def test_decision_endpoint_garbage_bodies(world, body, content_type):
    before = snapshot()
    response = world["client"].generic(
        "POST", reverse("approvals:decide", args=[world["mine"].approval_id]), body, content_type
    )
    assert 400 <= response.status_code < 500
    assert snapshot() == before


def test_huge_body_is_refused(world):
    before = snapshot()
    response = world["client"].post(
        reverse("approvals:decide", args=[world["mine"].approval_id]),
        {"decision": "deny", "note": "x" * (3 * 1024 * 1024)},
    )
    assert response.status_code in (400, 413)
    assert snapshot() == before


def test_foreign_and_unknown_ids_look_the_same(world):
    client = world["client"]
    foreign = client.post(
        reverse("approvals:decide", args=[world["theirs"].approval_id]), {"decision": "allow"}
    )
    unknown = client.post(reverse("approvals:decide", args=["A" * 22]), {"decision": "allow"})
    assert foreign.status_code == unknown.status_code == 404
    assert foreign.content == unknown.content


# --- WebSocket frames ---------------------------------------------------------------


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=10,
)
frames = st.one_of(
    # (WebsocketCommunicator cannot send an empty text frame.)
    st.text(min_size=1, max_size=200),
    json_values.map(json.dumps),
    st.fixed_dictionaries(
        {"action": st.one_of(st.text(max_size=20), st.integers(), st.none())},
        optional={"message": json_values},
    ).map(json.dumps),
    st.fixed_dictionaries(
        {"message": st.one_of(st.integers(), st.lists(st.text()), st.none())}
    ).map(json.dumps),
)


@FUZZ
@given(frame=frames)
def test_websocket_frames_fuzz(world, frame):

    try:
        data = json.loads(frame)
    except ValueError:
        data = None
    # A well-formed message would legitimately start a run; everything else
    # must be answered with a notice and change nothing.
    assume(
        not (
            isinstance(data, dict)
            and data.get("action", "send") == "send"
            and isinstance(data.get("message"), str)
        )
    )
    assume(not (isinstance(data, dict) and data.get("action") == "stop"))
    conversation_id = world["mine"].conversation_id
    cookie = world["client"].cookies["sessionid"].value

    async def exchange() -> str:
        comm, connected, _ = await open_socket(conversation_id, cookie=f"sessionid={cookie}")
        assert connected
        await comm.receive_from(timeout=10)  # catch-up
        await comm.send_to(text_data=frame)
        reply = await comm.receive_from(timeout=10)
        await comm.disconnect()
        return reply

    before = snapshot()
    reply = async_to_sync(exchange)()
    assert 'id="notice"' in reply and "notice-error" in reply
    assert snapshot() == before
    assert not Message.objects.exists() and not Run.objects.exists()

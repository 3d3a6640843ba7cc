"""Decisions at the right grain: edit then allow, always allow with a pattern, batches."""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from django.test import Client
from django.urls import reverse

from approvals.models import ToolApproval, ToolRule, arguments_hash
from approvals.services.decisions import InvalidDecision, approval_decide, approvals_decide
from approvals.services.rules import approval_verdict
from approvals.services.waiting import approval_request
from chat.agent import EDITED_TEXT
from chat.events import Done, ToolFinished, ToolStarted, TurnAsked
from chat.tools import builtin_tools
from tests.factories import make_approval, make_conversation, make_run
from tests.helpers.driver import AgentDriver
from tests.helpers.races import decide_at_once
from tests.helpers.scripted import ScriptedModel, call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anydb]
BOUND = 10.0
PYTHON_SCHEMA = builtin_tools()["python"].parameters


def pending(conversation, tool="python", arguments=None, **fields):
    arguments = arguments or {"code": "print(1)"}
    return make_approval(
        conversation,
        tool_name=tool,
        arguments=arguments,
        tool_schema=fields.pop("schema", PYTHON_SCHEMA if tool == "python" else {}),
        subject=fields.pop("subject", arguments.get("code") or arguments.get("command", "")),
        **fields,
    )


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- edit ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ('{"code": 42}', "42 is not of type 'string'"),
        ('{"source": "print(1)"}', "'code' is a required property"),
        ('{"code": "1", "extra": 1}', "Additional properties are not allowed"),
        ("[1, 2]", "arguments must be a JSON object"),
        ("{nope", "arguments must be JSON"),
    ],
)
def test_an_edit_that_does_not_fit_the_schema_is_400_and_changes_nothing(
    conversation, alice, arguments, why
):
    approval = pending(conversation)
    response = client_for(alice).post(
        reverse("approvals:decide", args=[approval.approval_id]),
        {"decision": "edit", "arguments": arguments},
        HTTP_ACCEPT="application/json",
    )
    assert response.status_code == 400 and why in response.json()["error"]
    approval.refresh_from_db()
    assert (approval.status, approval.approved_arguments) == ("pending", None)


def test_an_edit_keeps_both_versions_and_their_hashes(conversation, alice):
    approval = pending(conversation)
    response = client_for(alice).post(
        reverse("approvals:decide", args=[approval.approval_id]),
        {"decision": "edit", "arg.code": "print(2)\r\nprint(3)"},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "Allowed with edits" in html and "data-edited" in html
    assert "+print(2)" in html and "-print(1)" in html
    # Each line is its own block: no newline between them (a blank line on screen).
    assert '-print(1)</span><span class="diff-add">+print(2)</span>' in html
    row = ToolApproval.objects.get(pk=approval.pk)
    assert (row.status, row.reason) == ("allowed", "edited")
    assert row.arguments == {"code": "print(1)"}  # the model's, kept
    assert row.approved_arguments == {"code": "print(2)\nprint(3)"}  # CRLF from the form: LF
    assert row.approved_sha256 == arguments_hash(row.approved_arguments)
    assert row.arguments_intact()


def test_an_edit_back_to_the_original_is_a_plain_allow(conversation, alice):
    approval = pending(conversation)
    result = approval_decide(
        approval_id=approval.approval_id, user=alice, decision="edit",
        arguments={"code": "print(1)"},
    )  # fmt: skip
    assert (result.approval.reason, result.approval.approved_arguments) == ("user", None)


def test_an_edit_racing_an_allow_first_one_wins(conversation, alice):
    for _ in range(10):
        approval = pending(conversation)
        got = decide_at_once(
            approval.approval_id, alice, {"edit": {"code": "print('edited')"}, "allow": None}
        )
        results = {kind: result.resolved for kind, result in got.items()}
        assert sorted(results.values()) == [False, True]
        row = ToolApproval.objects.get(pk=approval.pk)
        winner = "edit" if results["edit"] else "allow"
        assert row.reason == ("edited" if winner == "edit" else "user")
        assert (row.approved_arguments is not None) == (winner == "edit")


def test_the_model_sees_the_edited_call_and_the_tool_ran_exactly_it(conversation, alice, settings):
    workspace = conversation.workspace
    turns = [("", [call("python", {"code": "print('model')"}, "c1")]), ("ok", [])]
    driver = AgentDriver.scripted(conversation, alice, turns, run=make_run(conversation))
    model = driver.agent.model
    started = driver.wait_for(ToolStarted)
    edited = {"code": "open('ran.txt', 'w').write('edited'); print('person')"}
    approval_decide(approval_id=started.approval_id, user=alice, decision="edit", arguments=edited)
    result = driver.wait_for(ToolFinished).result
    driver.finish()
    assert result == f"{EDITED_TEXT}\nperson\n"
    assert (workspace / "ran.txt").read_text() == "edited"
    row = ToolApproval.objects.get(approval_id=started.approval_id)
    assert row.approved_sha256 == arguments_hash(edited)
    # The next turn: the call shows the arguments that ran, then the note.
    import json

    assistant, tool = model.seen[1][-2], model.seen[1][-1]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == edited
    assert tool["content"].startswith(EDITED_TEXT)
    assert (
        conversation.messages.get(role="assistant", tool_calls__0__id="c1").tool_calls[0][
            "arguments"
        ]
        == edited
    )


# --- always allow with a pattern ---------------------------------------------------------


def test_always_with_a_pattern_and_a_scope_makes_that_rule(conversation, alice):
    approval = pending(conversation, "terminal", {"command": "ls -la"})
    approval_decide(
        approval_id=approval.approval_id, user=alice, decision="always",
        pattern="ls*", scope="member",
    )  # fmt: skip
    rule = ToolRule.objects.get()
    assert (rule.tool, rule.pattern, rule.scope, rule.member) == (
        "terminal",
        "ls*",
        "member",
        alice,
    )
    elsewhere = make_conversation(alice)
    assert (
        approval_verdict(conversation=elsewhere, tool_name="terminal", subject="ls").action
        == "allow"
    )
    assert (
        approval_verdict(conversation=elsewhere, tool_name="terminal", subject="rm x").action
        == "ask"
    )


@pytest.mark.parametrize(
    ("fields", "why"),
    [({"pattern": "git*"}, "does not match this call"), ({"scope": "everyone"}, "scope must be")],
)
def test_always_refuses_a_rule_that_does_not_fit(conversation, alice, fields, why):
    approval = pending(conversation, "terminal", {"command": "ls -la"})
    with pytest.raises(InvalidDecision, match=why):
        approval_decide(approval_id=approval.approval_id, user=alice, decision="always", **fields)
    assert not ToolRule.objects.exists()
    assert ToolApproval.objects.get(pk=approval.pk).status == "pending"


# --- batches ----------------------------------------------------------------------------


def test_allow_all_and_deny_all(conversation, alice):
    first, second = pending(conversation), pending(conversation, arguments={"code": "2"})
    answer = client_for(alice).post(
        reverse("approvals:decide_batch"),
        {"approval_id": [first.approval_id, second.approval_id], "decision": "deny"},
        HTTP_ACCEPT="application/json",
    )
    assert answer.status_code == 200
    assert [r["status"] for r in answer.json()["results"]] == ["denied", "denied"]
    third = pending(conversation, arguments={"code": "3"})
    answer = client_for(alice).post(
        reverse("approvals:decide_batch"),
        {"approval_id": [first.approval_id, third.approval_id], "decision": "allow"},
        HTTP_ACCEPT="application/json",
    )
    # Mixed: the decided one keeps its deny (first decision wins), the other is allowed.
    assert answer.json()["results"] == [
        {"approval_id": first.approval_id, "resolved": False, "status": "denied", "reason": "user"},
        {"approval_id": third.approval_id, "resolved": True, "status": "allowed", "reason": "user"},
    ]


def test_a_batch_with_someone_elses_ids_says_not_found_and_changes_them_not(
    conversation, alice, bob
):
    mine = pending(conversation)
    theirs = pending(make_conversation(bob))
    answers = approvals_decide(
        approval_ids=[mine.approval_id, theirs.approval_id, "nope"], user=alice, decision="allow"
    )
    assert [a.get("error") for a in answers] == [None, "not found", "not found"]
    assert ToolApproval.objects.get(pk=theirs.pk).status == "pending"
    with pytest.raises(InvalidDecision):
        approvals_decide(approval_ids=[mine.approval_id], user=alice, decision="always")


def test_a_batch_racing_single_decisions_first_wins_per_row(conversation, alice):
    rows = [pending(conversation, arguments={"code": str(i)}) for i in range(8)]
    barrier = threading.Barrier(1 + len(rows), timeout=BOUND)
    wins: dict[str, list[str]] = {r.approval_id: [] for r in rows}
    lock = threading.Lock()

    def batch():
        barrier.wait()
        try:
            for answer in approvals_decide(
                approval_ids=[r.approval_id for r in rows], user=alice, decision="deny"
            ):
                if answer["resolved"]:
                    with lock:
                        wins[answer["approval_id"]].append("batch")
        finally:
            connections.close_all()

    def single(row):
        barrier.wait()
        try:
            if approval_decide(approval_id=row.approval_id, user=alice, decision="allow").resolved:
                with lock:
                    wins[row.approval_id].append("single")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=batch)] + [
        threading.Thread(target=single, args=(r,)) for r in rows
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    for row in rows:
        (winner,) = wins[row.approval_id]  # exactly one decision per row
        status = ToolApproval.objects.get(pk=row.pk).status
        assert status == ("denied" if winner == "batch" else "allowed")


def test_the_calls_of_one_turn_are_asked_together_and_run_in_order(conversation, alice, settings):
    workspace = conversation.workspace
    (workspace / "order.txt").unlink(missing_ok=True)
    calls = [call("terminal", {"command": f"echo {n} >> order.txt"}, f"c{n}") for n in (1, 2, 3)]
    driver = AgentDriver.scripted(
        conversation, alice, [("", calls), ("ok", [])], run=make_run(conversation)
    )
    asked = driver.wait_for(TurnAsked)
    assert len(driver.of(ToolStarted)) == 3 and not driver.of(ToolFinished)
    first, second, third = asked.approval_ids
    # Deciding the later ones first runs nothing: the first still waits.
    approval_decide(approval_id=third, user=alice, decision="allow")
    approval_decide(approval_id=second, user=alice, decision="deny")
    assert not (workspace / "order.txt").exists()
    approval_decide(approval_id=first, user=alice, decision="allow")
    driver.finish()
    assert (workspace / "order.txt").read_text().split() == ["1", "3"]
    results = [e.result.strip() for e in driver.of(ToolFinished)]
    assert results[1] == "The user declined to run this tool call."


# --- Stop racing Allow --------------------------------------------------------------------


def test_stop_after_allow_keeps_a_call_that_has_not_begun_from_beginning(conversation, alice):
    """Issue 54: Stop is a row change every step obeys, whatever its cancel token
    heard. A call allowed but not begun when Stop lands never begins; the row
    keeps its Allow and no start, the model reads that it did not run."""
    from chat.agent import STOPPED_TEXT, Agent, AgentSettings
    from chat.events import Wait
    from chat.models import Run
    from studio.cancel import CancelToken

    workspace = conversation.workspace
    code = {"code": "open('stopped.txt', 'w').write('ran'); print('ran')"}
    model = ScriptedModel([("", [call("python", code)])])
    run = make_run(conversation)
    details = {
        "conversation": conversation, "model": model, "user": alice, "run": run,
        "knobs": AgentSettings.from_django(),
    }  # fmt: skip
    steps = Agent(cancel=CancelToken(), **details).events()
    started = next(e for e in steps if isinstance(e, ToolStarted))
    assert isinstance(next(steps), Wait)
    approval_decide(approval_id=started.approval_id, user=alice, decision="allow")
    # Stop lands before the run's next step: the row says so, its message was lost.
    Run.objects.filter(pk=run.pk).update(stop_requested=True)
    rest = list(Agent(cancel=CancelToken(), **details).events())
    finished = next(e for e in rest if isinstance(e, ToolFinished))
    assert (finished.result, finished.ok) == (STOPPED_TEXT, False)
    assert not (workspace / "stopped.txt").exists()
    assert rest[-1] == Done(cancelled=True)
    row = ToolApproval.objects.get(approval_id=started.approval_id)
    assert (row.status, row.reason, row.started_at) == ("allowed", "user", None)
    assert len(model.seen) == 1  # the run stopped: no next model turn


def test_a_pending_approval_records_its_subject_and_schema(conversation):
    from approvals.services.rules import Verdict

    approval = approval_request(
        conversation=conversation, tool_name="terminal", arguments={"command": "ls"},
        run_id="r", subject="ls", schema={"type": "object"}, verdict=Verdict("ask"),
    )  # fmt: skip
    approval.refresh_from_db()
    assert (approval.subject, approval.tool_schema, approval.rule) == (
        "ls",
        {"type": "object"},
        None,
    )


def test_a_call_that_ran_with_edits_shows_what_ran_first(conversation, alice):
    """Issue 55: the card showed the model's code under CODE and the edit below
    as "ran with edits", and the output began with a line meant for the model."""
    from approvals.notify import card as card_render
    from chat.display import MessageView

    row = make_approval(conversation, arguments={"code": "print('model')"})
    approval_decide(
        approval_id=row.approval_id, user=alice, decision="edit",
        arguments={"code": "print('person')"},
    )  # fmt: skip
    row.refresh_from_db()
    html = card_render(row)
    ran = html.index("print(&#x27;person&#x27;)")
    assert "data-ran" in html and ran < html.index("data-edited")
    assert "the model's version, changed before it ran" in html
    shown = MessageView(pk=1, role="tool", content=f"{EDITED_TEXT}\nperson\n", created_at=None)
    assert shown.shown == "person\n"

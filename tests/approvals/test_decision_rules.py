"""Every decision that changes what runs goes through the rules again (issue 34, part 2).

An edit is a new call: a Deny refuses it (403, naming the rule, the card
still waiting), and a Review sends it to a reviewer. The same holds for a
plain Allow whose call a rule added meanwhile covers, for batches, for
Always allow, and for MCP tools whose schema lets an edit add properties.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from approvals.models import OWN_CALL, ToolApproval, ToolRule
from approvals.services.decisions import DecisionForbidden, approval_decide, approvals_decide
from chat.events import ToolFinished, ToolStarted
from chat.tools import builtin_tools
from studio.wording import REJECTION_TEXT
from tests.factories import make_approval, make_reviewer
from tests.helpers.driver import AgentDriver
from tests.helpers.races import decide_at_once
from tests.helpers.scripted import call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anydb]
BOUND = 10.0
TERMINAL_SCHEMA = builtin_tools()["terminal"].parameters


@pytest.fixture
def reviewer(db):
    return make_reviewer("rita")


@pytest.fixture
def guards(db):
    """An admin's Deny of ``*DENYME*`` and Review of ``*REVIEWME*`` on the terminal."""
    return {
        "deny": ToolRule.objects.create(
            tool="terminal", pattern="*DENYME*", action="deny", note="Never that."
        ),
        "review": ToolRule.objects.create(tool="terminal", pattern="*REVIEWME*", action="review"),
    }


def command_card(conversation, command="echo harmless", **fields):
    arguments = {"command": command}
    return make_approval(
        conversation,
        tool_name="terminal",
        arguments=arguments,
        tool_schema=TERMINAL_SCHEMA,
        subject=command,
        **fields,
    )


def post(user, approval, **data):
    client = Client()
    client.force_login(user)
    return client.post(
        reverse("approvals:decide", args=[approval.approval_id]),
        data,
        HTTP_ACCEPT="application/json",
    )


def test_an_edit_into_a_denied_call_is_refused_naming_the_rule(conversation, alice, guards):
    row = command_card(conversation)
    answer = post(alice, row, decision="edit", arguments='{"command": "echo DENYME > f"}')
    assert answer.status_code == 403
    error = answer.json()["error"]
    assert "*DENYME*" in error and "Never that." in error and "still waits" in error
    row.refresh_from_db()
    assert (row.status, row.approved_arguments, row.needs_review) == ("pending", None, False)
    guards["deny"].refresh_from_db()
    assert guards["deny"].hits == 1


def test_a_denied_edit_hidden_in_the_shell_is_found(conversation, alice, guards):
    row = command_card(conversation)
    for line in ("echo $'\\'' ; echo DENYME ; #'", "bash -c 'echo DENYME'", "ls; echo $(DENYME)"):
        answer = post(alice, row, decision="edit", arguments=f'{{"command": "{_json(line)}"}}')
        assert answer.status_code == 403, line
    assert ToolApproval.objects.get(pk=row.pk).status == "pending"


def _json(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def test_an_edit_into_a_review_call_goes_to_a_reviewer(conversation, alice, reviewer, guards):
    row = command_card(conversation)
    answer = post(alice, row, decision="edit", arguments='{"command": "echo REVIEWME > f"}')
    assert answer.status_code == 202
    assert answer.json() == {
        "resolved": False,
        "status": "pending",
        "reason": "",
        "review": True,
    }
    row.refresh_from_db()
    assert (row.status, row.needs_review, row.rule_id) == ("pending", True, guards["review"].pk)
    assert row.arguments == {"command": "echo harmless"}  # the model's, kept
    assert row.approved_arguments == {"command": "echo REVIEWME > f"}
    # The member cannot allow their own edit now, by any path.
    for decision in ("allow", "edit", "always"):
        refused = post(alice, row, decision=decision, arguments='{"command": "echo ok"}')
        assert refused.status_code == 403, decision
    # A reviewer sees and decides exactly what would run.
    client = Client()
    client.force_login(reviewer)
    card = client.get(reverse("approvals:inbox")).content.decode()
    assert "echo REVIEWME &gt; f" in card and "this is what runs if it is allowed" in card
    assert post(reviewer, row, decision="allow").status_code == 200
    row.refresh_from_db()
    assert (row.status, row.decided_by, row.arguments_to_run) == (
        "allowed",
        reviewer,
        {"command": "echo REVIEWME > f"},
    )
    assert row.arguments_intact()


def test_a_reviewer_may_edit_a_review_call_but_not_into_a_denied_one(
    conversation, alice, reviewer, guards
):
    row = command_card(conversation, "echo REVIEWME", needs_review=True)
    refused = post(reviewer, row, decision="edit", arguments='{"command": "echo DENYME"}')
    assert refused.status_code == 403
    answer = post(reviewer, row, decision="edit", arguments='{"command": "echo REVIEWME twice"}')
    assert answer.status_code == 200
    row.refresh_from_db()
    assert (row.status, row.reason, row.approved_arguments) == (
        "allowed",
        "edited",
        {"command": "echo REVIEWME twice"},
    )


def test_a_reviewer_who_asked_for_the_call_cannot_pass_their_own_edit(conversation, guards):
    owner = make_reviewer("rev-owner")
    conversation.owner = owner
    conversation.save()
    row = command_card(conversation, requested_by=owner)
    answer = post(owner, row, decision="edit", arguments='{"command": "echo REVIEWME"}')
    assert answer.status_code == 202
    row.refresh_from_db()
    assert row.needs_review is True
    refused = post(owner, row, decision="allow")
    assert (refused.status_code, refused.json()["error"]) == (403, OWN_CALL)


def test_a_rule_added_while_a_call_waits_holds_at_the_decision(conversation, alice, guards):
    waiting = command_card(conversation, "echo DENYME")  # asked before the rule existed
    refused = post(alice, waiting, decision="allow")
    assert refused.status_code == 403
    assert post(alice, waiting, decision="deny").status_code == 200
    reviewed = command_card(conversation, "echo REVIEWME")
    assert post(alice, reviewed, decision="allow").status_code == 202
    reviewed.refresh_from_db()
    assert (reviewed.status, reviewed.needs_review, reviewed.approved_arguments) == (
        "pending",
        True,
        None,
    )


def test_a_batch_goes_through_the_rules_per_call(conversation, alice, guards):
    plain = command_card(conversation, "echo fine")
    denied = command_card(conversation, "echo DENYME")
    reviewed = command_card(conversation, "echo REVIEWME")
    answers = approvals_decide(
        approval_ids=[plain.approval_id, denied.approval_id, reviewed.approval_id],
        user=alice,
        decision="allow",
    )
    by_id = {a["approval_id"]: a for a in answers}
    assert by_id[plain.approval_id]["status"] == "allowed"
    assert "*DENYME*" in by_id[denied.approval_id]["error"]
    assert (by_id[reviewed.approval_id]["resolved"], by_id[reviewed.approval_id]["status"]) == (
        False,
        "pending",
    )
    assert by_id[reviewed.approval_id]["review"] is True
    statuses = dict(ToolApproval.objects.values_list("approval_id", "status"))
    assert statuses[denied.approval_id] == statuses[reviewed.approval_id] == "pending"


def test_always_allow_goes_through_the_rules_and_makes_no_rule_when_refused(
    conversation, alice, guards
):
    row = command_card(conversation, "echo DENYME")
    answer = post(alice, row, decision="always", pattern="echo *")
    assert answer.status_code == 403
    assert not ToolRule.objects.filter(action="allow").exists()
    assert ToolApproval.objects.get(pk=row.pk).status == "pending"


def test_always_allow_with_a_pattern_needs_a_line_a_pattern_can_read(conversation, alice):
    row = command_card(conversation, "ls $(id)")
    answer = post(alice, row, decision="always", pattern="ls *")
    assert answer.status_code == 400
    assert "command substitution" in answer.json()["error"]
    # The exact line is the one pattern that may stand for it.
    assert post(alice, row, decision="always", pattern="ls $(id)").status_code == 200


def files_write_card(conversation, *declared: str):
    """A pending files__write card whose schema declares ``declared`` (extras allowed)."""
    schema = {"type": "object", "properties": {name: {"type": "string"} for name in declared}}
    return make_approval(
        conversation,
        tool_name="files__write",
        arguments={"path": "notes.txt"},
        tool_schema=schema,
        subject='{"path":"notes.txt"}',
    )


def test_an_mcp_edit_may_not_add_an_argument_the_tool_does_not_declare(conversation, alice):
    """Issue 52: rules cannot read what the schema does not declare."""
    row = files_write_card(conversation, "path")
    answer = post(alice, row, decision="edit", arguments='{"path": "x", "mode": "overwrite"}')
    assert answer.status_code == 400
    assert "does not declare: 'mode'" in answer.json()["error"]
    assert ToolApproval.objects.get(pk=row.pk).status == "pending"


def test_an_mcp_edit_that_adds_a_property_goes_through_the_rules(conversation, alice):
    ToolRule.objects.create(tool="files__write", pattern='*"mode":"overwrite"*', action="deny")
    row = files_write_card(conversation, "path", "mode")
    with pytest.raises(DecisionForbidden):
        approval_decide(
            approval_id=row.approval_id,
            user=alice,
            decision="edit",
            arguments={"path": "notes.txt", "mode": "overwrite"},
        )
    assert ToolApproval.objects.get(pk=row.pk).status == "pending"


def test_an_edit_sent_to_review_never_runs_through_a_racing_allow(conversation, alice, guards):
    """The member's edit (into a Review call) races their own Allow of the original.

    Either the Allow wins (the original runs) or the edit goes to a reviewer;
    never does an allowed row carry the edit nobody reviewed.
    """
    outcomes = set()
    for _ in range(20):
        row = command_card(conversation)
        results = decide_at_once(
            row.approval_id, alice, {"edit": {"command": "echo REVIEWME"}, "allow": None}
        )
        # An Allow that reads the row after the edit went to review is refused.
        assert all(
            not isinstance(r, Exception) or (k, type(r)) == ("allow", DecisionForbidden)
            for k, r in results.items()
        ), results
        row.refresh_from_db()
        if row.status == "allowed":
            assert row.approved_arguments is None and not row.needs_review
            outcomes.add("allow won")
        else:
            assert (row.status, row.needs_review) == ("pending", True)
            assert row.approved_arguments == {"command": "echo REVIEWME"}
            outcomes.add("edit won")
    assert outcomes  # each round ended one of the two ways above


def test_a_run_whose_edit_was_denied_by_a_rule_never_runs_it(
    conversation, alice, guards, root_sandbox
):
    turns = [("", [call("terminal", {"command": "echo harmless"})]), ("Done.", [])]
    driver = AgentDriver.scripted(conversation, alice, turns)
    started = driver.wait_for(ToolStarted)
    with pytest.raises(DecisionForbidden):
        approval_decide(
            approval_id=started.approval_id,
            user=alice,
            decision="edit",
            arguments={"command": "echo DENYME > f"},
        )
    approval_decide(approval_id=started.approval_id, user=alice, decision="deny")
    finished = driver.wait_for(ToolFinished)
    assert finished.result.startswith(REJECTION_TEXT)
    driver.finish()
    assert not (conversation.workspace / "f").exists()


def test_a_run_whose_edit_went_to_review_runs_the_edit_once_reviewed(
    conversation, alice, reviewer, guards, root_sandbox
):
    turns = [("", [call("terminal", {"command": "echo harmless"})]), ("Done.", [])]
    driver = AgentDriver.scripted(conversation, alice, turns)
    started = driver.wait_for(ToolStarted)
    result = approval_decide(
        approval_id=started.approval_id,
        user=alice,
        decision="edit",
        arguments={"command": "echo REVIEWME > f"},
    )
    assert (result.resolved, result.review) == (False, True)
    assert approval_decide(
        approval_id=started.approval_id, user=reviewer, decision="allow"
    ).resolved
    driver.wait_for(ToolFinished)
    driver.finish()
    assert (conversation.workspace / "f").read_text() == "REVIEWME\n"


def test_an_allow_rule_no_longer_runs_a_smuggled_command(conversation, alice, root_sandbox):
    """The attack of issue 34: with "ls *" allowed, this line ran id with no card."""
    ToolRule.objects.create(
        tool="terminal", pattern="ls *", action="allow", scope="conversation",
        conversation=conversation,
    )  # fmt: skip
    line = "ls $'\\'' ; id > PWNED.txt ; #'"
    turns = [("", [call("terminal", {"command": line})]), ("Done.", [])]
    driver = AgentDriver.scripted(conversation, alice, turns)
    started = driver.wait_for(ToolStarted)
    assert started.awaiting is True  # a card, not a rule
    row = ToolApproval.objects.get(approval_id=started.approval_id)
    assert (row.status, row.reason, row.rule_id) == ("pending", "", None)
    approval_decide(approval_id=started.approval_id, user=alice, decision="deny")
    assert driver.wait_for(ToolFinished).result.startswith(REJECTION_TEXT)
    driver.finish()
    assert not (conversation.workspace / "PWNED.txt").exists()


@pytest.mark.parametrize(
    ("command", "patterns"),
    [
        ("rm -rf build", ["rm -rf build", "rm -rf *", "rm *", ""]),
        ("ls", ["ls", "ls *", ""]),
        ("ls $(id)", ["ls $(id)", ""]),  # a line no pattern can read: exact or the whole tool
    ],
)
def test_always_allow_offers_the_narrowest_choice_first_and_selected(
    conversation, alice, command, patterns
):
    """Issue 37: "Always allow…" pre-selected the whole tool, even for rm -rf build."""
    import re

    from approvals.notify import card as card_render

    html = card_render(command_card(conversation, command))
    offered = re.findall(r'<input type="radio" name="pattern" value="([^"]*)"( checked)?', html)
    assert [p for p, _ in offered] == patterns
    assert [bool(c) for _, c in offered] == [True] + [False] * (len(patterns) - 1)
    assert "every terminal call in this chat, whatever it does" in html


@pytest.mark.parametrize(
    "line",
    [
        "jobs -x rm -f victim",
        "let 'a[$(rm -f victim)]'",
        "compgen -C 'rm -f victim' x",
        "history -s 'rm -f victim'; fc -s",
    ],
)
def test_a_deny_holds_against_builtins_that_run_their_words(alice, line, root_sandbox):
    """Issue 52: under a Deny of ``rm *`` with Confirm off, each of these deleted its file."""
    from tests.factories import make_conversation

    conversation = make_conversation(alice, confirm_tool_calls=False)
    deny = ToolRule.objects.create(tool="terminal", pattern="rm *", action="deny")
    conversation.workspace.mkdir(parents=True, exist_ok=True)
    (conversation.workspace / "victim").write_text("keep me")
    (conversation.workspace / "victim").chmod(0o666)
    turns = [("", [call("terminal", {"command": line})]), ("Done.", [])]
    driver = AgentDriver.scripted(conversation, alice, turns)
    finished = driver.wait_for(ToolFinished)
    driver.finish()
    row = ToolApproval.objects.get(approval_id=finished.approval_id)
    assert (row.status, row.reason, row.rule_id) == ("denied", "rule", deny.pk)
    assert (conversation.workspace / "victim").read_text() == "keep me"


def test_always_allow_no_longer_offers_printf_and_refuses_its_pattern(conversation, alice):
    """Issue 52: the card offered "commands starting with printf", and then
    ``printf -v 'a[$(touch PWNED)]' %s x`` ran with no card."""
    from approvals.notify import card as card_render

    row = command_card(conversation, "printf '%s\\n' hi")
    html = card_render(row)
    assert "commands starting with" not in html
    assert "printf is a bash builtin" in html  # the card says why no rule can vouch
    answer = post(alice, row, decision="always", pattern="printf *")
    assert answer.status_code == 400
    assert not ToolRule.objects.filter(action="allow").exists()
    assert ToolApproval.objects.get(pk=row.pk).status == "pending"


@pytest.mark.parametrize(
    ("command", "program"),
    [("git status", "git"), ("find . -name x -delete", "find"), ("sed -n p f", "sed")],
)
def test_a_program_that_runs_others_gets_no_prefix_on_its_card(
    conversation, alice, command, program
):
    """Issue 52: a card offered "commands starting with git status"."""
    import re

    from approvals.notify import card as card_render

    html = card_render(command_card(conversation, command))
    offered = re.findall(r'<input type="radio" name="pattern" value="([^"]*)"', html)
    assert offered == [command, ""]
    assert f"{program} can run other programs that its options or files name" in html


def test_a_pending_card_says_the_sandbox_has_no_network(conversation, reviewer):
    from approvals.notify import card as card_render

    html = card_render(command_card(conversation, "curl -sO https://example.com/data.csv"))
    assert "Tools run without a network: curl needs the network" in html
    assert "Tools run without a network" not in card_render(command_card(conversation, "ls"))

"""The agent loop with scripted model turns, real tools and the real gate."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from approvals.models import ToolApproval, ToolRule
from approvals.services.decisions import approval_decide
from chat.agent import DUPLICATE_TEXT
from chat.events import Delta, Done, Failed, Status, ToolFinished, ToolStarted, Wait
from chat.models import Message, Run
from chat.toolbox import Toolbox
from chat.tools.base import Tool, ToolResult
from studio.wording import REJECTION_TEXT
from tests.factories import make_run
from tests.helpers.driver import AgentDriver
from tests.helpers.scripted import ScriptedModel, call, failing

pytestmark = pytest.mark.django_db(transaction=True)

# Each run appends one line to a file, so "ran exactly once" is countable.
APPEND = {"code": "open('runs.txt', 'a').write('ran\\n'); print('appended')"}


def runs_file_lines(settings, conversation) -> int:
    path = conversation.workspace / "runs.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture(autouse=True)
def clean_workspace(settings, conversation):
    path = conversation.workspace / "runs.txt"
    path.unlink(missing_ok=True)


def start(conversation, model, *, knobs: dict | None = None, **kwargs):
    # The Agent does not manage the run row (the run service does); any row will do.
    kwargs.setdefault("run", make_run(conversation))
    return AgentDriver.start(
        conversation=conversation,
        model=model,
        user=conversation.owner,
        knobs=knobs or {},
        **kwargs,
    )


def last_tool_message(conversation) -> Message:
    return conversation.messages.filter(role="tool").last()


def test_allow_runs_the_tool_exactly_once(conversation, alice, settings):
    model = ScriptedModel([("Let me run it.", [call("python", APPEND)]), ("Done.", [])])
    driver = start(conversation, model)
    start_event = driver.wait_for(ToolStarted)
    assert start_event.awaiting is True
    assert runs_file_lines(settings, conversation) == 0  # nothing runs before the decision
    approval_decide(approval_id=start_event.approval_id, user=alice, decision="allow")
    end = driver.wait_for(ToolFinished)
    assert end.result.strip() == "appended"
    driver.finish()
    assert isinstance(driver.seen[-1], Done)
    assert runs_file_lines(settings, conversation) == 1
    # The model's second turn saw the tool result.
    assert model.seen[1][-1] == {
        "role": "tool",
        "tool_call_id": start_event.call.call_id,
        "content": end.result,
    }


def test_deny_skips_the_tool_and_feeds_the_rejection(conversation, alice, settings):
    model = ScriptedModel([("", [call("python", APPEND)]), ("OK, I won't.", [])])
    driver = start(conversation, model)
    event = driver.wait_for(ToolStarted)
    approval_decide(approval_id=event.approval_id, user=alice, decision="deny", note="not today")
    end = driver.wait_for(ToolFinished)
    driver.finish()
    assert end.result == f"{REJECTION_TEXT} The user said: not today"
    assert model.seen[1][-1]["content"] == end.result
    assert runs_file_lines(settings, conversation) == 0


def test_disabled_tool_is_not_prompted_and_makes_no_row(conversation):
    model = ScriptedModel([("", [call("python", APPEND)]), ("Fine.", [])])
    driver = start(conversation, model, enabled_tools=["terminal"])
    driver.finish()
    assert not driver.of(ToolStarted)
    result = driver.of(ToolFinished)[0].result
    assert result.startswith("Error: tool 'python' is not enabled for this request.")
    assert not ToolApproval.objects.exists()


def test_unknown_tool_and_bad_arguments_are_not_prompted(conversation):
    from chat.llm.base import ToolCall

    model = ScriptedModel(
        [
            (
                "",
                [
                    call("rm_rf", {"path": "/"}),
                    ToolCall(id="c2", name="python", arguments=None, error="Expecting value"),
                    call("python", {"source": "print(1)"}),
                ],
            ),
            ("Sorry.", []),
        ]
    )
    driver = start(conversation, model)
    driver.finish()
    results = [e.result for e in driver.of(ToolFinished)]
    assert results[0].startswith("Error: tool 'rm_rf' is not enabled")
    assert results[1].startswith("Error: the arguments of this python call are not valid JSON")
    assert results[2] == "Error: 'code' is a required property."
    assert not ToolApproval.objects.exists()


def test_duplicate_is_not_prompted(conversation, alice, settings):
    model = ScriptedModel(
        [
            ("", [call("python", APPEND, "a")]),
            ("", [call("python", APPEND, "b")]),
            ("Done.", []),
        ]
    )
    driver = start(conversation, model)
    approval_decide(
        approval_id=driver.wait_for(ToolStarted).approval_id, user=alice, decision="allow"
    )
    driver.finish()
    assert len(driver.of(ToolStarted)) == 1
    assert driver.of(ToolFinished)[1].result == DUPLICATE_TEXT
    assert ToolApproval.objects.count() == 1
    assert runs_file_lines(settings, conversation) == 1


def test_denied_call_reissued_then_allowed_runs_once(conversation, alice, settings):
    model = ScriptedModel(
        [
            ("", [call("python", APPEND, "a")]),
            ("", [call("python", APPEND, "b")]),
            ("Done.", []),
        ]
    )
    driver = start(conversation, model)
    first = driver.wait_for(ToolStarted)
    approval_decide(approval_id=first.approval_id, user=alice, decision="deny")
    second = driver.wait_for(ToolStarted)  # prompted again: a deny is not "already ran"
    assert second.approval_id != first.approval_id
    approval_decide(approval_id=second.approval_id, user=alice, decision="allow")
    driver.finish()
    assert runs_file_lines(settings, conversation) == 1
    statuses = list(ToolApproval.objects.order_by("requested_at").values_list("status", flat=True))
    assert statuses == ["denied", "allowed"]


def test_errored_call_does_not_count_as_already_ran(conversation):
    failing_code = {"code": "raise SystemExit(3)"}
    conversation.confirm_tool_calls = False
    conversation.save()
    model = ScriptedModel(
        [
            ("", [call("python", failing_code, "a")]),
            ("", [call("python", failing_code, "b")]),
            ("x", []),
        ]
    )
    driver = start(conversation, model)
    driver.finish()
    results = [e.result for e in driver.of(ToolFinished)]
    assert all(r.startswith("Error: exited with status 3") for r in results)


def allow_rule(conversation, tool: str) -> ToolRule:
    return ToolRule.objects.create(
        tool=tool, action="allow", scope="conversation", conversation=conversation
    )


def test_an_allow_rule_runs_without_prompt_and_names_itself_on_the_row(
    conversation, alice, settings
):
    rule = allow_rule(conversation, "python")
    model = ScriptedModel([("", [call("python", APPEND)]), ("Done.", [])])
    driver = start(conversation, model)
    driver.finish()
    start_event = driver.of(ToolStarted)[0]
    assert start_event.awaiting is False
    row = ToolApproval.objects.get()
    assert (row.status, row.reason, row.rule) == ("allowed", "rule", rule)
    assert row.rule_snapshot == rule.snapshot()
    rule.refresh_from_db()
    assert rule.hits == 1
    assert runs_file_lines(settings, conversation) == 1


def test_a_deny_rule_blocks_without_asking_and_the_loop_goes_on(conversation, settings):
    conversation.confirm_tool_calls = False  # an admin's Deny holds even so
    conversation.save()
    ToolRule.objects.create(tool="python", pattern="*runs.txt*", action="deny", note="Not there.")
    model = ScriptedModel([("", [call("python", APPEND)]), ("Understood.", [])])
    driver = start(conversation, model)
    driver.finish()
    assert [e.awaiting for e in driver.of(ToolStarted)] == [False]
    assert driver.of(ToolFinished)[0].result == "Blocked by a rule: Not there."
    row = ToolApproval.objects.get()
    assert (row.status, row.reason, row.rule_snapshot["note"]) == ("denied", "rule", "Not there.")
    assert runs_file_lines(settings, conversation) == 0
    assert conversation.messages.last().content == "Understood."
    # The model read the block as its tool result.
    assert model.seen[-1][-1]["content"] == "Blocked by a rule: Not there."


def test_a_rule_is_for_its_tool_only(conversation, alice):
    allow_rule(conversation, "terminal")
    model = ScriptedModel([("", [call("python", APPEND)]), ("Done.", [])])
    driver = start(conversation, model)
    event = driver.wait_for(ToolStarted)
    assert event.awaiting is True
    approval_decide(approval_id=event.approval_id, user=alice, decision="deny")
    driver.finish()


def test_confirmation_off_runs_without_prompt_and_still_records(conversation, settings):
    conversation.confirm_tool_calls = False
    conversation.save()
    model = ScriptedModel([("", [call("python", APPEND)]), ("Done.", [])])
    driver = start(conversation, model)
    driver.finish()
    row = ToolApproval.objects.get()
    # The member's own switch, not an admin's policy.
    assert (row.status, row.reason) == ("allowed", "confirm_off")
    assert runs_file_lines(settings, conversation) == 1


def test_cancel_while_waiting_ends_the_run_without_running(conversation, settings):
    model = ScriptedModel([("", [call("python", APPEND)])])
    driver = start(conversation, model)
    event = driver.wait_for(ToolStarted)
    driver.agent.cancel.cancel()
    driver.finish()
    assert driver.seen[-1] == Done(cancelled=True)
    row = ToolApproval.objects.get(approval_id=event.approval_id)
    assert (row.status, row.reason) == ("denied", "cancelled")
    assert runs_file_lines(settings, conversation) == 0
    assert len(model.seen) == 1  # the model was not asked again


def step(agent) -> list:
    """One step of ``agent``: its events, up to and with the ``Wait`` that ends it."""
    return list(agent.events())


def new_agent(conversation, run, model, cancel=None):
    from chat.agent import Agent
    from studio.cancel import CancelToken

    return Agent(
        conversation=conversation,
        model=model,
        cancel=cancel or CancelToken(),
        run=run,
        user=conversation.owner,
    )


def test_a_step_ends_at_a_waiting_call_and_the_next_goes_on_from_the_rows(
    conversation, alice, settings
):
    run = make_run(conversation)
    Message.objects.create(conversation=conversation, run=run, role="user", content="go")
    first = step(new_agent(conversation, run, ScriptedModel([("", [call("python", APPEND)])])))
    assert isinstance(first[-1], Wait)
    row = ToolApproval.objects.get(approval_id=first[-1].approval_id)
    assert row.is_pending and row.expires_at is not None
    approval_decide(approval_id=row.approval_id, user=alice, decision="allow")
    # Another Agent, as in another process: only the rows tell it where the run is.
    model = ScriptedModel([("Done.", [])])
    second = step(new_agent(conversation, run, model))
    assert [type(e).__name__ for e in second if isinstance(e, ToolFinished | Done)] == [
        "ToolFinished",
        "Done",
    ]
    assert runs_file_lines(settings, conversation) == 1
    # The model was asked once, with the call and its result after the user's message.
    assert len(model.seen) == 1
    assert [m["role"] for m in model.seen[0]][-3:] == ["user", "assistant", "tool"]


def test_a_call_begun_before_a_crash_is_reported_interrupted_and_never_run_again(
    conversation, alice, settings
):
    from approvals.services.waiting import approval_start
    from chat.agent import INTERRUPTED_TEXT

    run = make_run(conversation)
    Message.objects.create(conversation=conversation, run=run, role="user", content="go")
    first = step(new_agent(conversation, run, ScriptedModel([("", [call("python", APPEND)])])))
    approval_decide(approval_id=first[-1].approval_id, user=alice, decision="allow")
    row = ToolApproval.objects.get(approval_id=first[-1].approval_id)
    # A process marked it begun and died before its result was saved.
    assert approval_start(approval=row)
    model = ScriptedModel([("It was interrupted.", [])])
    step(new_agent(conversation, run, model))
    assert runs_file_lines(settings, conversation) == 0
    result = last_tool_message(conversation)
    assert result.is_error and INTERRUPTED_TEXT in result.content
    assert INTERRUPTED_TEXT in model.seen[0][-1]["content"]  # the model is told
    assert not approval_start(approval=row)  # and nothing may begin it again


def test_a_step_given_up_mid_stream_writes_nothing_and_the_turn_is_asked_again(conversation):
    from studio.cancel import CancelToken

    run = make_run(conversation)
    Message.objects.create(conversation=conversation, run=run, role="user", content="go")
    cancel = CancelToken()

    def cut_off(messages):
        cancel.abandon()  # the process exits while the reply streams
        return "half a reply", []

    assert step(new_agent(conversation, run, ScriptedModel([cut_off]), cancel)) == [
        Status("Thinking…"),
        Delta("half "),
        Delta("a "),
        Delta("reply "),
    ]
    assert list(Message.objects.filter(run=run).values_list("role", flat=True)) == ["user"]
    model = ScriptedModel([("The whole reply.", [])])
    step(new_agent(conversation, run, model))
    assert model.seen[0][-1] == {"role": "user", "content": "go"}
    assert list(Message.objects.filter(run=run).values_list("role", flat=True)) == [
        "user",
        "assistant",
    ]


def test_a_finished_run_is_not_answered_twice(conversation):
    run = make_run(conversation)
    Message.objects.create(conversation=conversation, run=run, role="user", content="go")
    step(new_agent(conversation, run, ScriptedModel([("Hello.", [])])))
    # Resumed after its answer was saved but before the run was marked done.
    assert step(new_agent(conversation, run, ScriptedModel([]))) == [Done()]


def test_timeout_is_reported_and_the_run_goes_on(conversation, settings):
    model = ScriptedModel([("", [call("python", APPEND)]), ("Nobody answered.", [])])
    driver = start(conversation, model, knobs={"approval_timeout": 0.2})
    driver.finish()
    assert driver.of(ToolFinished)[0].result.startswith("Error: nobody decided")
    assert ToolApproval.objects.get().reason == "timeout"
    assert runs_file_lines(settings, conversation) == 0


def test_iteration_cap(conversation):
    conversation.confirm_tool_calls = False
    conversation.save()
    counter = iter(range(100))
    model = ScriptedModel(
        [lambda messages: ("", [call("python", {"code": f"print({next(counter)})"})])],
        repeat_last=True,
    )
    driver = start(conversation, model, knobs={"max_iterations": 3})
    driver.finish()
    assert isinstance(driver.seen[-1], Failed)
    assert "limit of 3 rounds" in driver.seen[-1].text
    assert ToolApproval.objects.count() == 3
    assert len(model.seen) == 4


def test_model_error_is_shown_and_history_kept(conversation):
    Message.objects.create(conversation=conversation, role="user", content="hello")
    model = ScriptedModel([failing("Could not reach the model server")])
    driver = start(conversation, model)
    driver.finish()
    assert isinstance(driver.seen[-1], Failed)
    assert "Could not reach" in driver.seen[-1].text
    roles = list(conversation.messages.values_list("role", flat=True))
    assert roles == ["user", "error"]


def test_transcript_is_rebuilt_from_rows(conversation, alice):
    Message.objects.create(conversation=conversation, role="user", content="first question")
    model = ScriptedModel([("", [call("python", {"code": "print(7)"}, "c1")]), ("It is 7.", [])])
    conversation.confirm_tool_calls = False
    conversation.save()
    start(conversation, model).finish()
    Run.objects.filter(conversation=conversation).update(status="done")  # (the engine's part)
    Message.objects.create(conversation=conversation, role="user", content="again")
    second = ScriptedModel([("Sure.", [])])
    start(conversation, second).finish()
    roles = [m["role"] for m in second.seen[0]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert second.seen[0][3]["content"].strip() == "7"


def test_a_resumed_run_counts_the_rounds_it_made_before(conversation):
    """The tool-call limit holds across a restart: rounds are read from the rows."""
    from chat.agent import Agent, AgentSettings
    from studio.cancel import CancelToken

    run = make_run(conversation)
    Message.objects.create(conversation=conversation, run=run, role="user", content="go")
    Message.objects.create(
        conversation=conversation,
        run=run,
        role="assistant",
        tool_calls=[{"id": "c1", "name": "python", "arguments": {"code": "print(1)"}}],
    )
    Message.objects.create(
        conversation=conversation, run=run, role="tool", tool_call_id="c1",
        tool_name="python", tool_arguments={"code": "print(1)"}, content="1",
    )  # fmt: skip
    agent = Agent(
        conversation=conversation,
        model=ScriptedModel([("", [call("python", {"code": "print(2)"})])]),
        cancel=CancelToken(),
        run=run,
        user=conversation.owner,
        knobs=AgentSettings.from_django(max_iterations=1),
    )
    seen = list(agent.events())
    assert any(isinstance(e, Failed) and "limit of 1 rounds" in e.text for e in seen)


@pytest.mark.anydb
def test_a_reply_and_a_tool_run_hold_no_pooled_connection(conversation, alice):
    """A model's reply and a tool's run may take minutes: a step must not hold
    one of the process's pooled PostgreSQL connections through them (SQLite
    keeps its thread's connection by design: reopening costs more)."""
    held: dict[str, bool] = {}

    class Watching(ScriptedModel):
        def stream(self, messages, tools, *, cancel):
            held.setdefault(f"reply {len(self.seen)}", connection.connection is not None)
            yield from super().stream(messages, tools, cancel=cancel)

    def probe(arguments, **_):
        held["tool"] = connection.connection is not None
        return ToolResult("probed")

    tool = Tool(name="probe", description="Probe.", parameters={"type": "object"}, run=probe)
    model = Watching([("", [call("probe", {})]), ("Done.", [])])
    driver = start(conversation, model, toolbox=Toolbox(tools={"probe": tool}, enabled=("probe",)))
    started = driver.wait_for(ToolStarted)
    approval_decide(approval_id=started.approval_id, user=alice, decision="allow")
    assert driver.wait_for(ToolFinished).result == "probed"
    driver.finish()
    kept = connection.vendor == "sqlite"
    assert held == {"reply 0": kept, "tool": kept, "reply 1": kept}
    assert last_tool_message(conversation).content == "probed"  # written after, all the same


@pytest.mark.parametrize("sessions", [True, False])
def test_a_stopped_call_says_who_stopped_it_and_keeps_what_it_printed(
    conversation, alice, settings, root_sandbox, sessions
):
    """Issue 55: after Stop the card said Allowed, the output "exited with signal
    SIGKILL", and the audit row allowed / user, as for a crash."""
    from chat import render
    from chat.events import ToolFinished as Finished
    from chat.tools.sessions import SEEN_MARK

    settings.STUDIO_PYTHON_SESSIONS = sessions
    conversation.confirm_tool_calls = False
    conversation.save()
    code = (
        "import time\nprint('got to step 1', flush=True)\n"
        "open('printed', 'w').close()\ntime.sleep(60)"
    )
    driver = start(conversation, ScriptedModel([("", [call("python", {"code": code})])]))
    workspace = conversation.workspace
    deadline = time.monotonic() + 20
    while not (workspace / "printed").exists():  # it printed, and sleeps
        assert time.monotonic() < deadline, "the call never got to step 1"
        time.sleep(0.02)
    driver.agent.cancel.cancel()
    if sessions:  # Stop ends the session too, from another thread, as run_stop does
        from chat.services import python_sessions_reset

        python_sessions_reset(conversation_id=conversation.pk)
    finished = driver.wait_for(Finished)
    driver.finish()
    # Rolled-back tests reuse primary keys: leave no python session's mark.
    (workspace / SEEN_MARK).unlink(missing_ok=True)
    assert finished.stopped_by == alice.get_username() and not finished.ok, finished.result
    row = ToolApproval.objects.get(conversation=conversation)
    assert (row.status, row.run_outcome) == ("allowed", "stopped")
    shown = render.tool_finished(finished)
    assert f"Stopped by {alice.get_username()}" in shown and "got to step 1" in shown
    assert "stopped by the user" not in shown and "SIGKILL" not in shown

"""chat.services: how a run's end is recorded."""

from __future__ import annotations

import pytest

from chat.models import Message, Run
from chat.runs.state import run_finish
from tests.factories import make_conversation, make_run

pytestmark = [pytest.mark.django_db, pytest.mark.anydb]


def test_run_finish_records_the_end_of_a_running_run(conversation):
    run = make_run(conversation)
    run_finish(run_id=str(run.pk), status=Run.Status.ERROR, error="x" * 3000)
    run.refresh_from_db()
    assert run.status == Run.Status.ERROR and run.finished_at is not None
    assert run.error == "x" * 2000


def test_run_finish_keeps_an_end_recorded_already(conversation):
    # Retired as dead by another process, say: the first record stands.
    run = make_run(conversation)
    run_finish(run_id=str(run.pk), status=Run.Status.CANCELLED, error="server gone")
    first = Run.objects.get(pk=run.pk)
    run_finish(run_id=str(run.pk), status=Run.Status.DONE)
    again = Run.objects.get(pk=run.pk)
    assert (again.status, again.error, again.finished_at) == (
        Run.Status.CANCELLED,
        "server gone",
        first.finished_at,
    )


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("```python\nimport matplotlib.pyplot as plt\n```", "import matplotlib.pyplot as plt"),
        ("# Plot the **sales**\nplease", "Plot the **sales**"),
        ("What does `ls -la` show?", "What does ls -la show?"),
        (
            "Please summarise the quarterly report and list the three largest risks in it",
            "Please summarise the quarterly report and list…",
        ),
        ("```\n```", "New chat"),
    ],
)
def test_a_first_message_names_its_chat_shortly(text, title):
    """Issue 55: titles were the raw first message ("```python import matplotlib…")."""
    from chat.services import TITLE_LENGTH, _title_from

    assert _title_from(text) == title and len(title) <= TITLE_LENGTH


class TitleModel:
    """A model that writes titles: its one reply, or a failure."""

    writes_titles = True
    label = name = "titles"

    def __init__(self, reply) -> None:
        self.reply = reply

    def stream(self, messages, tools, *, cancel):
        from chat.llm import LLMError, TextDelta, TurnEnd

        if isinstance(self.reply, LLMError):
            raise self.reply
        yield TextDelta(self.reply)
        yield TurnEnd(content=self.reply, tool_calls=[])


def first_run(alice, text="can you plot the sales of the third quarter for me please"):
    from chat.services import run_create

    conversation = make_conversation(alice, title="New chat")
    run, _ = run_create(
        run_id=str(__import__("uuid").uuid4()), conversation_id=conversation.pk, user=alice,
        text=text, owner="",
    )  # fmt: skip
    Message.objects.create(conversation=conversation, run=run, role="assistant", content="Sure.")
    conversation.refresh_from_db()
    return conversation


def test_a_chats_first_reply_is_followed_by_a_title_from_its_model(alice):
    """Issue 55: titles were the raw first message; the model names the chat now."""
    from chat.services import conversation_title_from_model

    conversation = first_run(alice)
    title = conversation_title_from_model(
        conversation=conversation, model=TitleModel('"Third quarter sales plot."')
    )
    assert title == "Third quarter sales plot"
    conversation.refresh_from_db()
    assert conversation.title == "Third quarter sales plot"


def test_the_members_name_for_a_chat_wins_and_a_failing_model_changes_nothing(alice):
    from chat.llm import LLMError
    from chat.services import conversation_rename, conversation_title_from_model

    conversation = first_run(alice)
    auto = conversation.title
    failing = TitleModel(LLMError("down"))
    assert conversation_title_from_model(conversation=conversation, model=failing) is None
    conversation.refresh_from_db()
    assert conversation.title == auto  # the plain fallback stays
    conversation_rename(conversation=conversation, title="My sales")
    conversation.refresh_from_db()
    assert conversation_title_from_model(conversation=conversation, model=TitleModel("X")) is None
    conversation.refresh_from_db()
    assert conversation.title == "My sales"


def test_the_demo_model_writes_no_titles(alice):
    from chat.llm.demo import DemoModel
    from chat.services import conversation_title_from_model

    conversation = first_run(alice)
    assert conversation_title_from_model(conversation=conversation, model=DemoModel()) is None

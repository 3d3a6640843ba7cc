"""chat.services: how a run's end is recorded."""

from __future__ import annotations

import pytest

from chat.models import Run
from chat.services import run_finish
from tests.factories import make_run

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

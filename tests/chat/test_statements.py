"""How many SQL statements a tab opening and a decision make, so they cannot creep back.

Counted with Django's own ``CaptureQueriesContext`` where the work runs on
the test's thread, and with an execute wrapper on every connection the
runtime's pools open where it runs there (a decision's run step). The
ceilings are today's counts (bench/RESULTS.md has the targets): lower them
as statements go, never raise them without a reason in the commit.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.db.backends.signals import connection_created
from django.test import Client
from django.test.utils import CaptureQueriesContext

from chat.consumers import ChatConsumer
from tests.chat.test_engine import finished, until, waiting
from tests.factories import make_conversation

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.anydb]

# Studio's part of a tab opening on a waiting chat (admit, groups, catch-up),
# for a page just drawn (only what it lacks is sent) and for a reconnect
# (everything); Channels adds two (the session and its user): 8 in all for
# the first, the target.
TAB_OPENING = 6
TAB_RECONNECT = 10
# A decision's POST (its session and user included).
DECISION_POST = 5
# The decided run's step to its end (claim, each fenced write, the model's
# reply, the run's end), on the runtime's threads; BEGIN not counted.
DECISION_STEP = 10
# Of those, the reads whose order matters: the run's messages and the
# transcript. Compiling an ORDER BY costs a small read a third of its CPU
# (``studio.db.one_or_none``): none where one row is read, or order is moot.
ORDERED_IN_POST = 0
ORDERED_IN_STEP = 2


class Statements:
    """Every statement any thread's new connection runs while ``counting``."""

    def __init__(self) -> None:
        self.sql: list[str] = []
        self.counting = False
        self.lock = threading.Lock()
        self.wrapping: list = []
        self.ignored: set[int] = set()  # threads counted otherwise

    def __call__(self, execute, sql, params, many, context):
        # SQLite's BEGIN IMMEDIATE is PostgreSQL's implicit BEGIN: not counted.
        if self.counting and threading.get_ident() not in self.ignored and sql != "BEGIN IMMEDIATE":
            with self.lock:
                self.sql.append(sql)
        return execute(sql, params, many, context)

    def connected(self, sender, connection, **kwargs) -> None:
        # Entered for the wrapper's whole life: it is this test's. A pooled
        # connection connects again after each piece of work: wrap it once.
        if self in connection.execute_wrappers:
            return
        wrapping = connection.execute_wrapper(self)
        wrapping.__enter__()
        self.wrapping.append(wrapping)  # collected, it would take the wrapper off


@pytest.fixture
def statements():
    counter = Statements()
    connection_created.connect(counter.connected)
    yield counter
    connection_created.disconnect(counter.connected)


def tab_opening(conversation, user, *, drawn: bool) -> list[dict]:
    consumer = ChatConsumer()
    consumer.scope = {
        "user": user,
        "url_route": {"kwargs": {"conversation_id": conversation.pk}},
        "query_string": f"since={int(time.time())}".encode() if drawn else b"",
    }
    consumer.user = user
    with CaptureQueriesContext(connection) as queries:
        assert consumer.opening() is not None
        frames = consumer.state()
    assert "data-approval-id" in "".join(frames)  # the waiting card is in the catch-up
    return queries.captured_queries


@pytest.mark.parametrize("drawn, ceiling", [(True, TAB_OPENING), (False, TAB_RECONNECT)])
async def test_a_tab_opening_on_a_waiting_chat(rt, conversation, alice, drawn, ceiling):
    await waiting(rt, conversation)
    await asyncio.sleep(1.1)  # the page is drawn in a later second than the card came
    queries = await sync_to_async(tab_opening)(conversation, alice, drawn=drawn)
    assert len(queries) <= ceiling, "\n".join(q["sql"][:120] for q in queries)


async def test_a_decision_and_its_run_step(statements, rt, conversation, alice, settings):
    client = Client()
    await sync_to_async(client.force_login)(alice)
    # A process deciding its first call reads what it then keeps (the MCP
    # servers, until they change): count the next one's, in another chat (a
    # later python call of one chat also asks whether its interpreter was reset).
    other = await sync_to_async(make_conversation)(alice)
    earlier = await waiting(rt, other)
    await sync_to_async(client.post)(
        f"/approvals/{earlier.approval_id}/decide/", {"decision": "allow"}
    )
    await until(lambda: finished(other))
    approval = await waiting(rt, conversation)
    # No sweep while counting: it would add its own statements at random.
    settings.STUDIO_APPROVAL_POLL_SECONDS = 3600
    await asyncio.sleep(0.5)

    def post():
        statements.ignored.add(threading.get_ident())
        with CaptureQueriesContext(connection) as queries:
            answer = client.post(
                f"/approvals/{approval.approval_id}/decide/",
                {"decision": "allow"},
                headers={"hx-request": "true"},
            )
        assert answer.status_code == 200
        return queries.captured_queries

    statements.counting = True
    queries = await sync_to_async(post)()
    await until(lambda: finished(conversation))
    statements.counting = False
    assert len(queries) <= DECISION_POST, "\n".join(q["sql"][:120] for q in queries)
    assert len(statements.sql) <= DECISION_STEP, "\n".join(sql[:120] for sql in statements.sql)
    ordered_in_post = [q["sql"] for q in queries if "ORDER BY" in q["sql"]]
    assert len(ordered_in_post) <= ORDERED_IN_POST, ordered_in_post
    ordered_in_step = [sql for sql in statements.sql if "ORDER BY" in sql]
    assert len(ordered_in_step) <= ORDERED_IN_STEP, ordered_in_step

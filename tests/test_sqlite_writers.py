"""studio.sqlite: one process's SQLite writers queue on a lock, not in SQLite's busy sleeps."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import OperationalError, connection, connections, transaction

from studio.sqlite.base import write_lock
from tests.factories import make_user

pytestmark = pytest.mark.django_db(transaction=True)

BOUND = 15.0


def in_thread(fn) -> tuple[threading.Thread, dict]:
    """Run ``fn`` on a thread of its own (its own connection, closed after)."""
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


@pytest.fixture
def lock():
    assert connection.vendor == "sqlite"
    lock = write_lock(str(connection.settings_dict["NAME"]))
    assert not lock.locked()
    yield lock
    assert not lock.locked(), "a writer kept the lock"


@pytest.fixture
def first_writer():
    """A thread inside an atomic block that has written and waits to be let go."""
    holding, release = threading.Event(), threading.Event()

    def first():
        with transaction.atomic():
            make_user("first")
            holding.set()
            assert release.wait(BOUND)

    thread, outcome = in_thread(first)
    assert holding.wait(BOUND)
    yield release
    release.set()
    thread.join(BOUND)
    assert "error" not in outcome


def test_a_second_writer_waits_for_the_first_and_then_writes(lock, first_writer):
    assert lock.locked()  # held from BEGIN IMMEDIATE to COMMIT
    second, outcome = in_thread(lambda: make_user("second").pk)
    second.join(0.3)
    assert second.is_alive()  # queued behind the first writer
    first_writer.set()
    second.join(BOUND)
    assert not second.is_alive() and "error" not in outcome
    assert set(get_user_model().objects.values_list("username", flat=True)) == {"first", "second"}


def test_reads_do_not_wait_for_a_writer(lock, first_writer):
    reader, outcome = in_thread(lambda: get_user_model().objects.count())
    reader.join(BOUND)
    assert outcome == {"value": 0}  # the writer has not committed yet


def test_a_writer_that_waits_too_long_fails_and_writes_nothing(lock, first_writer, monkeypatch):
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0.2)
    second, outcome = in_thread(lambda: make_user("second"))
    second.join(BOUND)
    assert isinstance(outcome.get("error"), OperationalError)
    assert "another writer in this process" in str(outcome["error"])
    first_writer.set()
    assert not get_user_model().objects.filter(username="second").exists()


def test_a_rolled_back_block_lets_the_next_writer_in(lock):
    with pytest.raises(RuntimeError), transaction.atomic():
        make_user("gone")
        assert lock.locked()
        raise RuntimeError("undo")
    assert not lock.locked()
    writer, outcome = in_thread(lambda: make_user("next").pk)
    writer.join(BOUND)
    assert "error" not in outcome
    assert list(get_user_model().objects.values_list("username", flat=True)) == ["next"]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT %s, %s",
        "SELECT '100%%', %s",
        "SELECT %s WHERE 'a%%sb' LIKE %s",
        "SELECT 1",
    ],
)
def test_statements_are_converted_to_qmark_style_as_django_converts_them(sql):
    from django.db.backends.sqlite3.base import SQLiteCursorWrapper as Django

    with connection.cursor() as cursor:
        ours = cursor.cursor.convert_query(sql)
        assert ours == Django.convert_query(cursor.cursor, sql)
        assert cursor.cursor.convert_query(sql) is ours  # converted once
        # Named ("pyformat") parameters stay Django's own.
        assert cursor.cursor.convert_query("SELECT %(a)s", param_names=["a"]) == "SELECT :a"


def test_a_literal_percent_and_parameters_reach_sqlite_intact():
    with connection.cursor() as cursor:
        cursor.execute("SELECT '100%%', %s, %s", ["a%sb", 7])
        assert cursor.fetchone() == ("100%", "a%sb", 7)

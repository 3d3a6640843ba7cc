"""studio.sqlite.checkpoints: a server's WAL checkpoints on a thread of its own, not in a commit."""

from __future__ import annotations

import sqlite3
import struct
import threading
import time
from pathlib import Path

import pytest
from django.db import DEFAULT_DB_ALIAS, connection

from studio.sqlite import checkpoints
from studio.sqlite.checkpoints import Checkpointer
from tests.factories import make_user

pytestmark = pytest.mark.django_db(transaction=True)

BOUND = 15.0
THREAD = "studio-sqlite-checkpoints"


def wal_frames() -> int:
    """Frames in the WAL now: ``mxFrame`` of the wal-index header, read without a checkpoint."""
    header = Path(f"{connection.settings_dict['NAME']}-shm").read_bytes()[:48]
    return struct.unpack("=I", header[16:20])[0]


@pytest.fixture
def sqlite_file():
    if connection.vendor != "sqlite":
        pytest.fail("these tests are about SQLite (pass 1 runs them)")
    return Path(connection.settings_dict["NAME"])


def test_a_commit_checkpoints_by_itself_only_past_ten_thousand_pages(sqlite_file):
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_autocheckpoint")
        assert cursor.fetchone()[0] == 10_000


def test_a_checkpoint_copies_every_committed_page_into_the_database(sqlite_file):
    make_user("committed")
    busy, frames, copied = Checkpointer(DEFAULT_DB_ALIAS).checkpoint()
    assert busy == 0
    assert frames > 0
    assert copied == frames


def test_after_a_checkpoint_the_next_commit_starts_the_wal_over(sqlite_file):
    for i in range(20):
        make_user(f"before-{i}")
    busy, frames, copied = Checkpointer(DEFAULT_DB_ALIAS).checkpoint()
    assert busy == 0 and copied == frames > 0
    make_user("after")
    # The WAL was copied whole, so this commit wrote from its start again
    # instead of appending to it: SQLite's own threshold is never reached.
    assert wal_frames() < frames


def test_the_checkpointer_never_creates_a_database(sqlite_file, tmp_path, monkeypatch):
    missing = tmp_path / "missing.sqlite3"
    monkeypatch.setitem(connection.settings_dict, "NAME", str(missing))
    assert Checkpointer(DEFAULT_DB_ALIAS).checkpoint() is None
    assert not missing.exists()
    assert not Path(f"{missing}-wal").exists()


def test_the_checkpointer_follows_the_database_when_it_is_renamed(
    sqlite_file, tmp_path, monkeypatch
):
    other = tmp_path / "other.sqlite3"
    db = sqlite3.connect(other, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t (x)")
    db.execute("INSERT INTO t VALUES (1)")
    checkpointer = Checkpointer(DEFAULT_DB_ALIAS)
    try:
        make_user("here")
        assert checkpointer.checkpoint()[1] > 0
        # As the test runner renames the database once its settings exist.
        monkeypatch.setitem(connection.settings_dict, "NAME", str(other))
        busy, frames, copied = checkpointer.checkpoint()
        assert checkpointer.path == str(other)
        assert busy == 0 and copied == frames > 0
    finally:
        checkpointer.close()
        db.close()


def test_a_server_starts_one_checkpointer_that_keeps_the_wal_short(sqlite_file, monkeypatch):
    monkeypatch.setattr(checkpoints, "CHECKPOINT_SECONDS", 0.01)
    assert checkpoints.start() is True
    assert checkpoints.start() is True  # once per process
    assert [t.name for t in threading.enumerate()].count(THREAD) == 1
    checked = threading.Event()
    real = Checkpointer.checkpoint

    def spied(self):
        result = real(self)
        if result is not None and result[2] == result[1] > 0:
            checked.set()
        return result

    monkeypatch.setattr(Checkpointer, "checkpoint", spied)
    deadline = time.monotonic() + BOUND
    while not checked.is_set() and time.monotonic() < deadline:
        make_user(f"u{time.monotonic_ns()}")
        checked.wait(0.05)
    assert checked.is_set(), "the thread copied nothing back within the bound"


@pytest.mark.anydb
def test_only_a_sqlite_file_gets_a_checkpointer():
    assert checkpoints.start() is (connection.vendor == "sqlite")

"""The production database: PostgreSQL plans a query the process repeats only once."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings
from django.db import connection

from chat.models import Conversation
from tests.factories import make_conversation, make_user


def prepared_here() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.services
@pytest.mark.django_db
def test_a_query_repeated_on_a_connection_is_prepared_once():
    owner = make_user()
    conversations = [make_conversation(owner) for _ in range(7)]
    for conversation in conversations:
        assert Conversation.objects.owned_by(owner).get(pk=conversation.pk) == conversation
    [statement] = [s for s in prepared_here() if 'FROM "chat_conversation"' in s]
    # Bound on the server: one statement for every id, not one per literal.
    assert "$1" in statement
    assert not any(f'"id" = {c.pk}' in statement for c in conversations)


def test_prepared_statements_can_be_turned_off_for_a_pooler():
    """PgBouncer in transaction mode cannot keep them (settings only: no connection)."""
    show = "from django.conf import settings; print(settings.DATABASES['default']['OPTIONS'])"
    env = {
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/x",
        "DJANGO_SETTINGS_MODULE": "studio.settings",
    }
    options = {}
    for value in ("True", "False"):
        done = subprocess.run(
            [sys.executable, "-c", f"import django; django.setup(); {show}"],
            cwd=settings.BASE_DIR,
            env={**env, "STUDIO_DB_PREPARED_STATEMENTS": value, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        )
        options[value] = done.stdout
    assert "'server_side_binding': True" in options["True"]
    assert "server_side_binding" not in options["False"]

"""A waiting run survives a PostgreSQL restart.

A PostgreSQL cluster of this test's own (initdb as the postgres user), so
restarting it disturbs nobody; two daphnes and a Redis of our own on it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from tests.helpers.clients import APPROVAL_ID, Browserish, Tab
from tests.helpers.live import free_port, two_servers
from tests.helpers.procs import ROOT, child_env
from tests.helpers.services import PrivateRedis, cluster_env

pytestmark = [pytest.mark.services]

BOUND = 30
PG_BIN = Path("/usr/lib/postgresql")


def _pg_tool(name: str) -> str:
    found = sorted(PG_BIN.glob(f"*/bin/{name}"))
    if not found:
        pytest.fail(f"PostgreSQL's {name} is not installed (Debian's postgresql package)")
    return str(found[-1])


class PrivatePostgres:
    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="studio-pg-", dir="/var/tmp"))
        self.data = self.dir / "data"
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *argv: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True)

    def init(self) -> None:
        shutil.chown(self.dir, "postgres", "postgres")
        self._as_postgres(_pg_tool("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_postgres(
            _pg_tool("pg_ctl"), "-D", str(self.data), "-o", options, "-w", "-l",
            str(self.dir / "log"), "start",
        )  # fmt: skip

    def stop(self) -> None:
        self._as_postgres(_pg_tool("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def query(self, sql: str, *params) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def manage(env: dict, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


MAKE_SESSION = """
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from chat.models import Conversation
user = get_user_model().objects.create_user("alice", password="x")
conversation = Conversation.objects.create(owner=user)
session = SessionStore()
session.update({"_auth_user_id": str(user.pk),
                "_auth_user_backend": "django.contrib.auth.backends.ModelBackend",
                "_auth_user_hash": user.get_session_auth_hash()})
session.create()
print(json.dumps({"session": session.session_key, "conversation": conversation.pk}))
"""


@pytest.fixture
def postgres():
    if os.geteuid() != 0:
        pytest.fail("this test starts a PostgreSQL cluster as the postgres user: run it as root")
    server = PrivatePostgres()
    server.init()
    server.start()
    yield server
    try:
        server.stop()
    except subprocess.CalledProcessError:
        pass
    server.remove()


def test_a_waiting_run_survives_a_postgres_restart(postgres, workspace_root, tmp_path):
    redis = PrivateRedis()
    redis.start()
    env = {**cluster_env(redis.url, workspace_root), "DATABASE_URL": postgres.url}
    try:
        manage(child_env(**env), "migrate", "--noinput")
        out = manage(child_env(**env), "shell", "-c", "import json\n" + MAKE_SESSION)
        made = json.loads(out.strip().splitlines()[-1])
        session, conversation = made["session"], made["conversation"]
        with two_servers(tmp_path, **env) as (a, b):
            tab = Tab(a.ws_url, conversation, session, origin=a.url)
            tab.until('id="transcript"')
            tab.send("run python: print(6 * 7)")
            approval_id = APPROVAL_ID.findall(tab.until('data-status="pending"'))[-1]
            deadline = time.monotonic() + BOUND
            while postgres.query("SELECT owner FROM chat_run") != [("",)]:
                assert time.monotonic() < deadline, "the run never let go"
                time.sleep(0.05)

            postgres.stop()
            time.sleep(1)  # both processes' sweeps and heartbeats meet a dead database
            postgres.start()

            page = Browserish(b.url, session)
            mark = tab.mark()
            response = page.decide(approval_id, "allow")
            assert response.status_code == 200, response.text
            tab.until('<pre class="output">42', since=mark)
            tab.until('data-running="false"', since=mark)
            page.close()
            tab.close()
        assert postgres.query("SELECT status FROM chat_run") == [("done",)]
        assert postgres.query("SELECT content FROM chat_message WHERE role = 'tool'") == [("42\n",)]
    finally:
        redis.stop()

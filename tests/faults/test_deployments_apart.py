"""Two deployments on one Redis server never see each other's events (issue 53).

Redis Pub/Sub ignores the database number: a staging deployment on
``redis://…/7`` pushed cards and messages into a production chat on
``redis://…/8`` with the same conversation id. Each deployment's channel
prefix (``STUDIO_CHANNEL_PREFIX``, by default derived from its database and
its Redis server and database number) keeps them apart.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.helpers.clients import Tab, session_cookie
from tests.helpers.live import LiveServer
from tests.helpers.procs import ROOT, child_env
from tests.helpers.services import cluster_env

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

# Deployment B's own database, with a member and a conversation of the given id.
SEED = textwrap.dedent(
    """
    import sys, django
    django.setup()
    from django.core.management import call_command
    from django.test import Client
    from chat.models import Conversation
    from tests.factories import make_user
    call_command("migrate", verbosity=0)
    member = make_user("bea")
    Conversation.objects.create(pk=int(sys.argv[1]), owner=member, title="B's chat")
    client = Client()
    client.force_login(member)
    print(client.cookies["sessionid"].value)
    """
)


def deployment_env(env: dict[str, str], prefix: str | None) -> dict[str, str]:
    """``env`` without the test's own prefix: the deployment's default, or ``prefix``."""
    env = {k: v for k, v in env.items() if k != "STUDIO_CHANNEL_PREFIX"}
    return env if prefix is None else {**env, "STUDIO_CHANNEL_PREFIX": prefix}


@pytest.mark.parametrize(
    ("prefixes", "apart"),
    [((None, None), True), (("one-prefix", "one-prefix"), False)],
    ids=["default prefixes", "one prefix given to both (the control)"],
)
def test_two_deployments_on_one_redis_never_see_each_others_events(
    redis_server, workspace_root, tmp_path, conversation, alice, prefixes, apart
):
    base = redis_server.url.rsplit("/", 1)[0]
    a_env = deployment_env(child_env(**cluster_env(f"{base}/7", workspace_root)), prefixes[0])
    b_root = tmp_path / "b-workspaces"
    b_root.mkdir()
    b_env = deployment_env(
        child_env(
            **cluster_env(f"{base}/8", b_root),
            DATABASE_URL=f"sqlite:///{tmp_path / 'b.sqlite3'}",
        ),
        prefixes[1],
    )
    seeded = subprocess.run(
        [sys.executable, "-c", SEED, str(conversation.pk)],
        cwd=ROOT, env=b_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert seeded.returncode == 0, seeded.stderr
    b_session = seeded.stdout.strip().splitlines()[-1]
    a = LiveServer(log_path=tmp_path / "a.log")
    a.env = a_env
    b = LiveServer(log_path=tmp_path / "b.log")
    b.env = b_env
    a.start()
    tabs: list[Tab] = []
    try:
        b.start()
        tab_a = Tab(a.ws_url, conversation.pk, session_cookie(alice), origin=a.url)
        tab_b = Tab(b.ws_url, conversation.pk, b_session, origin=b.url)
        tabs += [tab_a, tab_b]
        tab_a.until('id="transcript"')
        tab_b.until('id="transcript"')
        # Each deployment's own events reach its own tab. Redis delivers one
        # channel's messages in order, so once B's tab has B's own later
        # message, anything of A's that leaked has arrived before it.
        tab_a.send("written in deployment A")
        tab_a.until("written in deployment A")
        tab_a.until('data-running="false"')
        tab_b.send("written in deployment B")
        tab_b.until("written in deployment B")
        tab_b.until('data-running="false"')
        tab_a.send("written in A again")
        tab_a.until("written in A again")
        tab_a.until('data-running="false"')
    finally:
        for tab in tabs:
            tab.close()
        a.stop()
        b.stop()
    b_saw_a = "written in deployment A" in "\n".join(tab_b.frames)
    a_saw_b = "written in deployment B" in "\n".join(tab_a.frames)
    assert (b_saw_a, a_saw_b) == ((False, False) if apart else (True, True))

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from chat.runs.local import local_runs
from studio.runtime import replace_runtime, restore_runtime, runtime
from tests.factories import make_conversation, make_user
from tests.helpers.runtimes import cancel_local_runs

REQUIRE_SERVICES = os.environ.get("STUDIO_REQUIRE_SERVICES") == "1"


def _reachable(url: str, default_port: int) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection(
            (parsed.hostname or "127.0.0.1", parsed.port or default_port), 2
        ):
            return True
    except OSError:
        return False


def _services_problem() -> str | None:
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        return "DATABASE_URL does not point at PostgreSQL"
    if not settings.REDIS_URL:
        return "REDIS_URL is not set"
    db = settings.DATABASES["default"]
    if not _reachable(f"postgres://{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}", 5432):
        return "PostgreSQL is not reachable"
    if not _reachable(settings.REDIS_URL, 6379):
        return "Redis is not reachable"
    return None


@pytest.fixture(autouse=True)
def _services_guard(request):
    """Tests marked ``services`` need real PostgreSQL and Redis.

    Without them they are skipped locally, but fail when STUDIO_REQUIRE_SERVICES=1
    (CI): a missing service there is a failure, never a skip.
    """
    if request.node.get_closest_marker("services") is None:
        return
    problem = _services_problem()
    if problem is None:
        return
    if REQUIRE_SERVICES:
        pytest.fail(f"required service missing: {problem}")
    pytest.skip(problem)


@pytest.fixture(scope="session", autouse=True)
def _sync_thread_connections_closed(django_db_setup):
    """Async tests read rows through ``sync_to_async``: asgiref's one sync thread
    then keeps a connection, and PostgreSQL would not drop the test database
    under it. Close it before the database is torn down."""
    yield
    asyncio.run(sync_to_async(connections.close_all)())


@pytest.fixture(scope="session", autouse=True)
def _process_runtime_ends_before_the_database(django_db_setup, django_db_blocker):
    """The process-wide runtime winds down at interpreter exit, and chat's part
    of that clears this process's name from the runs it stepped: in a test
    session the database is gone by then. Wind it down while it is here."""
    yield
    rt = runtime()
    if rt.loop is not None:  # started: its exit is registered
        with django_db_blocker.unblock():
            rt.exit()


@pytest.fixture
def root_sandbox():
    """Tests of the isolation layer need root and bubblewrap.

    CI (STUDIO_REQUIRE_SERVICES=1) has both; there a missing one is a failure.
    On a laptop without them the tests are skipped (README: what works there).
    """
    from chat.tools import sandbox

    problem = None
    if os.geteuid() != 0:
        problem = "the sandbox tests need root (uid switch, cgroups)"
    elif sandbox.bwrap_path() is None:
        problem = "bubblewrap (bwrap) is not installed"
    if problem is None:
        return
    if REQUIRE_SERVICES:
        pytest.fail(f"required for CI: {problem}")
    pytest.skip(problem)


@pytest.fixture
def alice(db):
    return make_user("alice")


@pytest.fixture
def bob(db):
    return make_user("bob")


@pytest.fixture
def admin_user(db):
    return make_user("root", superuser=True)


@pytest.fixture
def conversation(alice):
    return make_conversation(alice, title="Alice's chat")


@pytest.fixture(scope="session")
def workspace_root():
    # Not under /tmp: each tool call gets a private /tmp of its own, and a
    # workspace inside it would show up there. Not under tmp_path either
    # (pytest's base is 0700 and STUDIO_SANDBOX=none runs tools as they are).
    from chat.tools.sandbox import under_private_dir

    base = Path(settings.BASE_DIR) / ".test-workspaces"
    if under_private_dir(base) and os.geteuid() == 0:
        # A checkout under /tmp (a CI clone, say): somewhere the calls do not
        # get a private copy of, and traversable by the tools' own uids.
        base = Path("/var/lib/studio-test-workspaces")
    base.mkdir(mode=0o711, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="ws-", dir=base))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fast_settings(settings, workspace_root, tmp_path_factory):
    settings.STUDIO_WORKSPACE_ROOT = workspace_root
    settings.MEDIA_ROOT = tmp_path_factory.getbasetemp() / "media"
    # PBKDF2 costs ~0.3 s per user; tests make many.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _python_sessions_end():
    """A test's python sessions end with it (a session outlives its calls by design)."""
    from chat.tools.sessions import SESSIONS

    yield
    SESSIONS.end_all()


@pytest.fixture
def alice_client(alice):
    """A test client logged in as alice."""
    from django.test import Client

    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
async def stop_runtime():
    """For a test that opens sockets on its own loop: the runtime's tasks stop with it."""
    yield
    await runtime().stop()


@pytest.fixture
async def rt(settings):
    """A fresh runtime on this test's loop (four agent workers, a quick sweep), put back after."""
    settings.STUDIO_APPROVAL_POLL_SECONDS = 0.1
    old = runtime()
    fresh = replace_runtime(agent_workers=4)
    await fresh.start()
    yield fresh
    await cancel_local_runs(fresh)
    await fresh.stop()
    restore_runtime(old)
    assert not local_runs(fresh).all(), "a run outlived its test"

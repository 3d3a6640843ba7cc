"""Helpers for tests that run Studio code in other OS processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """A DATABASE_URL for the *test* database the current test uses."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{db['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "studio.settings"
    env["DATABASE_URL"] = database_url()
    env["PYTHONPATH"] = str(ROOT)
    # The children are this deployment: the test database's name differs
    # from the one the prefix was derived from, so it is passed on.
    env["STUDIO_CHANNEL_PREFIX"] = settings.STUDIO_CHANNEL_PREFIX
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    else:
        env.pop("REDIS_URL", None)
    env.update(extra)
    return env


def spawn(script: str, *args: str, **extra_env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "helpers" / script), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(**extra_env),
        cwd=ROOT,
    )


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """One line of the child's stdout, or fail after ``timeout`` seconds."""
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not selector.select(timeout):
            proc.kill()
            raise AssertionError(f"no output from child within {timeout}s: {proc.stderr.read()}")
        line = proc.stdout.readline()
    finally:
        selector.close()
    if not line:
        proc.wait(timeout)
        raise AssertionError(f"child exited ({proc.returncode}): {proc.stderr.read()}")
    return line


def until(ask, what: str, bound: float = 30):
    """``ask()`` until it answers something true, for at most ``bound`` seconds: its answer.

    For what another process does in its own time (a run resumed, a scrape made).
    """
    deadline = time.monotonic() + bound
    while not (answer := ask()):
        assert time.monotonic() < deadline, f"{what} did not happen in {bound} s"
        time.sleep(0.05)
    return answer

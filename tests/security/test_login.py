"""Login throttling (django-axes) and the secret key of `make run`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from django.test import Client

from tests.factories import PASSWORD, make_user
from tests.helpers.live import free_port
from tests.helpers.procs import ROOT, child_env

pytestmark = pytest.mark.django_db


def attempt(password: str, *, address: str = "10.0.0.1"):
    client = Client(REMOTE_ADDR=address)
    response = client.post("/accounts/login/", {"username": "alice", "password": password})
    return client, response


def test_a_few_wrong_passwords_lock_that_name_from_that_address(settings):
    settings.AXES_FAILURE_LIMIT = 3
    make_user("alice")
    for _ in range(3):
        _, response = attempt("wrong")
    assert response.status_code == 429
    # Locked now, even with the right password...
    client, response = attempt(PASSWORD)
    assert response.status_code == 429
    assert b"Too many failed logins" in response.content
    # The page says how long the pause lasts (STUDIO_LOGIN_COOLOFF_MINUTES, 15 by default).
    assert b"is paused for 15 minutes after 3 wrong passwords" in response.content
    assert "_auth_user_id" not in client.session
    # ...but only from that address: nobody can lock a colleague out from elsewhere.
    client, response = attempt(PASSWORD, address="10.0.0.2")
    assert response.status_code == 302
    assert client.session["_auth_user_id"]


def test_a_success_resets_the_count(settings):
    settings.AXES_FAILURE_LIMIT = 3
    make_user("alice")
    attempt("wrong")
    attempt("wrong")
    assert attempt(PASSWORD)[1].status_code == 302
    attempt("wrong")
    attempt("wrong")
    assert attempt(PASSWORD)[1].status_code == 302


def test_a_login_session_ends_with_deactivation_or_a_new_password():
    # Django's own ModelBackend reads the session's user, with its own checks.
    user = make_user("alice")
    client, response = attempt(PASSWORD)
    assert response.status_code == 302
    assert client.session["_auth_user_backend"] == "django.contrib.auth.backends.ModelBackend"
    assert client.get("/").status_code == 200
    type(user).objects.filter(pk=user.pk).update(is_active=False)
    assert client.get("/").status_code == 302, "an inactive account is logged out"
    type(user).objects.filter(pk=user.pk).update(is_active=True)
    client, _ = attempt(PASSWORD)
    assert client.get("/").status_code == 200
    user.set_password("another-password-456")
    user.save()
    assert client.get("/").status_code == 302, "a new password ends the old sessions"
    type(user).objects.filter(pk=user.pk).delete()
    assert client.get("/").status_code == 302


def test_the_proxy_is_believed_only_when_declared(settings):
    """X-Forwarded-For is the client's to write unless STUDIO_HTTPS trusts a proxy."""
    from django.test import RequestFactory

    from studio.http import client_ip

    request = RequestFactory().get(
        "/", REMOTE_ADDR="10.0.0.9", HTTP_X_FORWARDED_FOR="6.6.6.6, 203.0.113.7"
    )
    settings.STUDIO_HTTPS = False
    assert client_ip(request) == "10.0.0.9"
    settings.STUDIO_HTTPS = True
    assert client_ip(request) == "203.0.113.7"


def settings_in_a_child(**env: str) -> subprocess.CompletedProcess:
    code = "import django; django.setup(); from django.conf import settings; print(settings.DEBUG)"
    base = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "studio.settings"}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **env},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_debug_is_off_unless_asked_for_and_a_key_is_kept_once(tmp_path):
    """Issue 53: no DJANGO_DEBUG meant debug pages, DATABASE_URL's password on them."""
    key_file = tmp_path / "key"
    first = settings_in_a_child(DJANGO_SECRET_KEY_FILE=str(key_file))
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "False"
    assert key_file.stat().st_mode & 0o777 == 0o600
    key = key_file.read_text()
    assert len(key) >= 50
    # Kept: the next start (another process) reads the same key.
    assert settings_in_a_child(DJANGO_SECRET_KEY_FILE=str(key_file)).returncode == 0
    assert key_file.read_text() == key
    asked = settings_in_a_child(DJANGO_DEBUG="True", DJANGO_SECRET_KEY_FILE=str(key_file))
    assert asked.stdout.strip() == "True"


@pytest.mark.django_db(transaction=True)
def test_make_run_serves_without_debug_pages(tmp_path):
    """The daphne command `make run` ends with, as it is written in the Makefile."""
    port = free_port()
    recipe = subprocess.run(
        ["make", "--no-print-directory", "-n", "run", f"PORT={port}", "PYTHON=false"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # Its last command (under `make test`, make would also say where it is).
    serve = next(line for line in reversed(recipe.splitlines()) if "daphne" in line)
    assert "studio.asgi:application" in serve
    env = child_env(DJANGO_SECRET_KEY_FILE=str(tmp_path / "key"))
    env.pop("DJANGO_DEBUG", None)
    server = subprocess.Popen(["sh", "-c", serve], cwd=ROOT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/accounts/nope/", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "make run's daphne did not start"
                time.sleep(0.2)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(20)
    assert response.status_code == 404
    assert "URLconf" not in response.text and "DEBUG = True" not in response.text

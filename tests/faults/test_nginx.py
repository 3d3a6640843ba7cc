"""The production shape, proven: Debian's nginx (deploy/nginx-site.conf, TLS) in
front of two daphne processes on PostgreSQL and Redis, driven by Chromium."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from deploy.proxy import LocalNginx
from tests.browser.ui import TIMEOUT, card_for, login, new_chat, output, run_finished
from tests.factories import PASSWORD, make_live_member
from tests.helpers.live import two_servers
from tests.helpers.procs import ROOT, child_env
from tests.helpers.services import cluster_env

pytestmark = [pytest.mark.services, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TOKEN = "nginx-test-token"
# Who the web processes run as: Debian's nobody, as the deployment's studio user would.
UNPRIVILEGED = "nobody"
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def static_root(tmp_path) -> Path:
    root = tmp_path / "staticfiles"
    done = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=ROOT, env=child_env(STUDIO_STATIC_ROOT=str(root)), capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return root


@pytest.fixture
def unprivileged(workspace_root):
    """What the production split gives a web process that is not root: its own
    folders, and a cgroup subtree for per-call caps that a privileged helper
    made and handed over (deploy/systemd/studio-cgroups.service does that)."""
    import secrets
    import shutil

    user = pwd.getpwnam(UNPRIVILEGED)
    own = workspace_root.parent / f"own-{secrets.token_hex(4)}"
    folders = {name: own / name for name in ("media", "metrics", "home")}
    for folder in (own, *folders.values()):
        folder.mkdir()
    cgroup = f"studio-test-{secrets.token_hex(4)}"
    helper = ROOT / "deploy" / "bin" / "studio-cgroups"
    changed = _let_in(ROOT, user.pw_uid)  # a checkout in a private folder (a CI clone)
    try:
        for path in [workspace_root, own, *folders.values()]:
            os.chown(path, user.pw_uid, user.pw_gid)
        # The shipped privileged helper, as its unit runs it at boot.
        subprocess.run([helper, cgroup, UNPRIVILEGED], check=True, capture_output=True)
        yield {
            "STUDIO_MEDIA_ROOT": str(folders["media"]),
            "PROMETHEUS_MULTIPROC_DIR": str(folders["metrics"]),
            "HOME": str(folders["home"]),
            "STUDIO_TOOL_CGROUP": cgroup,
        }
    finally:
        for path, mode in changed:
            path.chmod(mode)
        subprocess.run([helper, "--remove", cgroup], check=True, capture_output=True)
        shutil.rmtree(own, ignore_errors=True)


def _let_in(path: Path, uid: int) -> list[tuple[Path, int]]:
    """Let ``uid`` traverse to ``path`` where a parent does not; what was changed."""
    changed = []
    for parent in reversed(path.parents):
        mode = parent.stat().st_mode
        if not mode & 0o001:
            changed.append((parent, mode & 0o7777))
            parent.chmod((mode | 0o001) & 0o7777)
    return changed


def test_a_gated_call_through_nginx_with_two_unprivileged_processes(
    redis_server, workspace_root, tmp_path, static_root, settings, unprivileged
):
    from axes.models import AccessAttempt
    from playwright.sync_api import sync_playwright

    make_live_member(settings, "carol")
    env = {
        **cluster_env(redis_server.url, workspace_root),
        "STUDIO_HTTPS": "True",
        "STUDIO_HEALTH_TOKEN": TOKEN,
        **unprivileged,
    }
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    with two_servers(tmp_path, user=UNPRIVILEGED, **env) as (a, b):
        # Issue 53: the web processes run as an unprivileged user, not root.
        for server in (a, b):
            status = Path(f"/proc/{server.pid}/status").read_text()
            uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
            assert int(uid) == pwd.getpwnam(UNPRIVILEGED).pw_uid != 0
        proxy = LocalNginx(prefix, [a.port, b.port], static_root).start()
        try:
            http = httpx.Client(base_url=proxy.url, verify=proxy.ssl, timeout=10)
            # Plain HTTP sends the browser to HTTPS (and lets ACME's challenge through).
            plain = httpx.get(f"{proxy.http_url}/c/1/?x=1", headers={"Host": "studio.test"})
            assert plain.status_code == 301
            assert plain.headers["Location"] == "https://studio.test/c/1/?x=1"
            # Health and metrics through the proxy.
            assert http.get("/healthz").text == "ok\n"
            auth = {"Authorization": f"Bearer {TOKEN}"}
            ready = http.get("/readyz", headers=auth)
            assert ready.status_code == 200 and all(
                c["ok"] for c in ready.json()["checks"].values()
            ), ready.text
            assert http.get("/readyz").json() == {"status": "ok"}
            assert http.get("/metrics").status_code == 403
            assert "studio_calls_waiting" in http.get("/metrics", headers=auth).text
            # The proxy's request id reaches the app and comes back.
            assert http.get("/healthz", headers={"X-Request-ID": "abc-1"}).headers.get(
                "X-Request-ID"
            ) in ("abc-1", None)
            assert (
                http.get("/accounts/login/", headers={"X-Request-ID": "abc-2"}).headers[
                    "X-Request-ID"
                ]
                == "abc-2"
            )
            # Static files from nginx's own alias.
            js = http.get("/static/studio/studio.js")
            assert js.status_code == 200
            assert js.content == (ROOT / "static" / "studio" / "studio.js").read_bytes()
            # The login throttle sees the client nginx saw, not a forged header.
            http.get("/accounts/login/")
            refused = http.post(
                "/accounts/login/",
                data={
                    "username": "carol",
                    "password": "wrong",
                    "csrfmiddlewaretoken": http.cookies["csrftoken"],
                },
                headers={"X-Forwarded-For": "6.6.6.6", "Origin": proxy.url},
            )
            assert refused.status_code == 200 and "username" in refused.text  # the form again
            assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == ["127.0.0.1"]
            AccessAttempt.objects.all().delete()

            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
                )
                context = browser.new_context(ignore_https_errors=True)
                context.set_default_timeout(TIMEOUT)
                page = context.new_page()
                login(page, proxy, "carol")
                cookies = {c["name"]: c for c in context.cookies()}
                assert cookies["sessionid"]["secure"]  # X-Forwarded-Proto: https, trusted
                new_chat(page)  # waits for the socket: upgraded through nginx
                card = card_for(page, "run python: print(6 * 7)")
                card.locator("button[value=allow]").click()
                output(page, "42").wait_for()
                run_finished(page)
                browser.close()
            # The call ran in a per-call cgroup below the subtree it was given.
            usage = Path("/sys/fs/cgroup/memory", env["STUDIO_TOOL_CGROUP"])
            assert int((usage / "memory.max_usage_in_bytes").read_text()) > 0
        finally:
            proxy.stop()
    access = proxy.access_log
    assert '"GET /ws/' in access and " 101 " in access  # the socket's upgrade, proxied
    assert PASSWORD not in access

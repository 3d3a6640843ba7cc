from __future__ import annotations

import subprocess
import sys
from io import StringIO

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.template import TemplateSyntaxError

from studio.env import env_bool, env_float, env_int, env_list, env_secret
from studio.process import YOUNG_THRESHOLD, compile_templates
from tests.helpers.procs import ROOT, child_env


@pytest.mark.django_db
def test_models_and_migrations_agree():
    call_command("makemigrations", "--check", "--dry-run", stdout=StringIO())


@pytest.mark.parametrize(
    ("helper", "value"),
    [(env_bool, "maybe"), (env_int, "ten"), (env_float, "fast"), (env_int, "-5")],
)
def test_bad_environment_values_name_the_variable(monkeypatch, helper, value):
    monkeypatch.setenv("STUDIO_SOMETHING", value)
    kwargs = {"minimum": 0} if helper in (env_int, env_float) else {}
    with pytest.raises(ImproperlyConfigured, match="STUDIO_SOMETHING"):
        helper("STUDIO_SOMETHING", 1, **kwargs) if helper is not env_bool else helper(
            "STUDIO_SOMETHING"
        )


def test_environment_helpers_read_values(monkeypatch):
    monkeypatch.setenv("A_BOOL", "off")
    monkeypatch.setenv("A_LIST", "a, b,,c")
    monkeypatch.setenv("AN_INT", "7")
    assert env_bool("A_BOOL", True) is False
    assert env_list("A_LIST", []) == ["a", "b", "c"]
    assert env_int("AN_INT", 1) == 7
    assert env_float("MISSING_FLOAT", 2.5) == 2.5


def test_a_secret_comes_from_its_file_or_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("A_SECRET", "from-the-variable")
    monkeypatch.delenv("A_SECRET_FILE", raising=False)
    assert env_secret("A_SECRET", "A_SECRET_FILE") == "from-the-variable"
    kept = tmp_path / "secret"
    kept.write_text("from-the-file\n")
    monkeypatch.setenv("A_SECRET_FILE", str(kept))
    assert env_secret("A_SECRET", "A_SECRET_FILE") == "from-the-file"
    monkeypatch.setenv("A_SECRET_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match="A_SECRET_FILE: cannot read"):
        env_secret("A_SECRET", "A_SECRET_FILE")


@pytest.mark.django_db
def test_ensure_login_creates_one_admin_once():
    from django.contrib.auth import get_user_model

    out = StringIO()
    call_command("ensure_login", stdout=out)
    assert "username: admin" in out.getvalue() and "password: " in out.getvalue()
    again = StringIO()
    call_command("ensure_login", stdout=again)
    assert again.getvalue() == ""
    assert get_user_model().objects.filter(is_superuser=True).count() == 1


@pytest.mark.django_db
def test_every_page_has_an_icon_that_exists(client):
    """The login page (no session) names the icon, and the old name leads to it."""
    page = client.get("/accounts/login/").content.decode()
    assert '<link rel="icon" href="/static/studio/favicon.svg"' in page
    old = client.get("/favicon.ico")
    assert (old.status_code, old["Location"]) == (301, "/static/studio/favicon.svg")
    from django.contrib.staticfiles import finders

    assert "<svg" in open(finders.find("studio/favicon.svg")).read()


def _server_process_prints(entry: str, code: str) -> str:
    """What ``code`` prints in a new process once it has imported the server entry point."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {entry}; {code}"], cwd=ROOT, env=child_env(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("entry", ["studio.asgi", "studio.wsgi"])
def test_a_server_process_keeps_what_it_built_at_start_out_of_full_collections(entry):
    printed = _server_process_prints(
        entry,
        "import gc; print(gc.get_freeze_count(), len(gc.get_objects()), gc.get_threshold()[0])",
    )
    frozen, walked, young = map(int, printed.split())
    assert walked * 100 < frozen
    # Requests' cycles mostly die young, not in a full collection.
    assert young == YOUNG_THRESHOLD


@pytest.mark.parametrize("entry", ["studio.asgi", "studio.wsgi"])
def test_a_server_process_starts_with_its_urls_loaded_and_templates_compiled(entry):
    """A deploy's first requests pay for neither (nor a full collection of them)."""
    printed = _server_process_prints(
        entry,
        "import sys; from django.template import engines; "
        "loader = engines['django'].engine.template_loaders[0]; "
        "print(len(loader.get_template_cache), 'chat.views' in sys.modules)",
    )
    compiled, views_loaded = printed.split()
    assert int(compiled) == len(list((ROOT / "templates").rglob("*.html")))
    assert views_loaded == "True"


def test_a_broken_template_stops_the_start_not_a_request(settings, tmp_path):
    (tmp_path / "fine.html").write_text("{{ name }}")
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "broken.html").write_text("{% if %}")
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [tmp_path]}]
    with pytest.raises(TemplateSyntaxError):
        compile_templates()
    (tmp_path / "pages" / "broken.html").write_text("{% if name %}{{ name }}{% endif %}")
    assert sorted(compile_templates()) == ["fine.html", "pages/broken.html"]

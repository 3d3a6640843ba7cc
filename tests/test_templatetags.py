"""studio_tags: ``{% clock %}`` writes what Django's own filters would, faster."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.template import Context, Template
from django.test import override_settings
from django.utils import timezone, translation

from studio.templatetags import _minute_texts

DJANGO = Template("""<time datetime="{{ m|date:'c' }}" title="{{ m }}">{{ m|time:"H:i" }}</time>""")
CLOCK = Template("{% load studio_tags %}{% clock m %}")

MOMENTS = [
    datetime(2026, 12, 3, 14, 27, 5, 123456, tzinfo=UTC),
    datetime(2026, 12, 3, 14, 27, 59, tzinfo=UTC),  # same minute: from the cache
    datetime(2026, 12, 3, 0, 0, 0, tzinfo=UTC),  # midnight
    datetime(2026, 3, 8, 6, 59, 0, tzinfo=UTC),  # New York: a minute before 3 a.m. EDT
    datetime(2026, 3, 8, 7, 0, 0, tzinfo=UTC),
    datetime(2026, 11, 1, 5, 30, 0, tzinfo=UTC),  # New York: 1:30 a.m. EDT
    datetime(2026, 11, 1, 6, 30, 0, tzinfo=UTC),  # ... and 1:30 a.m. EST, an hour later
    datetime(2026, 7, 1, 12, 0, 0, tzinfo=ZoneInfo("Asia/Kolkata")),  # not in UTC
]


@pytest.fixture(autouse=True)
def _empty_cache():
    # Each test starts from nothing kept: what one caches must not hide another's bug.
    _minute_texts.cache_clear()


def both(moment) -> tuple[str, str]:
    context = {"m": moment}
    return CLOCK.render(Context(context)), DJANGO.render(Context(context))


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Kolkata"])
def test_clock_writes_what_djangos_filters_write(zone):
    with timezone.override(zone):
        for moment in MOMENTS:
            ours, djangos = both(moment)
            assert ours == djangos, moment


def test_a_cached_minute_follows_the_active_zone_and_language():
    moment = MOMENTS[0]
    with timezone.override("UTC"):
        in_utc, djangos = both(moment)
        assert in_utc == djangos
    with timezone.override("Asia/Kolkata"):
        ours, djangos = both(moment)
        assert ours == djangos and ours != in_utc
        assert ">19:57<" in ours
    with translation.override("de"):
        ours, djangos = both(moment)
        assert ours == djangos and ours != in_utc
        assert 'title="3. Dezember 2026 14:27"' in ours


@override_settings(USE_TZ=False)
def test_a_naive_moment_is_shown_as_it_is():
    moment = datetime(2026, 12, 3, 14, 27, 5)
    ours, djangos = both(moment)
    assert ours == djangos
    assert 'datetime="2026-12-03T14:27:05"' in ours


def test_a_format_with_seconds_is_not_kept_per_minute():
    # A language whose date format shows seconds: each second is its own title.
    first = datetime(2026, 12, 3, 14, 27, 5, tzinfo=UTC)
    later = first + timedelta(seconds=30)
    with override_settings(DATETIME_FORMAT="Y-m-d H:i:s"), translation.override(None):
        for moment in (first, later):
            ours, djangos = both(moment)
            assert ours == djangos
        assert "14:27:35" in both(later)[0]


def test_no_moment_no_clock():
    assert CLOCK.render(Context({"m": None})) == ""


def test_the_title_is_escaped_as_the_template_escapes_it():
    with override_settings(DATETIME_FORMAT=r"\<\b\>Y \&"), translation.override(None):
        ours, djangos = both(MOMENTS[0])
    assert ours == djangos
    assert 'title="&lt;b&gt;2026 &amp;"' in ours


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(900, "15 minutes"), (60, "1 minute"), (5400, "1 hour 30 minutes"), (3600, "1 hour"),
     (45, "45 seconds"), (0.6, "0 seconds")],
)  # fmt: skip
def test_pause_length_says_it_as_a_person_would(seconds, said):
    from datetime import timedelta

    from studio.templatetags import pause_length

    assert pause_length(timedelta(seconds=seconds)) == said


@pytest.mark.parametrize(
    ("tool", "subject", "note"),
    [
        ("terminal", "curl -s https://example.com", "curl needs the network"),
        ("terminal", "cd x && pip install pandas", "pip needs the network"),
        ("terminal", "git clone https://example.com/r.git", "git needs the network"),
        ("terminal", "git status", ""),
        ("terminal", "ls -la", ""),
        ("python", "import requests\nrequests.get('https://x')", "this code opens network"),
        ("python", "from urllib.request import urlopen\nurlopen('http://x')", "this code opens"),
        ("python", "print(2 + 2)", ""),
        ("web_fetch", "https://example.com", ""),
    ],
)
def test_a_card_says_when_a_call_plainly_needs_the_network(tool, subject, note):
    """Issue 55: the sandbox has no network; say so before anyone allows such a call."""
    from types import SimpleNamespace

    from approvals.templatetags.approvals_tags import needs_network_note

    said = needs_network_note(SimpleNamespace(tool_name=tool, subject=subject))
    assert said.startswith(note) if note else said == ""

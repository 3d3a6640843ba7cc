"""Tags every app's templates share: ``{% load studio_tags %}`` (see TEMPLATES)."""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache

from django import template
from django.utils import formats, timezone, translation
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

# Format characters that show less than a minute (or the whole instant).
SUB_MINUTE = set("sucrUv")


@register.simple_tag
def clock(moment: datetime | None) -> SafeString:
    """``<time>`` for a moment: the ISO instant, the full date as its title, "HH:MM" shown.

    The same text as ``<time datetime="{{ m|date:'c' }}" title="{{ m }}">{{
    m|time:"H:i" }}</time>``, for a fraction of the cost: Django formats a
    date through translated month and am/pm names on every call (0.15 ms for
    those three), a chat page draws one per message and every decision
    redraws a card and two messages. The title and the clock change once a
    minute, so they are kept per minute, time zone and language.
    """
    if moment is None:
        return SafeString("")
    local = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    title, shown = _minute_texts(
        local.replace(second=0, microsecond=0),
        timezone.get_current_timezone_name(),
        translation.get_language(),
    )
    if title is None:  # this language's format shows seconds: nothing to keep
        title = escape(formats.localize(local))
    # Safe: the title and the clock were escaped (once a minute, in
    # _minute_texts); isoformat() writes digits and "-:.+T" only.
    return mark_safe(f'<time datetime="{local.isoformat()}" title="{title}">{shown}</time>')  # noqa: S308


@lru_cache(maxsize=4096)
def _minute_texts(minute: datetime, zone: str, language: str | None) -> tuple[str | None, str]:
    # ``zone`` and ``language`` are part of the key only: both are active now.
    shown = escape(formats.time_format(minute, "H:i"))
    fmt = formats.get_format("DATETIME_FORMAT")
    if SUB_MINUTE & set(fmt):
        return None, shown
    return escape(formats.localize(minute)), shown


@register.filter
def pause_length(delta) -> str:
    """A timedelta as a person says it: "15 minutes", "1 hour 30 minutes", "45 seconds"."""
    seconds = int(delta.total_seconds())
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [(hours, "hour"), (minutes, "minute")] if hours or minutes else [(seconds, "second")]
    return " ".join(f"{n} {unit}{'' if n == 1 else 's'}" for n, unit in parts if n) or "0 seconds"

"""Reading one row by a unique key."""

from __future__ import annotations

from django.db.models import QuerySet


def one_or_none(queryset: QuerySet):
    """The one row (or value) ``queryset`` finds by a unique key, or None.

    Not ``.first()``: it orders the query (by the model's ``ordering``, else its
    key), and compiling an ORDER BY hashes every selected column to match it
    against the select list, a third of a small read's CPU (bench/RESULTS.md).
    ``.get()`` drops the ordering.
    """
    try:
        return queryset.get()
    except queryset.model.DoesNotExist:
        return None

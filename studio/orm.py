"""Hot reads with their SQL compiled once per connection.

Django compiles a queryset's SQL on every evaluation and has no statement
cache. For the decision's read of its row (the approval with its
conversation, 41 columns) compiling is most of the cost on this project's
machines: 0.5 ms of 0.8 ms, measured in one process on SQLite, against
0.2 ms for the same read through ``PreparedGet``. Every decision POST and
every wake from another process makes that read once.

``PreparedGet`` compiles the queryset once per database connection wrapper
(one per thread), keeps the SQL and the compiler's row layout there, and per
call does only what Django's ``ModelIterable`` does per row: execute, apply
the backend's converters, ``Model.from_db``, fill the ``select_related``
objects. It leans on internals of Django 5.2's SQL compiler (the version
``requirements.txt`` pins); ``tests/test_orm.py`` checks that its rows
equal the ORM's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model, QuerySet
from django.db.models.query import get_related_populators

# Stands for a looked-up text value while compiling; never reaches a database.
_MARK = "\x00studio-prepared-get"


class PreparedGet:
    """``build(value)`` evaluated for its one row (or None), compiled once per connection.

    ``build`` must return a queryset whose only SQL parameter is ``value``
    and that matches at most one row: a filter on a unique column, with
    ``select_related`` as wanted, ordering cleared (``order_by()``), no
    ``only`` or annotations. ``sample``, a value of the column's type, stands
    for it while compiling (a string by default). ``get`` sends its value as
    given, so it must already be of that type, as the ORM would send it.
    """

    def __init__(self, build: Callable[[Any], QuerySet], *, sample: object = _MARK) -> None:
        self.build = build
        self.sample = sample

    def get(self, value: object, *, using: str = DEFAULT_DB_ALIAS) -> Model | None:
        connection = connections[using]
        # Cached on the wrapper, not the DB-API connection: SQL and converters
        # depend on the backend only, so they outlive a reconnect.
        cache = connection.__dict__.setdefault("_studio_prepared", {})
        plan = cache.get(self)
        if plan is None:
            plan = cache[self] = self._compile(using)
        compiler, sql, model, start, end, init_list, populators, converters = plan
        with connection.cursor() as cursor:
            cursor.execute(sql, [value])
            rows: Any = cursor.fetchmany(2)
        if len(rows) > 1:
            raise model.MultipleObjectsReturned(f"{len(rows)}+ rows for {value!r}")
        if converters:
            rows = list(compiler.apply_converters(rows, converters))
        for row in rows:
            obj = model.from_db(using, init_list, row[start:end])
            for populator in populators:
                populator.populate(row, obj)
            return obj
        return None

    def _compile(self, using: str) -> tuple:
        queryset = self.build(self.sample)
        compiler = queryset.query.get_compiler(using)
        sql, params = compiler.as_sql()
        if list(params) != [self.sample]:
            raise ValueError(f"the query must take exactly one parameter, the value: {params!r}")
        select, klass_info = compiler.select, compiler.klass_info
        fields = klass_info["select_fields"]
        start, end = fields[0], fields[-1] + 1
        init_list = [column[0].target.attname for column in select[start:end]]
        populators = get_related_populators(klass_info, select, using)
        converters = compiler.get_converters([column[0] for column in select[: compiler.col_count]])
        return (compiler, sql, klass_info["model"], start, end, init_list, populators, converters)

"""The ORM calls every decision makes, without compiling their SQL each time.

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

``update_where`` does the same for the decision's conditional update, the
tool's output record and the run's end: a plain ``UPDATE … SET … WHERE`` on equal columns,
its SQL built once per shape from the fields' columns (the ORM's update took
0.4 ms per decision here, this 0.13 ms), each value converted by its field.

``PreparedCount`` counts (or finds any of) a queryset's rows for one value
the same way: the header count of waiting approvals that every page of a
member counts again after each change took 0.42 ms through the ORM, 0.03 ms
so, almost all of it compiling.

``PreparedRows`` reads a queryset's rows for any number of values, built as
``PreparedGet`` builds its one: every gated call reads the rules that apply
in its conversation (0.88 ms through the ORM with three rules, 0.08 ms so),
every run's start the enabled MCP servers.

``create_row`` is ``Model.objects.create`` for the rows every run writes (its
messages, its approvals): Django's own insert compiler builds the SQL once
per model and connection, and each call only converts the values, executes
and reads back what the database generated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import Model, QuerySet
from django.db.models.query import get_related_populators
from django.db.models.signals import post_save, pre_save
from django.db.models.sql import InsertQuery

M = TypeVar("M", bound=Model)

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
        sql, layout = _plan(connection, self, lambda: self._compile(using))
        with connection.cursor() as cursor:
            cursor.execute(sql, [value])
            rows: Any = cursor.fetchmany(2)
        if len(rows) > 1:
            raise layout.model.MultipleObjectsReturned(f"{len(rows)}+ rows for {value!r}")
        objs = layout.objects(rows)
        return objs[0] if objs else None

    def _compile(self, using: str) -> tuple:
        compiler = self.build(self.sample).query.get_compiler(using)
        sql, params = compiler.as_sql()
        if list(params) != [self.sample]:
            raise ValueError(f"the query must take exactly one parameter, the value: {params!r}")
        return sql, _RowLayout(compiler, using)


_VALUES_AS_PARAMETERS = "the query's SQL must depend on the values through parameters only"


class PreparedRows:
    """``list(build(*values))``, compiled once per connection.

    For the reads every gated call makes (the rules that apply in its
    conversation, the MCP servers). ``build`` returns a queryset in which
    ``values`` are the only parameters that change from call to call (each
    may stand in several places; there may be none), every other parameter
    being a constant of the query. As for ``PreparedCount``, it is compiled
    with each of the two tuples of ``samples`` (values of the values' types,
    all different and equal to no constant), and the SQL must come out the
    same; each row is then built as ``PreparedGet`` builds its one. Values
    are sent as given, already of their types (ints, strings).
    """

    def __init__(self, build: Callable[..., QuerySet], *, samples=((), ())) -> None:
        first, second = samples
        if len(first) != len(second) or len({*first, *second}) != 2 * len(first):
            raise ValueError("the samples must be two tuples of values all different")
        self.build = build
        self.samples = (tuple(first), tuple(second))

    def all(self, *values: object, using: str = DEFAULT_DB_ALIAS) -> list[Model]:
        connection = connections[using]
        sql, constants, places, layout = _plan(connection, self, lambda: self._compile(using))
        if len(values) != len(self.samples[0]):
            raise TypeError(f"{len(self.samples[0])} values expected, {len(values)} given")
        params = list(constants)
        for place, index in places:
            params[place] = values[index]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        return layout.objects(rows)

    def _compile(self, using: str) -> tuple:
        compilers = [self.build(*sample).query.get_compiler(using) for sample in self.samples]
        sql, params, places = _value_places([c.as_sql() for c in compilers], self.samples)
        return sql, params, places, _RowLayout(compilers[0], using)


def _value_places(compiled: list[tuple], samples: tuple[tuple, tuple]) -> tuple:
    """Where each value goes in a query compiled once with each tuple of ``samples``.

    Returns the SQL, its parameters (the first sample's values in their
    places) and ``(place, index)`` for every parameter that is value
    ``index``. Refuses a query whose SQL changes with the values, that
    leaves a value out, or whose constants equal a sample (they could not be
    told apart).
    """
    (sql, params), (other_sql, other_params) = compiled
    first, second = samples

    def index_of(param: object, sample: tuple) -> int | None:
        found = [i for i, v in enumerate(sample) if type(v) is type(param) and v == param]
        return found[0] if found else None

    places = []
    for place, (a, b) in enumerate(zip(params, other_params, strict=True)):
        index = index_of(a, first)
        if a == b and index is None:
            continue  # a constant
        if index is None or index_of(b, second) != index:
            raise ValueError(_VALUES_AS_PARAMETERS)
        places.append((place, index))
    if sql != other_sql or {index for _, index in places} != set(range(len(first))):
        raise ValueError(_VALUES_AS_PARAMETERS)
    return sql, tuple(params), tuple(places)


class _RowLayout:
    """How a compiled SELECT's rows become model instances, as Django's ``ModelIterable`` does."""

    def __init__(self, compiler, using: str) -> None:
        select, klass_info = compiler.select, compiler.klass_info
        fields = klass_info["select_fields"]
        self.compiler, self.using = compiler, using
        self.model = klass_info["model"]
        self.start, self.end = fields[0], fields[-1] + 1
        self.init_list = [column[0].target.attname for column in select[self.start : self.end]]
        self.populators = get_related_populators(klass_info, select, using)
        self.converters = compiler.get_converters(
            [column[0] for column in select[: compiler.col_count]]
        )

    def objects(self, rows: Any) -> list[Model]:
        if self.converters:
            rows = list(self.compiler.apply_converters(rows, self.converters))
        objs = []
        for row in rows:
            obj = self.model.from_db(self.using, self.init_list, row[self.start : self.end])
            for populator in self.populators:
                populator.populate(row, obj)
            objs.append(obj)
        return objs


class PreparedCount:
    """``build(value).count()`` and ``.exists()``, compiled once per connection.

    ``build`` returns a queryset in which ``value`` is the only parameter
    that changes from call to call (it may stand in several places); every
    other parameter is a constant of the query. It is compiled twice, with
    each of ``samples`` (two different values of the value's type, equal to
    no constant), and the SQL must come out the same: the parameters that
    differ are the value's places. Each call then runs ``SELECT COUNT(*)``
    (or ``SELECT 1 … LIMIT 1``) over that SQL with the value put in them.
    Like ``PreparedGet``, the value is sent as given, already of its type.
    """

    def __init__(self, build: Callable[[Any], QuerySet], *, samples: tuple[object, object]):
        if samples[0] == samples[1]:
            raise ValueError("the two samples must differ")
        self.build = build
        self.samples = samples

    def count(self, value: object, *, using: str = DEFAULT_DB_ALIAS) -> int:
        with self._cursor("count", value, using) as cursor:
            return cursor.fetchone()[0]

    def exists(self, value: object, *, using: str = DEFAULT_DB_ALIAS) -> bool:
        with self._cursor("exists", value, using) as cursor:
            return cursor.fetchone() is not None

    @contextlib.contextmanager
    def _cursor(self, kind: str, value: object, using: str):
        connection = connections[using]
        sql, constants, places = _plan(
            connection, (self, kind), lambda: self._compile(kind, connection, using)
        )
        params = list(constants)
        for place, _ in places:
            params[place] = value
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            yield cursor

    def _compile(self, kind: str, connection, using: str) -> tuple:
        compiled = [
            self.build(sample).order_by().values("pk").query.get_compiler(using).as_sql()
            for sample in self.samples
        ]
        sql, params, places = _value_places(compiled, tuple((s,) for s in self.samples))
        name = connection.ops.quote_name("counted")
        if kind == "count":
            sql = f"SELECT COUNT(*) FROM ({sql}) {name}"  # noqa: S608 - Django's own SQL
        else:
            sql = f"SELECT 1 FROM ({sql}) {name} LIMIT 1"  # noqa: S608 - Django's own SQL
        return sql, params, places


def update_where(
    model: type[Model], *, where: dict, values: dict, using: str = DEFAULT_DB_ALIAS
) -> int:
    """``model._base_manager.filter(**where).update(**values)``; returns the rows changed.

    For the writes every decision makes (its conditional update, the tool's
    output): equality on concrete columns, plain values (a model instance for
    a foreign key), no expressions. The SQL is built once per shape and
    connection from the fields' columns; each value goes through its field's
    own ``get_db_prep_*`` conversion, as Django's update compiler does it,
    without compiling a queryset on every call.
    """
    connection = connections[using]
    key = (model, tuple(where), tuple(values))
    sql, set_fields, where_fields = _plan(
        connection, key, lambda: _update_plan(model, key[1], key[2], connection)
    )
    params = [
        field.get_db_prep_save(_saved(field, value), connection)
        for field, value in zip(set_fields, values.values(), strict=True)
    ]
    for field, value in zip(where_fields, where.values(), strict=True):
        if value is None:  # filter() would mean IS NULL
            raise TypeError(f"update_where matches plain values, not None ({field.name})")
        value = field.get_prep_value(_saved(field, value))
        params.append(field.get_db_prep_value(value, connection, prepared=True))
    with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def create_row(model: type[M], /, using: str = DEFAULT_DB_ALIAS, **values: Any) -> M:
    """``model.objects.create(**values)``, with the INSERT compiled once per connection.

    For plain models: no parents, proxies or ``order_with_respect_to``, no
    database defaults, plain values (no expressions). Everything else is
    ``save``'s own: the instance built by ``model(**values)``, related
    objects checked, ``pre_save`` of each field (``auto_now_add``), each
    value converted by its field, the generated columns read back (the id),
    the ``pre_save``/``post_save`` signals sent, ``_state`` set.
    """
    obj = model(**values)
    obj._prepare_related_fields_for_save(operation_name="save")
    meta = model._meta
    if not obj._is_pk_set(meta):
        setattr(obj, meta.pk.attname, meta.pk.get_pk_value_on_save(obj))
    pk_set = obj._is_pk_set(meta)
    connection = connections[using]
    plan = _plan(connection, (model, "insert", pk_set), lambda: _insert_plan(model, pk_set, using))
    compiler, sql, fields, returning, returning_params, converters = plan
    pre_save.send(sender=model, instance=obj, raw=False, using=using, update_fields=None)
    params = [
        field.get_db_prep_save(_saved(field, field.pre_save(obj, add=True)), connection)
        for field in fields
    ]
    with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
        cursor.execute(sql, params)
        if not returning:
            row = ()
        elif connection.features.can_return_columns_from_insert:
            row = connection.ops.fetch_returned_insert_columns(cursor, returning_params)
        else:  # an auto field, read back as the ORM does without RETURNING
            row = (connection.ops.last_insert_id(cursor, meta.db_table, returning[0].column),)
    if converters:
        row = next(iter(compiler.apply_converters([row], converters)))
    for value, field in zip(row, returning, strict=True):
        setattr(obj, field.attname, value)
    obj._state.db, obj._state.adding = using, False
    post_save.send(
        sender=model, instance=obj, created=True, update_fields=None, raw=False, using=using
    )
    return obj


def _insert_plan(model: type[Model], pk_set: bool, using: str) -> tuple:
    """Django's own INSERT for ``model``, compiled once for a sample row."""
    meta = model._meta
    if meta.parents or meta.proxy or meta.order_with_respect_to:
        raise ValueError(f"create_row handles plain models only, not {meta.label}")
    fields = [
        f
        for f in meta.local_concrete_fields
        if not f.generated and (pk_set or f is not meta.auto_field)
    ]
    for field in fields:
        if field.has_db_default() or hasattr(field, "get_placeholder"):
            raise ValueError(f"create_row handles plain columns only, not {field.name}")
    returning = list(meta.db_returning_fields)
    if returning and not (
        connections[using].features.can_return_columns_from_insert
        or (len(returning) == 1 and returning[0] is meta.auto_field)
    ):
        raise ValueError(f"this database cannot give back {meta.label}'s generated columns")
    sample = model()
    query = InsertQuery(model)
    query.insert_values(fields, [sample])
    compiler = query.get_compiler(using=using)
    compiler.returning_fields = returning
    ((sql, _),) = compiler.as_sql()
    returning_params = getattr(compiler, "returning_params", ())
    converters = compiler.get_converters([f.get_col(meta.db_table) for f in returning])
    return compiler, sql, fields, returning, returning_params, converters


def _plan(connection, key: object, make: Callable[[], tuple]) -> tuple:
    """What ``make`` built for ``key`` on this connection wrapper (built the first time).

    Kept on the wrapper (one per thread), not the DB-API connection: SQL and
    converters depend on the backend only, so they outlive a reconnect.
    """
    plans = connection.__dict__.setdefault("_studio_plans", {})
    plan = plans.get(key)
    if plan is None:
        plan = plans[key] = make()
    return plan


def _saved(field, value):
    if hasattr(value, "resolve_expression"):
        raise TypeError(f"studio.orm takes plain values, not expressions such as {value!r}")
    if hasattr(value, "prepare_database_save"):
        return value.prepare_database_save(field)  # a model instance: its key
    return value


def _update_plan(model, where: tuple[str, ...], names: tuple[str, ...], connection) -> tuple:
    if not where or not names:
        raise ValueError("update_where needs at least one column to match and one to set")
    meta = model._meta
    fields = [meta.pk if name == "pk" else meta.get_field(name) for name in (*where, *names)]
    for field in fields:
        if not field.concrete or field.many_to_many or hasattr(field, "get_placeholder"):
            raise ValueError(f"update_where handles plain columns only, not {field.name}")
    set_fields, where_fields = fields[len(where) :], fields[: len(where)]
    if any(field.primary_key for field in set_fields):
        raise ValueError("update_where does not change primary keys")
    quote = connection.ops.quote_name
    # Names from the model's own meta, quoted by the backend; values are parameters.
    sql = "UPDATE {} SET {} WHERE {}".format(  # noqa: S608
        quote(meta.db_table),
        ", ".join(f"{quote(field.column)} = %s" for field in set_fields),
        " AND ".join(
            f"{quote(meta.db_table)}.{quote(field.column)} = %s" for field in where_fields
        ),
    )
    return sql, set_fields, where_fields

"""studio.orm: the ORM's reads, updates and inserts, without compiling their SQL each time."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.db.models import F, Q
from django.db.models.signals import post_save, pre_save
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import ToolApproval, ToolRule, arguments_hash
from approvals.rules import rules_for
from chat.models import Conversation, Message, Run
from studio.orm import PreparedCount, PreparedGet, PreparedRows, create_row, update_where
from tests.factories import make_approval, make_conversation, make_user

pytestmark = [pytest.mark.anydb, pytest.mark.django_db(transaction=True)]


def values(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def orm_row(approval_id: str) -> ToolApproval:
    return ToolApproval.objects.select_related("conversation").get(approval_id=approval_id)


def test_a_row_equals_the_orms_with_its_conversation(conversation, bob):
    # JSON, datetimes, floats, nulls, an IP and a foreign key: every converter runs.
    approval = make_approval(
        conversation,
        arguments={"code": "print('é')", "n": [1, 2.5, None]},
        tool_schema={"type": "object"},
        tool_hints=["reads"],
        rule_snapshot={"note": "x"},
    )
    ToolApproval.objects.filter(pk=approval.pk).update(
        status=ToolApproval.Status.ALLOWED,
        decided_by=bob,
        decided_at=timezone.now() + timedelta(seconds=3),
        decision_seconds=3.25,
        decided_ip="192.0.2.7",
    )
    Conversation.objects.filter(pk=conversation.pk).update(enabled_tools=["python", "shell"])

    got = ToolApproval.objects.by_approval_id(approval.approval_id)
    want = orm_row(approval.approval_id)

    assert values(got) == values(want)
    assert got.decided_at.tzinfo is not None and got.arguments["n"] == [1, 2.5, None]
    with CaptureQueriesContext(connection) as queries:
        assert values(got.conversation) == values(want.conversation)
    assert len(queries) == 0, "the conversation comes with the row"
    assert got._state.db == "default" and not got._state.adding
    got.note = "saved through the ORM as usual"
    got.save(update_fields=["note"])
    assert ToolApproval.objects.get(pk=approval.pk).note == "saved through the ORM as usual"


def test_unknown_ids_give_none_and_one_query_each(conversation):
    make_approval(conversation)
    with CaptureQueriesContext(connection) as queries:
        assert ToolApproval.objects.by_approval_id("nope") is None
        assert ToolApproval.objects.by_approval_id("") is None
    assert len(queries) == 2


def test_each_thread_reads_through_its_own_connection(conversation):
    rows = [make_approval(conversation) for _ in range(4)]
    assert ToolApproval.objects.by_approval_id(rows[0].approval_id).pk == rows[0].pk
    seen: dict[int, object] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(rows))

    def read(i: int) -> None:
        try:
            start.wait(timeout=10)
            for _ in range(20):
                seen[i] = ToolApproval.objects.by_approval_id(rows[i].approval_id)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(rows))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert not errors and not any(t.is_alive() for t in threads)
    assert {i: seen[i].pk for i in seen} == {i: row.pk for i, row in enumerate(rows)}


def test_a_reconnect_keeps_working(conversation):
    approval = make_approval(conversation)
    assert ToolApproval.objects.by_approval_id(approval.approval_id).pk == approval.pk
    connection.close()
    assert ToolApproval.objects.by_approval_id(approval.approval_id).pk == approval.pk


def test_more_than_one_row_is_an_error_not_a_pick(conversation):
    a, b = make_approval(conversation), make_approval(conversation)
    by_tool = PreparedGet(lambda tool: ToolApproval.objects.filter(tool_name=tool).order_by())
    with pytest.raises(ToolApproval.MultipleObjectsReturned):
        by_tool.get("python")
    ToolApproval.objects.filter(pk=b.pk).update(tool_name="shell")
    assert by_tool.get("python").pk == a.pk


def test_a_query_with_other_parameters_is_refused(conversation):
    make_approval(conversation)
    two = PreparedGet(
        lambda value: ToolApproval.objects.filter(approval_id=value, tool_name="python")
    )
    with pytest.raises(ValueError, match="exactly one parameter"):
        two.get("x")


def test_an_integer_key_is_compiled_with_a_sample_of_its_type(alice, bob):
    by_pk = PreparedGet(lambda pk: type(alice).objects.filter(pk=pk).order_by(), sample=0)
    assert values(by_pk.get(bob.pk)) == values(type(bob).objects.get(pk=bob.pk))
    assert by_pk.get(10**9) is None


SAMPLES = (-2_000_000_001, -2_000_000_002)


def waiting_for(user_pk: int, reviewer: bool):
    """A query with the value in two places and constants beside it (as the inbox's)."""
    mine = Q(conversation__owner_id=user_pk)
    if reviewer:
        mine |= Q(needs_review=True) & ~Q(requested_by_id=user_pk)
    return ToolApproval.objects.filter(status=ToolApproval.Status.PENDING).filter(mine)


def test_a_count_and_an_exists_equal_the_orms(conversation, alice, bob):
    theirs = make_conversation(bob)
    make_approval(conversation)
    make_approval(conversation, needs_review=True)
    make_approval(conversation, status=ToolApproval.Status.ALLOWED)
    make_approval(theirs, needs_review=True)
    make_approval(theirs, needs_review=True, requested_by=alice)
    make_approval(theirs)
    carol = make_user("carol")
    for reviewer in (False, True):
        prepared = PreparedCount(lambda pk, r=reviewer: waiting_for(pk, r), samples=SAMPLES)
        for user in (alice, bob, carol):
            want = waiting_for(user.pk, reviewer)
            assert prepared.count(user.pk) == want.count(), (reviewer, user)
            assert prepared.exists(user.pk) == want.exists(), (reviewer, user)
    # The cases differ, so the comparison can fail. As a reviewer: alice her
    # two and bob's own review card (not the one she asked for), bob his three
    # and alice's review card, carol the three review cards.
    reviewing = PreparedCount(lambda pk: waiting_for(pk, True), samples=SAMPLES)
    assert [reviewing.count(u.pk) for u in (alice, bob, carol)] == [3, 4, 3]
    member = PreparedCount(lambda pk: waiting_for(pk, False), samples=SAMPLES)
    assert [member.count(u.pk) for u in (alice, bob, carol)] == [2, 3, 0]


def test_a_count_is_compiled_once_per_connection(conversation, alice):
    make_approval(conversation)
    builds = []

    def build(pk):
        builds.append(pk)
        return waiting_for(pk, True)

    prepared = PreparedCount(build, samples=SAMPLES)
    with CaptureQueriesContext(connection) as queries:
        assert [prepared.count(alice.pk) for _ in range(3)] == [1, 1, 1]
        assert prepared.exists(alice.pk)
    assert len(queries) == 4 and "COUNT(*)" in queries[0]["sql"]
    assert builds == [*SAMPLES, *SAMPLES], "twice for the count, twice for exists, never again"


def test_a_query_whose_sql_depends_on_the_value_is_refused(conversation):
    make_approval(conversation)
    shapes = PreparedCount(
        lambda pk: ToolApproval.objects.filter(Q(pk=pk) if pk % 2 else Q(pk__gte=pk)),
        samples=SAMPLES,
    )
    constant = PreparedCount(lambda pk: ToolApproval.objects.filter(pk=5), samples=SAMPLES)
    for prepared in (shapes, constant):
        with pytest.raises(ValueError, match="parameters only"):
            prepared.count(1)
    with pytest.raises(ValueError, match="must differ"):
        PreparedCount(lambda pk: waiting_for(pk, False), samples=(1, 1))


PAIRS = ((-2_000_000_001, -2_000_000_002), (-2_000_000_003, -2_000_000_004))


def test_the_rules_of_a_call_equal_the_orms(conversation, alice, bob):
    # Every scope, for this conversation and for others, revoked or not.
    other = make_conversation(alice)
    theirs = make_conversation(bob)
    Scope = ToolRule.Scope
    made = [
        ToolRule.objects.create(tool="python", action="allow", scope=Scope.EVERYONE),
        ToolRule.objects.create(tool="*", action="ask", scope=Scope.MEMBER, member=alice),
        ToolRule.objects.create(tool="shell", action="deny", scope=Scope.MEMBER, member=bob),
        ToolRule.objects.create(
            tool="echo", pattern="x*", action="allow", scope=Scope.CONVERSATION,
            conversation=conversation, member=alice,
        ),
        ToolRule.objects.create(
            tool="echo", action="deny", scope=Scope.CONVERSATION, conversation=theirs, member=bob
        ),
        ToolRule.objects.create(
            tool="web", action="deny", scope=Scope.EVERYONE, revoked_at=timezone.now()
        ),
    ]  # fmt: skip
    prepared = PreparedRows(
        lambda owner, pk: ToolRule.objects.applying_in(owner, pk).select_related("member"),
        samples=PAIRS,
    )
    for c in (conversation, other, theirs):
        want = list(ToolRule.objects.applying_to(c).select_related("member"))
        got = prepared.all(c.owner_id, c.pk)
        assert [values(r) for r in got] == [values(r) for r in want], c
        with CaptureQueriesContext(connection) as queries:
            assert [r.member_id and r.member.pk for r in got] == [r.member_id for r in got]
        assert len(queries) == 0, "the members come with the rows"
    # The cases differ, so the comparison can fail; rules_for reads the same.
    python, alices, bobs, here, there, _ = made
    assert [r.pk for r in rules_for(conversation)] == [here.pk, alices.pk, python.pk]
    assert [r.pk for r in rules_for(other)] == [alices.pk, python.pk]
    assert [r.pk for r in rules_for(theirs)] == [there.pk, bobs.pk, python.pk]


def test_rows_with_a_value_in_two_places_or_none_equal_the_orms(conversation, alice, bob):
    make_approval(conversation)
    make_approval(conversation, needs_review=True)
    make_approval(make_conversation(bob), needs_review=True)
    reviewing = PreparedRows(
        lambda pk: waiting_for(pk, True), samples=((SAMPLES[0],), (SAMPLES[1],))
    )
    for user in (alice, bob):
        assert [a.pk for a in reviewing.all(user.pk)] == [a.pk for a in waiting_for(user.pk, True)]
    assert [len(reviewing.all(u.pk)) for u in (alice, bob)] == [3, 2]
    pending = PreparedRows(lambda: ToolApproval.objects.filter(needs_review=True))
    assert len(pending.all()) == 2
    with pytest.raises(TypeError, match="0 values expected"):
        pending.all(alice.pk)


def test_rows_are_compiled_once_per_connection(conversation, alice):
    make_approval(conversation)
    builds = []

    def build(owner, pk):
        builds.append((owner, pk))
        return ToolRule.objects.applying_in(owner, pk)

    prepared = PreparedRows(build, samples=PAIRS)
    ToolRule.objects.create(tool="*", action="ask", scope=ToolRule.Scope.MEMBER, member=alice)
    with CaptureQueriesContext(connection) as queries:
        assert [len(prepared.all(alice.pk, conversation.pk)) for _ in range(3)] == [1, 1, 1]
    assert len(queries) == 3
    assert builds == list(PAIRS), "compiled with each sample once, never again"


def test_rows_whose_sql_depends_on_the_values_are_refused(conversation):
    make_approval(conversation)
    one = (SAMPLES[:1], SAMPLES[1:])
    refused = [
        # The value changes the SQL's shape, not just a parameter.
        PreparedRows(
            lambda pk: ToolApproval.objects.filter(Q(pk=pk) if pk % 2 else Q(pk__gte=pk)),
            samples=one,
        ),
        # The value never reaches the SQL.
        PreparedRows(lambda pk: ToolApproval.objects.filter(pk=5), samples=one),
        # A constant of the query equals a sample: it could not be told apart.
        PreparedRows(
            lambda pk: ToolApproval.objects.filter(pk=pk, conversation_id=SAMPLES[0]), samples=one
        ),
        # The values swapped between the samples' places.
        PreparedRows(
            lambda a, b: ToolApproval.objects.filter(pk=a if a == PAIRS[0][0] else b),
            samples=PAIRS,
        ),
    ]
    for prepared in refused:
        with pytest.raises(ValueError, match="parameters only"):
            prepared.all(*([1] * len(prepared.samples[0])))
    with pytest.raises(ValueError, match="all different"):
        PreparedRows(lambda a, b: ToolApproval.objects.all(), samples=((1, 2), (1, 3)))


def test_update_where_writes_what_the_orms_update_writes(conversation, bob):
    # Two equal rows, one updated by the ORM and one by update_where: every
    # field type a decision writes (a user, a time, a float, an IP, JSON).
    ours, theirs = make_approval(conversation), make_approval(conversation)
    now = timezone.now()
    changes = {
        "status": ToolApproval.Status.ALLOWED,
        "decided_by": bob,
        "decided_at": now,
        "note": "é ok",
        "decision_seconds": 1.25,
        "decided_ip": "2001:db8::1",
        "decided_user_agent": "agent/1",
        "approved_arguments": {"code": "print(2)", "n": [1, None]},
        "rule_snapshot": None,
    }
    pending = ToolApproval.Status.PENDING
    assert update_where(ToolApproval, where={"pk": ours.pk, "status": pending}, values=changes)
    ToolApproval.objects.filter(pk=theirs.pk, status=pending).update(**changes)

    got, want = ToolApproval.objects.get(pk=ours.pk), ToolApproval.objects.get(pk=theirs.pk)
    skip = {"id", "approval_id", "requested_at"}
    assert {k: v for k, v in values(got).items() if k not in skip} == {
        k: v for k, v in values(want).items() if k not in skip
    }
    assert got.decided_by_id == bob.pk and got.decided_at == now
    assert got.approved_arguments == {"code": "print(2)", "n": [1, None]}


def test_update_where_matches_or_changes_nothing(conversation):
    approval = make_approval(conversation, status=ToolApproval.Status.DENIED)
    before = values(ToolApproval.objects.get(pk=approval.pk))
    where = {"pk": approval.pk, "status": ToolApproval.Status.PENDING}
    assert update_where(ToolApproval, where=where, values={"note": "late"}) == 0
    assert values(ToolApproval.objects.get(pk=approval.pk)) == before
    # A foreign key matched by its instance, as filter() takes it.
    where = {"conversation": conversation, "approval_id": approval.approval_id}
    assert update_where(ToolApproval, where=where, values={"note": "found"}) == 1
    assert ToolApproval.objects.get(pk=approval.pk).note == "found"


def test_update_where_rolls_back_with_its_transaction(conversation):
    approval = make_approval(conversation)
    with pytest.raises(RuntimeError), transaction.atomic():
        update_where(ToolApproval, where={"pk": approval.pk}, values={"note": "gone"})
        raise RuntimeError
    assert ToolApproval.objects.get(pk=approval.pk).note == ""


def test_update_where_refuses_what_it_does_not_handle(conversation):
    approval = make_approval(conversation)
    refused = [
        ({"pk": approval.pk}, {"note": F("tool_name")}, TypeError),
        ({"decided_at": None}, {"note": "x"}, TypeError),
        ({"pk": approval.pk}, {"id": 5}, ValueError),
        ({"pk": approval.pk}, {}, ValueError),
        ({"pk": approval.pk}, {"no_such_field": 1}, Exception),
    ]
    for where, values_, error in refused:
        with pytest.raises(error):
            update_where(ToolApproval, where=where, values=values_)
    assert ToolApproval.objects.get(pk=approval.pk).note == ""


# --- create_row ---------------------------------------------------------------------------


def created_both_ways(model, **fields):
    """The same row created by the ORM and by create_row: (ours, theirs), as read back."""
    ours = create_row(model, **fields)
    theirs = model.objects.create(**fields)
    return ours, model.objects.get(pk=ours.pk), model.objects.get(pk=theirs.pk)


def test_create_row_writes_what_the_orms_create_writes(conversation, bob):
    # An auto id read back, defaults (a new approval id), JSON, a user, a float.
    arguments = {"code": "print('é')", "n": [1, 2.5, None]}
    made, ours, theirs = created_both_ways(
        ToolApproval,
        conversation=conversation,
        tool_name="python",
        arguments=arguments,
        arguments_sha256=arguments_hash(arguments),
        requested_by=bob,
        run_id="run-1",
        tool_hints=["reads"],
        tool_schema={"type": "object"},
        decision_seconds=0.5,
    )
    skip = {"id", "approval_id", "requested_at"}
    assert {k: v for k, v in values(ours).items() if k not in skip} == {
        k: v for k, v in values(theirs).items() if k not in skip
    }
    assert values(made) == values(ours), "the object is what the row holds"
    assert ours.approval_id and ours.approval_id != theirs.approval_id
    assert made._state.db == "default" and not made._state.adding
    assert made.conversation is conversation and made.requested_at.tzinfo is not None


def test_create_row_gives_back_the_generated_id_and_the_times(conversation):
    made, ours, theirs = created_both_ways(
        Message, conversation=conversation, role=Message.Role.TOOL, content="x", tool_calls=[]
    )
    assert isinstance(made.pk, int) and made.pk != theirs.pk
    assert made.created_at == ours.created_at and values(made) == values(ours)
    assert list(Message.objects.filter(conversation=conversation)) == [ours, theirs]
    made.content = "saved through the ORM as usual"
    made.save(update_fields=["content"])
    assert Message.objects.get(pk=made.pk).content == "saved through the ORM as usual"


def test_create_row_keeps_a_key_it_is_given_or_makes_one(conversation, alice):
    # Run: a UUID key with a default, nothing read back.
    done = Run.Status.DONE
    made = create_row(Run, conversation=conversation, started_by=alice, inbox="here", status=done)
    assert values(Run.objects.get(pk=made.pk)) == values(made)
    given = create_row(Run, id=made.pk.hex[::-1], conversation=conversation, status=done)
    assert Run.objects.filter(pk=given.pk).exists()


def test_create_row_sends_the_save_signals(conversation):
    seen = []

    def pre(sender, instance, **kwargs):
        seen.append(("pre", sender, instance.pk, kwargs["raw"]))

    def post(sender, instance, created, **kwargs):
        seen.append(("post", sender, instance.pk, created))

    pre_save.connect(pre, sender=Message)
    post_save.connect(post, sender=Message)
    try:
        made = create_row(Message, conversation=conversation, role=Message.Role.USER)
    finally:
        pre_save.disconnect(pre, sender=Message)
        post_save.disconnect(post, sender=Message)
    assert seen == [("pre", Message, None, False), ("post", Message, made.pk, True)]


def test_create_row_rolls_back_with_its_transaction(conversation):
    with pytest.raises(RuntimeError), transaction.atomic():
        create_row(Message, conversation=conversation, role=Message.Role.USER)
        raise RuntimeError
    assert not Message.objects.exists()


def test_create_row_fails_as_the_orm_fails(conversation):
    approval = make_approval(conversation)
    with pytest.raises(IntegrityError), transaction.atomic():
        create_row(ToolApproval, approval_id=approval.approval_id, conversation=conversation)
    with pytest.raises(ValueError, match="unsaved related object"):
        create_row(Message, conversation=Conversation(owner=conversation.owner))
    with pytest.raises(TypeError, match="plain values"):
        create_row(Message, conversation=conversation, content=F("role"))
    assert list(ToolApproval.objects.all()) == [approval] and not Message.objects.exists()

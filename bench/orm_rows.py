"""Benchmark: the rows a run and a decision write and read, ORM against studio.orm.

In one process on a fresh database (SQLite by default): each pair writes or
reads the same row both ways, in alternating rounds; prints the median cost
per call and the ratio. Inserts commit one by one, as a run's do.

    .venv/bin/python bench/orm_rows.py --calls 300 --rounds 5
    .venv/bin/python bench/orm_rows.py --database postgres://postgres@127.0.0.1:5432/studio_bench
"""

from __future__ import annotations

import argparse
import statistics
import time

import harness


def pairs(user, conversation) -> dict:
    """name -> (ORM, studio.orm): two calls that do the same thing."""
    from approvals.models import ToolApproval, arguments_hash
    from chat.models import Message
    from studio.orm import create_row, update_where

    arguments = {"text": "x"}
    approval = {
        "conversation": conversation,
        "tool_name": "echo",
        "arguments": arguments,
        "arguments_sha256": arguments_hash(arguments),
        "requested_by": user,
        "run_id": "bench",
    }
    message = {
        "conversation": conversation,
        "role": Message.Role.TOOL,
        "content": "x",
        "tool_call_id": "call_1",
        "tool_name": "echo",
        "tool_arguments": arguments,
    }
    row = ToolApproval.objects.create(**approval)
    note = {"note": "bench"}
    return {
        "insert a message": (
            lambda: Message.objects.create(**message),
            lambda: create_row(Message, **message),
        ),
        "insert an approval": (
            lambda: ToolApproval.objects.create(**approval),
            lambda: create_row(ToolApproval, **approval),
        ),
        "read an approval": (
            lambda: (
                ToolApproval.objects.select_related("conversation")
                .filter(approval_id=row.approval_id)
                .first()
            ),
            lambda: ToolApproval.objects.by_approval_id(row.approval_id),
        ),
        "update an approval": (
            lambda: ToolApproval.objects.filter(pk=row.pk).update(**note),
            lambda: update_where(ToolApproval, where={"pk": row.pk}, values=note),
        ),
    }


def per_call(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--database", default=f"sqlite:///{harness.ROOT / 'bench' / '.bench-orm.sqlite3'}"
    )
    args = parser.parse_args()
    harness.setup_django(args.database)
    user, _ = harness.make_member("orm")
    conversation = harness.make_conversation(user)
    print(f"{args.database.split(':')[0]}: {args.calls} calls x {args.rounds} rounds, medians")
    for name, (orm, ours) in pairs(user, conversation).items():
        # Compiled and cached before timing.
        per_call(orm, 20)
        per_call(ours, 20)
        times: dict = {orm: [], ours: []}
        for r in range(args.rounds):
            for fn in (orm, ours) if r % 2 == 0 else (ours, orm):
                times[fn].append(per_call(fn, args.calls))
        a, b = statistics.median(times[orm]), statistics.median(times[ours])
        print(f"  {name:<20} ORM {a * 1e6:6.0f} us   studio.orm {b * 1e6:6.0f} us   {b / a:.2f}x")


if __name__ == "__main__":
    main()

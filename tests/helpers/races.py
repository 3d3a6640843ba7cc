"""Decisions that land at the same moment, from threads of their own."""

from __future__ import annotations

import threading

from django.db import connections

from approvals.services.decisions import approval_decide

BOUND = 10.0


def decide_at_once(approval_id: str, user, decisions: dict[str, object]) -> dict[str, object]:
    """Each ``decision -> arguments`` on its own thread, released together by a barrier.

    Returns what each got: its ``DecideResult``, or the exception it raised.
    Every thread has ended when this returns (each wait is bounded).
    """
    kinds = list(decisions)
    results = run_together(
        [
            lambda kind=kind: approval_decide(
                approval_id=approval_id, user=user, decision=kind, arguments=decisions[kind]
            )
            for kind in kinds
        ]
    )
    return dict(zip(kinds, results, strict=True))


def run_together(fns: list) -> list:
    """Each function on its own thread, released together by a barrier; their results
    (or the exception each raised), in order. Every thread has ended when this returns."""
    barrier = threading.Barrier(len(fns), timeout=BOUND)
    results: list = [None] * len(fns)

    def call(index: int) -> None:
        barrier.wait()
        try:
            results[index] = fns[index]()
        except Exception as exc:
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(fns))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND)
    assert not any(thread.is_alive() for thread in threads), "a call never returned"
    return results

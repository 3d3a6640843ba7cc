"""How the chat page folds what edits and regenerates replaced."""

from __future__ import annotations

from chat.display import Fold


def test_a_later_fork_folds_around_the_earlier_ones_it_replaced():
    from datetime import datetime, timedelta

    from chat.display import Item, MessageView, _folded

    t0 = datetime(2026, 1, 1)
    t1, t2 = t0 + timedelta(minutes=1), t0 + timedelta(minutes=2)

    def item(n):
        return Item(message=MessageView(pk=n, role="user", content=str(n), created_at=t0))

    def shape(entries):
        return [shape(e.folded) if isinstance(e, Fold) else e.message.pk for e in entries]

    # 1 asked; 2 answered and was regenerated (t1) into 3; then 1 was edited
    # (t2) into 4: t2's fold holds 1, t1's fold, and 3.
    rows = [(None, item(0)), (t2, item(1)), (t1, item(2)), (t2, item(3)), (None, item(4))]
    assert shape(_folded(rows)) == [0, [1, [2], 3], 4]
    assert _folded(rows)[1].count == 3
    # Two forks at the same place sit side by side.
    rows = [(t1, item(1)), (t2, item(2)), (None, item(3))]
    assert shape(_folded(rows)) == [[1], [2], 3]

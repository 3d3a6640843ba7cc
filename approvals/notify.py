"""Names of the channel-layer groups approvals talk to."""

from __future__ import annotations

# Every socket of a member who holds "Can review approvals".
REVIEWERS_GROUP = "reviewers"


def member_group(user_id: int) -> str:
    """Every socket of one member (session checks; their approvals inbox)."""
    return f"member.{user_id}"

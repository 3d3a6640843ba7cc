"""Names of the channel-layer groups approvals talk to."""

from __future__ import annotations


def member_group(user_id: int) -> str:
    """Every socket of one member (session checks; their approvals inbox)."""
    return f"member.{user_id}"

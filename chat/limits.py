"""Limits on what members send, read by the consumer, the views and the templates."""

from __future__ import annotations

# One WebSocket frame, and one chat message.
MAX_FRAME = 64 * 1024
MAX_MESSAGE = 20_000

"""Ask your team's Studio before an agent's tool call runs (``/api/v1/``)."""

from studio_approvals.client import (
    AsyncClient,
    Client,
    Decision,
    Denied,
    StudioError,
    Undecided,
    approve,
    approve_async,
    verify_callback,
)
from studio_approvals.decorator import require_approval

__all__ = [
    "AsyncClient",
    "Client",
    "Decision",
    "Denied",
    "StudioError",
    "Undecided",
    "approve",
    "approve_async",
    "require_approval",
    "verify_callback",
]

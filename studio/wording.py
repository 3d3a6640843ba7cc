"""Words the model reads that more than one part of Studio must agree on.

Here, not in an app, because the gate (approvals) writes them and the
offline demo model (chat.llm, which imports no app) recognises them.
"""

from __future__ import annotations

# What the model is told when a person denies a call (user-facing words).
REJECTION_TEXT = "The user declined to run this tool call."

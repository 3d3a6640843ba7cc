"""Words the model reads that more than one part of Studio must agree on.

Here, not in an app, because the gate (approvals) writes them and the
offline demo model (chat.llm, which imports no app) recognises them.
"""

from __future__ import annotations

# What the model is told when a person denies a call (user-facing words).
REJECTION_TEXT = "The user declined to run this tool call."

# Put before the output of a call a person edited: for the model, which reads
# the call as it ran above it. The chat shows the edit on the card instead.
EDITED_TEXT = (
    "(The user edited the arguments of this call before it ran; the call above shows what ran.)"
)

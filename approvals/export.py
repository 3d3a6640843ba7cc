"""Approval rows as JSON lines: every field, so an export or archive round-trips."""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from django.db import models

from approvals.models import ToolApproval

FIELDS = ToolApproval._meta.concrete_fields


def row_record(row: models.Model) -> dict:
    """Every stored field of a row by its column name (foreign keys as ids,
    times as ISO 8601, UUIDs as text): what JSON can hold of it."""
    record = {}
    for field in row._meta.concrete_fields:
        value = field.value_from_object(row)
        if isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, uuid.UUID):
            value = str(value)
        record[field.attname] = value
    return record


def approval_record(approval: ToolApproval) -> dict:
    return row_record(approval)


def approval_from_record(record: dict) -> ToolApproval:
    """The row a record was made from (unsaved)."""
    values = {}
    for field in FIELDS:
        value = record.get(field.attname)
        if value is not None and isinstance(field, models.DateTimeField):
            value = datetime.fromisoformat(value)
        values[field.attname] = value
    return ToolApproval(**values)


def jsonl_line(approval: ToolApproval) -> str:
    return json.dumps(approval_record(approval), ensure_ascii=False, separators=(",", ":")) + "\n"


def archive_write(path: Path, approvals: Iterable[ToolApproval]) -> int:
    """Append ``approvals`` to the JSON-lines file at ``path``, all or nothing.

    The old content and the new lines go to a temporary file beside it,
    which is flushed to disk and then renamed over ``path``: a failure at
    any point leaves ``path`` as it was (and raises). Returns the count.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    count = 0
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            if path.exists():
                with path.open(encoding="utf-8") as old:
                    for line in old:
                        out.write(line)
            for approval in approvals:
                out.write(jsonl_line(approval))
                count += 1
            out.flush()
            os.fsync(out.fileno())
        if path.exists():
            os.chmod(temporary, path.stat().st_mode & 0o777)
        else:
            os.chmod(temporary, 0o600)  # audit data: not for every local user
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)
    return count

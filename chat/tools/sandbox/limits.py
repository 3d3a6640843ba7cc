"""What one call may use: memory, tmp, file size, quota, processes, files."""

from __future__ import annotations

from dataclasses import dataclass

MB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 512 * MB
    tmp_bytes: int = 64 * MB
    file_bytes: int = 16 * MB
    workspace_bytes: int = 256 * MB
    processes: int = 64
    open_files: int = 256


def default_limits() -> Limits:
    from django.conf import settings

    return Limits(
        memory_bytes=settings.STUDIO_TOOL_MEMORY_MB * MB,
        tmp_bytes=settings.STUDIO_TOOL_TMP_MB * MB,
        workspace_bytes=settings.STUDIO_WORKSPACE_QUOTA_MB * MB,
    )

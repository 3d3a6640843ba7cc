"""How rules' patterns match a subject: shell-style globs."""

from __future__ import annotations

import pytest

from approvals.patterns import glob_escape, glob_match


@pytest.mark.parametrize(
    ("subject", "pattern", "matches"),
    [
        ("git status -s", "git status*", True),
        ("git push", "git status*", False),
        ("ls", "ls *", True),  # " *" also matches nothing after the words
        ("ls -la", "ls *", True),
        ("lsblk", "ls *", False),
        ("https://docs.python.org/3/", "https://docs.python.org/*", True),
        ("https://docs.python.org.evil.example/", "https://docs.python.org/*", False),
        ("rm *", glob_escape("rm *"), True),
        ("rm x", glob_escape("rm *"), False),  # an escaped star is a star
        ("Git status", "git status*", False),  # case matters
    ],
)
def test_glob_match(subject, pattern, matches):
    assert glob_match(subject, pattern) is matches

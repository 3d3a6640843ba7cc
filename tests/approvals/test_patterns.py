"""How rules read a command line: its simple commands, or None when it cannot be read."""

from __future__ import annotations

import pytest

from approvals.patterns import glob_escape, glob_match
from studio.shell import command_parts


@pytest.mark.parametrize(
    ("line", "parts"),
    [
        ("ls -la", ("ls -la",)),
        ("ls  -la\t", ("ls -la",)),
        ("ls; rm -rf x", ("ls", "rm -rf x")),
        ("ls && rm x || id", ("ls", "rm x", "id")),
        ("ls | grep a &", ("ls", "grep a")),
        ("ls\nrm x\n\n", ("ls", "rm x")),
        ("echo 'a; b' c", ("echo a; b c",)),  # a quoted ";" is part of a word
        # A quoted operator standing alone reads as an operator: more parts, never fewer.
        ("echo '&&' c", ("echo", "c")),
        ("ls a#;rm x", ("ls a#", "rm x")),  # "#" mid-word is no comment to bash
        ("ls # ; rm x", ("ls #", "rm x")),  # read as words: a rule must allow both
        ("echo $(rm x)", None),
        ("echo `rm x`", None),
        ("diff <(ls a) <(ls b)", None),
        ("echo x > f", None),
        ("ls 2>&1", None),
        ("(cd x; rm y)", None),
        ("cat <<EOF\nx\nEOF", None),
        ("echo 'unbalanced", None),
    ],
)
def test_command_parts(line, parts):
    assert command_parts(line) == parts


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

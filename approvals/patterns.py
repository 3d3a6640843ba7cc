"""How rules' patterns read a call: shell-style globs.

A pattern is matched against the whole of a call's subject (a command line,
a URL, code, or arguments as canonical JSON). A pattern ending in `` *``
also matches the subject without that tail: ``ls *`` matches ``ls`` and
``ls -la``, not ``lsblk``.

A command line is a list of simple commands (``studio.shell.command_parts``)
joined by ``;``, ``&&``, ``||``, ``|``, ``&`` or newlines. An Allow rule with
a pattern must match each of them (so ``ls *`` does not allow ``ls; rm -rf x``), and a line whose
parts cannot be read this way (command substitution, redirection, a
subshell) is never allowed by a pattern; Deny and Ask match the whole line
or any part.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

_GLOB_CHARS = re.compile(r"([*?\[])")


def glob_escape(text: str) -> str:
    """``text`` as a glob that matches exactly it."""
    return _GLOB_CHARS.sub(r"[\1]", text)


def glob_match(subject: str, pattern: str) -> bool:
    if fnmatchcase(subject, pattern):
        return True
    return pattern.endswith(" *") and fnmatchcase(subject, pattern[:-2])

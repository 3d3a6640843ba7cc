"""How a shell command line reads: the simple commands it runs.

Rules (``approvals.patterns``) match each of them; the terminal tool
declares this as how its subject splits.
"""

from __future__ import annotations

import shlex

_SEPARATORS = {";", "&&", "||", "|", "&", "|&", ";;", "\n"}
_NOT_READABLE = ("`", "$(", "<(", ">(")


def command_parts(command: str) -> tuple[str, ...] | None:
    """The simple commands of a shell line (words unquoted, joined by one space).

    None when the line holds what a pattern cannot vouch for: command or
    process substitution, a redirection, a subshell or group, or quoting
    the shell would reject.
    """
    if any(mark in command for mark in _NOT_READABLE):
        return None
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|<>()\n")
    lexer.whitespace = " \t\r"  # a newline separates commands
    lexer.commenters = ""  # "#" is only a comment at a word's start: keep it
    lexer.whitespace_split = True
    parts: list[str] = []
    words: list[str] = []
    try:
        for token in lexer:
            if token and set(token) <= set(";&|<>()\n"):
                if token.strip("\n") == "" or token in _SEPARATORS:
                    if words:
                        parts.append(" ".join(words))
                    words = []
                    continue
                return None  # a redirection, subshell or an operator we do not read
            words.append(token)
    except ValueError:
        return None  # unbalanced quotes
    if words:
        parts.append(" ".join(words))
    return tuple(parts)

"""How rules read a tool call's subject, and a bash command line as bash reads it.

A command line is parsed with tree-sitter's bash grammar, never split by
hand. ``read_command_line`` says two things about it:

* ``plain``: the simple commands it runs, each as its words joined by a
  space, when Studio understood the whole line: only simple commands made
  of literal words (bare words, single-quoted strings, double-quoted strings
  without expansions) joined by ``;``, ``&&``, ``||``, ``|``, ``&`` or
  newlines, each named by an allowed name (below). Only then may an Allow
  rule's pattern vouch for it. Anything else is None, with ``why`` saying
  what Studio could not vouch for.
* ``seen``: every simple command the parser found anywhere in the line,
  nested ones included (substitutions, subshells, ``bash -c '…'`` and
  ``eval`` strings, what a command runner such as ``sudo`` or ``xargs``
  starts, and what a builtin's words could run), for Deny, Review and Ask
  rules to look at.

The names a plain command may have are an allow-list, not a list of
exceptions: an external program found on the tools' ``PATH`` (and not a
bash builtin or keyword of that name), or one of ``QUIET_BUILTINS``. Bash
builtins evaluate their words in ways no reading of the line shows
(``printf -v 'a[$(id)]'`` runs ``id``; ``jobs -x``, ``compgen -C`` and
``fc -s`` run commands they are given), so every other builtin makes a
line not plain. ``tests/chat/test_shell_differential.py`` holds the reader
to what bash really runs, builtins included.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache, lru_cache

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from studio.text import canonical_json


@dataclass(frozen=True)
class Reading:
    """What rules read of one call's subject.

    ``plain``: the parts an Allow pattern must each match, or None when the
    subject holds something no pattern can vouch for (``why`` says what).
    ``seen``: every piece Deny, Review and Ask rules look at, the whole
    subject first. ``argvs``: a command line's commands as bash's argv.
    """

    plain: tuple[str, ...] | None
    seen: tuple[str, ...]
    why: str = ""
    argvs: tuple[tuple[str, ...], ...] | None = None

    @classmethod
    def whole(cls, subject: str) -> Reading:
        """A subject that is one part (a URL, code, JSON arguments)."""
        return cls(plain=(subject,), seen=(subject,))


# Commands that run other commands, or change how the next ones are found:
# a pattern over their words cannot say what will really run.
RUNNERS = frozenset(
    """
    . alias bash builtin busybox caller chroot chrt command coproc csh dash doas
    enable env eval exec fish flock hash ionice ksh ltrace mksh nice nohup nsenter
    parallel prlimit runuser script set setpriv setsid sh shopt source stdbuf
    strace su sudo taskset tcsh time timeout trap unshare watch xargs zsh
    """.split()
)
SHELLS = frozenset("ash bash busybox dash ksh mksh sh zsh".split())
# The PATH of a tool call (``chat.tools.sandbox``): a plain command's name is
# looked up here, as bash in the sandbox looks it up. Its folders are the
# host's read-only ones, never a workspace.
PROGRAM_PATH = "/usr/local/bin:/usr/bin:/bin"
# The bash builtins a plain line may run, because each takes its words as
# data and evaluates, assigns, runs and looks up nothing: ``echo`` prints them
# (its only options change escapes and the newline), ``true``, ``false`` and
# ``:`` ignore them, ``pwd`` prints the working folder (``-L``/``-P``).
QUIET_BUILTINS = frozenset(("echo", "true", "false", "pwd", ":"))
# Programs whose options, arguments or files can make them run other programs
# (``git`` runs ``core.fsmonitor``, ``find -delete``, ``sort
# --compress-program``, ``sed 'e'``, interpreters run code): a card never
# offers "commands starting with PROG" for them, only the exact line or the
# whole tool.
PROGRAM_RUNNERS = frozenset(
    """
    awk bash busybox dash emacs env ex find gawk gdb git gzip ksh less lua make
    man mawk more nawk node npm npx perl php pip pip3 python python3 rsync ruby
    scp sed sh sort ssh tar vi view vim xargs zip zsh
    """.split()
)
# ``find`` runs a command of its own with these.
FIND_RUNS = frozenset(("-exec", "-execdir", "-ok", "-okdir"))
# Nested command strings (``bash -c '…'``) are read this many levels deep.
MAX_DEPTH = 3
# A command that may run its words: this many of its tails, this long each,
# are what Deny rules see of it (and its whole text, always).
MAX_TAILS = 1024
MAX_TAIL_WORDS = 256

# Node types whose text is a literal word once quoting is taken off.
_LITERAL_PARTS = frozenset(("word", "number", "raw_string", "string"))
_SEPARATORS = frozenset((";", "&", "&&", "||", "|"))
# Bytes bash and the grammar might not agree on; a line holding one is not plain.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# Spaces bash does not split on but a reader's eye does (``ls -la\u3000#``).
_ODD_SPACE = re.compile(r"[^\S \t\n]")
# In a bare word: expansions, brace expansion and tilde expansion (also after
# "=" and ":") change the word.
_BARE_SPECIAL = re.compile(r"[$`{}~]")
# In a command name, also globbing (``/bin/r?``) and anything but printable ASCII.
_NAME_SPECIAL = re.compile(r"[*?\[\]]|[^\x21-\x7e]")
# Inside double quotes bash removes a backslash only before these.
_DQ_ESCAPE = re.compile(r"\\([$`\"\\])")
_BARE_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


@cache
def _parser() -> Parser:
    return Parser(Language(tree_sitter_bash.language()))


class _NotPlain(Exception):
    """The line holds something no pattern can vouch for (the message says what)."""


# The run's plan, the decision's second look and the card all read the same
# line: read once (a few lines at a time, however long they are).
@lru_cache(maxsize=32)
def read_command_line(line: str, *, depth: int = 0) -> Reading:
    """Read ``line`` as bash does: its plain commands, or why not, and all it runs."""
    source = line.encode("utf-8", "surrogatepass")
    tree = _parser().parse(source)
    seen: list[str] = [line]
    for command in _descendants(tree.root_node, "command", *_OTHER_COMMANDS):
        seen.extend(_seen_in(command, source, depth))
    if depth < MAX_DEPTH:
        # A variable's value is code where arithmetic reads it (``y='a[$(id)]';
        # let x=y``): read it as a line too.
        for assignment in _descendants(tree.root_node, "variable_assignment"):
            for value in assignment.children[2:]:
                seen.extend(read_command_line(_best_effort(value, source), depth=depth + 1).seen)
    if depth < MAX_DEPTH:
        # What bash makes of the line before the grammar sees it, roughly: lines
        # joined at a backslash-newline, braces expanded into words. More pieces
        # for Deny to look at, never fewer; such a line is not plain anyway.
        for variant in (line.replace("\\\n", ""), re.sub(r"[{},]", " ", line)):
            if variant != line:
                seen.extend(read_command_line(variant, depth=MAX_DEPTH).seen)
    try:
        argvs = _plain(tree.root_node, line, source)
    except _NotPlain as exc:
        return Reading(plain=None, seen=_unique(seen), why=str(exc))
    return Reading(
        plain=tuple(" ".join(argv) for argv in argvs),
        seen=_unique(seen),
        argvs=tuple(argvs),
    )


def _unique(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


# --- structured calls ---------------------------------------------------------------------

# How deep and how many argument pieces a structured call is read into.
MAX_ARGUMENT_DEPTH = 4
MAX_ARGUMENT_PIECES = 500


def read_arguments(arguments: dict, schema: dict | None) -> tuple[str, Reading]:
    """A structured call (an MCP tool's): the subject rules match, and how they read it.

    The subject is the arguments' canonical JSON (sorted keys, no spaces).
    Deny, Review and Ask also see each argument as a call of its own
    (``{"cmd":"rm -rf /"}``, nested objects along their path), so a pattern
    naming one argument matches however many others sort before it. A
    pattern vouches (``plain``) only for a call whose every argument the
    tool's schema declares: an undeclared one may be what a rule is about.
    """
    subject = canonical_json(arguments)
    pieces = [subject]
    stack = [((), arguments)]
    while stack and len(pieces) < MAX_ARGUMENT_PIECES:
        path, value = stack.pop()
        for key in sorted(value):
            item = value[key]
            nested = {key: item}
            for outer in reversed(path):
                nested = {outer: nested}
            pieces.append(canonical_json(nested))
            if isinstance(item, dict) and len(path) + 1 < MAX_ARGUMENT_DEPTH:
                stack.append(((*path, key), item))
    declared = (schema or {}).get("properties") or {}
    extra = sorted(k for k in arguments if k not in declared)
    seen = _unique(pieces)
    if extra:
        names = ", ".join(repr(k) for k in extra[:5])
        why = f"it has arguments the tool does not declare ({names})"
        return subject, Reading(plain=None, seen=seen, why=why)
    return subject, Reading(plain=(subject,), seen=seen)


# --- plain lines ------------------------------------------------------------------------


def _plain(root: Node, line: str, source: bytes) -> list[tuple[str, ...]]:
    """The argv of each simple command of a plain line; raises ``_NotPlain``."""
    if root.has_error:
        raise _NotPlain("bash would not read it the way Studio does (a syntax error)")
    if _CONTROL.search(line):
        raise _NotPlain("it holds control characters")
    if _ODD_SPACE.search(line):
        raise _NotPlain("it holds a space character other than a plain space or tab")
    if "\\\n" in line:
        raise _NotPlain("a backslash continues a line")
    _gaps(root, source, allowed=b" \t\n")
    argvs: list[tuple[str, ...]] = []
    for child in root.children:
        if child.type == "comment":
            before = source[: child.start_byte].rsplit(b"\n", 1)[-1]
            if before.strip(b" \t"):
                raise _NotPlain("a # starts a comment after a command")
        elif child.type not in _SEPARATORS:
            argvs.extend(_statement(child, source))
    return argvs


def _statement(statement: Node, source: bytes) -> list[tuple[str, ...]]:
    """The argv of each simple command of one statement, in order; raises ``_NotPlain``.

    A loop, not recursion: ``a && a && …`` nests a list per operator, and a
    model may send thousands.
    """
    argvs: list[tuple[str, ...]] = []
    stack = [statement]
    while stack:
        node = stack.pop()
        if node.type == "command":
            argvs.append(_command(node, source))
            continue
        if node.type == "list":
            joints = ("&&", "||")
        elif node.type == "pipeline":
            joints = ("|",)
        else:
            raise _NotPlain(_describe(node))
        _gaps(node, source, allowed=b" \t\n")
        parts = []
        for child in node.children:
            if child.type in joints:
                continue
            if child.type in ("&&", "||", "|", "|&"):
                raise _NotPlain(f"it joins commands with {child.type}")
            parts.append(child)
        stack.extend(reversed(parts))
    return argvs


def _command(node: Node, source: bytes) -> tuple[str, ...]:
    _gaps(node, source, allowed=b" \t")
    words: list[str] = []
    for child in node.children:
        if child.type == "command_name":
            if len(child.children) != 1:
                raise _NotPlain("its command name is not a plain word")
            name = _literal(child.children[0], source)
            if not name or _NAME_SPECIAL.search(name):
                raise _NotPlain(f"the command name {name!r} is not a plain name")
            words.append(name)
        elif not words:
            raise _NotPlain(_describe(child))
        else:
            words.append(_literal(child, source))
    if not words:
        raise _NotPlain("a command has no name")
    if _runs_others(words):
        raise _NotPlain(f"{_program(words)} runs other commands")
    _vouchable_name(words[0])
    return tuple(words)


def _vouchable_name(name: str) -> None:
    """A name a pattern may vouch for (see the module's docstring); raises ``_NotPlain``."""
    if name in QUIET_BUILTINS:
        return
    names = shell_names()
    if names is None:
        raise _NotPlain("Studio could not ask bash which names are its builtins")
    if name in names:
        raise _NotPlain(f"{name} is a bash builtin or keyword, which can run what its words say")
    if "/" in name:
        if not os.path.isabs(name) or os.path.dirname(name) not in PROGRAM_PATH.split(":"):
            raise _NotPlain(f"{name} is a file earlier calls may have written, not a program")
        if not _program_file(name):
            raise _NotPlain(f"{name} is not a program on this server")
    elif _program_file(shutil.which(name, path=PROGRAM_PATH) or "") is None:
        raise _NotPlain(f"{name} is not a program on this server")


def _program_file(path: str) -> str | None:
    """``path`` when it is a regular, executable file (links followed), else None."""
    return path if path and os.path.isfile(path) and os.access(path, os.X_OK) else None


@cache
def shell_names() -> frozenset[str] | None:
    """bash's builtins and keywords, as the bash of the tools lists them.

    None when bash cannot say: then no line is plain.
    """
    try:
        listed = subprocess.run(
            ["/bin/bash", "--norc", "--noprofile", "-c", "compgen -b; compgen -k"],
            capture_output=True,
            text=True,
            timeout=10,
            env={"PATH": PROGRAM_PATH},
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return frozenset(listed.stdout.split())


def _program(words: list[str]) -> str:
    """The command's program, by its name whatever the path: ``/usr/bin/env`` is env."""
    return words[0].rsplit("/", 1)[-1]


def _runs_others(words: list[str]) -> bool:
    """The command starts commands of its own (sudo, xargs, find -exec, …)."""
    program = _program(words)
    return program in RUNNERS or (program == "find" and bool(FIND_RUNS.intersection(words)))


def _may_run_its_words(words: list[str]) -> bool:
    """Anything but a plain program or a quiet builtin may run what its words say.

    ``jobs -x CMD``, ``compgen -C CMD``, ``let 'a[$(CMD)]'`` ...: an allow-list
    again, so a builtin nobody thought of counts too.
    """
    if _runs_others(words):
        return True
    try:
        _vouchable_name(words[0])
    except _NotPlain:
        return True
    return False


def program_runs_others(line: str) -> str | None:
    """The program of a one-command plain line when it can run other programs
    (``PROGRAM_RUNNERS``), else None: no card offers a prefix of its words."""
    argvs = read_command_line(line).argvs or ()
    if len(argvs) == 1 and _program(list(argvs[0])) in PROGRAM_RUNNERS:
        return _program(list(argvs[0]))
    return None


def _literal(node: Node, source: bytes) -> str:
    """The word bash makes of ``node``, if it is a plain literal; raises ``_NotPlain``."""
    text = node.text.decode("utf-8", "surrogatepass")
    if node.type in ("word", "number"):
        if _BARE_SPECIAL.search(text):
            raise _NotPlain(f"the word {text!r} is expanded by bash")
        return _BARE_ESCAPE.sub(r"\1", text.replace("\\\n", ""))
    if node.type == "raw_string":
        return text[1:-1]
    if node.type == "string":
        inner = node.children[1:-1]
        if any(c.type != "string_content" for c in inner):
            raise _NotPlain(f"the string {text} is expanded by bash")
        content = text[1:-1]
        if re.search(r"(?<!\\)(?:\\\\)*[$`]", content):
            raise _NotPlain(f"the string {text} is expanded by bash")
        return _DQ_ESCAPE.sub(r"\1", content.replace("\\\n", ""))
    if node.type == "concatenation":
        _gaps(node, source, allowed=b"")
        parts = node.children
        if any(p.type not in _LITERAL_PARTS for p in parts):
            raise _NotPlain(f"the word {text!r} is expanded by bash")
        # Brace expansion spans the parts: a "{" in one and "}" in another.
        return "".join(_literal(p, source) for p in parts)
    raise _NotPlain(_describe(node))


def _gaps(node: Node, source: bytes, *, allowed: bytes) -> None:
    """Between ``node``'s children only these bytes: nothing the grammar skipped over."""
    at = node.start_byte
    for child in node.children:
        gap = source[at : child.start_byte]
        if gap.strip(allowed) if allowed else gap:
            raise _NotPlain("it holds text the parser passed over")
        at = child.end_byte
    if node.type == "program":
        if source[at:].strip(allowed):
            raise _NotPlain("it holds text the parser passed over")


_DESCRIPTIONS = {
    "command_substitution": "command substitution",
    "process_substitution": "process substitution",
    "ansi_c_string": "a $'…' string",
    "translated_string": 'a $"…" string',
    "simple_expansion": "a variable",
    "expansion": "a variable",
    "arithmetic_expansion": "arithmetic expansion",
    "redirected_statement": "a redirection or here-document",
    "file_redirect": "a redirection",
    "heredoc_redirect": "a here-document",
    "herestring_redirect": "a here-string",
    "subshell": "a subshell",
    "compound_statement": "a group of commands",
    "function_definition": "a function definition",
    "variable_assignment": "a variable assignment",
    "declaration_command": "a declaration",
    "negated_command": "a negated command",
}


def _describe(node: Node) -> str:
    what = _DESCRIPTIONS.get(node.type)
    if what is None:
        what = node.type.replace("_", " ")
        if node.type.endswith("_statement"):
            what = f"a shell {node.type.removesuffix('_statement')} statement"
    return f"it uses {what}"


# --- everything the line runs ----------------------------------------------------------------


def _descendants(node: Node, *kinds: str):
    stack = [node]
    while stack:
        current = stack.pop()
        if current.type in kinds:
            yield current
        stack.extend(reversed(current.children))


# Commands the grammar gives shapes of their own: ``[ … ]`` and ``[[ … ]]``,
# ``declare``/``export``/``local``/``readonly``/``typeset``, ``unset``.
_OTHER_COMMANDS = ("test_command", "declaration_command", "unset_command")
# Where a word of such a command ends: its value is taken whole.
_WORD_NODES = frozenset(
    (
        *_LITERAL_PARTS,
        "concatenation",
        "ansi_c_string",
        "translated_string",
        "simple_expansion",
        "expansion",
        "command_substitution",
        "process_substitution",
        "arithmetic_expansion",
        "variable_name",
        "test_operator",
    )
)


def _words(command: Node, source: bytes) -> list[str]:
    """A command's words as bash would pass them, as near as Studio can tell."""
    if command.type in _OTHER_COMMANDS:
        words: list[str] = []
        stack = list(reversed(command.children))
        while stack:
            node = stack.pop()
            if node.type in _WORD_NODES:
                words.append(_best_effort(node, source))
            elif node.children:
                stack.extend(reversed(node.children))
            elif node.text:
                words.append(node.text.decode("utf-8", "surrogatepass"))
        return words
    words = []
    for child in command.children:
        if child.type == "variable_assignment" or child.type.endswith("redirect"):
            continue
        if child.type == "command_name" and child.children:
            child = child.children[0]
        words.append(_best_effort(child, source))
    return words


def _seen_in(command: Node, source: bytes, depth: int) -> list[str]:
    """One simple command as Deny rules see it, and what it runs in turn."""
    words = _words(command, source)
    pieces = [command.text.decode("utf-8", "surrogatepass")]
    if not words:
        return pieces
    pieces.append(" ".join(words))
    program = _program(words)
    if _may_run_its_words(words):
        # What it starts is somewhere in its tail: every tail is a command,
        # and every word (a subscript bash evaluates, a callback) a line.
        # Bounded, so thousands of words cost linear time, not quadratic:
        # such a line is not plain, so a person decides where a guard exists.
        pieces.extend(
            " ".join(words[i : i + MAX_TAIL_WORDS]) for i in range(1, min(len(words), MAX_TAILS))
        )
        if depth < MAX_DEPTH:
            for word in words[1:]:
                pieces.extend(read_command_line(word, depth=depth + 1).seen)
    if depth < MAX_DEPTH:
        nested = None
        if program in SHELLS:
            nested = next(
                (words[i + 1] for i, w in enumerate(words[:-1]) if re.fullmatch(r"-\w*c\w*", w)),
                None,
            )
        elif program == "eval":
            nested = " ".join(words[1:])
        if nested:
            pieces.extend(read_command_line(nested, depth=depth + 1).seen)
    return pieces


def _best_effort(node: Node, source: bytes) -> str:
    """The word's value where Studio can tell it, else its text as written."""
    if node.type == "concatenation":
        parts = node.children
        return "".join(
            "" if p.type == "$" and i + 1 < len(parts) and parts[i + 1].type == "string"
            else _best_effort(p, source)
            for i, p in enumerate(parts)
        )  # fmt: skip
    if node.type == "ansi_c_string":
        return _ansi_c(node.text.decode("utf-8", "surrogatepass")[2:-1])
    if node.type == "translated_string" and node.children:
        return _best_effort(node.children[-1], source)  # $"…": the string, untranslated
    try:
        return _literal(node, source)
    except _NotPlain:
        return node.text.decode("utf-8", "surrogatepass")


def _ansi_c(body: str) -> str:
    """A $'…' string's value, as near as Python's own escapes come to bash's."""
    try:
        return body.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:
        return body

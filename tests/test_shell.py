"""How rules read a command line: bash's grammar, plain commands only, everything it runs."""

from __future__ import annotations

import pytest

from studio.shell import Reading, program_runs_others, read_command_line, shell_names


@pytest.mark.parametrize(
    ("line", "plain"),
    [
        ("ls -la", ("ls -la",)),
        ("ls  -la\t", ("ls -la",)),
        ("ls; rm -rf x", ("ls", "rm -rf x")),
        ("ls && rm x || id", ("ls", "rm x", "id")),
        ("ls | grep a &", ("ls", "grep a")),
        ("ls\nrm x\n\n", ("ls", "rm x")),
        ("echo 'a; b' c", ("echo a; b c",)),  # a quoted ";" is part of a word
        ("echo '&&' c", ("echo && c",)),
        ("ls a#;rm x", ("ls a#", "rm x")),  # "#" mid-word is no comment to bash
        ("# list them\nls", ("ls",)),  # a comment on a line of its own
        ("r\\m -rf x", ("rm -rf x",)),  # bash removes the backslash
        ("ls 'a'\"b\"c", ("ls abc",)),
        ('echo "a\\$b"', ("echo a$b",)),
        ('"ls" -la', ("ls -la",)),
        ("ls *.py", ("ls *.py",)),
    ],
)
def test_a_plain_line_reads_as_its_commands(line, plain):
    reading = read_command_line(line)
    assert (reading.plain, reading.why) == (plain, "")


@pytest.mark.parametrize(
    ("line", "why"),
    [
        # The attack of issue 34: shlex read one ls, bash runs three commands.
        ("ls $'\\'' ; id > PWNED.txt ; #'", "$'…' string"),
        ('echo $"hi"', "$"),
        ("echo $(rm x)", "command substitution"),
        ("echo `rm x`", "command substitution"),
        ("diff <(ls a) <(ls b)", "process substitution"),
        ("echo $HOME", "variable"),
        ("$CMD x", "variable"),
        ("echo x > f", "redirection"),
        ("ls 2>&1", "redirection"),
        ("cat <<EOF\nx\nEOF", "here-document"),
        ("(cd x; rm y)", "subshell"),
        ("{ ls; }", "group"),
        ("f() { rm x; }; f", "function definition"),
        ("FOO=1 ls", "variable assignment"),
        ("PATH=. ls", "variable assignment"),
        ("eval ls", "eval runs"),
        ("exec ls", "exec runs"),
        ("source x.sh", "source runs"),
        (". x.sh", ". runs"),
        ("bash -c 'ls'", "bash runs"),
        ("sh -c ls", "sh runs"),
        ("env ls", "env runs"),
        ("/usr/bin/env rm x", "env runs"),
        ("xargs rm", "xargs runs"),
        ("find . -exec rm x +", "find runs"),
        ("nohup ls", "nohup runs"),
        ("timeout 5 ls", "timeout runs"),
        ("sudo ls", "sudo runs"),
        ("command rm x", "command runs"),
        ("ls\\\n-la", "backslash continues"),
        ("ls # ; rm x", "comment after a command"),
        ("lś -la", "not a plain name"),
        ("/bin/r? x", "not a plain name"),
        ("echo 'unbalanced", "syntax error"),
        ("ls;;", ";;"),
        ("ls |& cat", "|&"),
        ("ls\r\nid", "control characters"),
        ("ls\x0b-la", "control characters"),
        ("{rm,-rf,x}", "syntax error"),
        ("echo {a,b}", "expanded"),
        ("echo ~", "expanded"),
        ("if true; then ls; fi", "if statement"),
        ("! ls", "negated"),
        ("ls $'x'", "$'…' string"),
        # Issue 52: only programs and the quiet builtins.
        ("printf '%s\\n' hi", "printf is a bash builtin"),
        ("test -n x", "test is a bash builtin"),
        ("[ -n x ]", "test command"),
        ("read x", "read is a bash builtin"),
        ("jobs -x ls", "jobs is a bash builtin"),
        ("cd /tmp", "cd is a bash builtin"),
        ("kill 1", "kill is a bash builtin"),
        ("ls; let x=1", "let is a bash builtin"),
        ("./x -la", "a file earlier calls may have written"),
        ("../bin/ls", "a file earlier calls may have written"),
        ("/tmp/ls", "a file earlier calls may have written"),
        ("studio-no-such-program x", "not a program on this server"),
        ("ls -la\u3000#", "a space character"),
        ("ls\u00a0-la", "a space character"),
    ],
)
def test_anything_else_is_not_plain(line, why):
    reading = read_command_line(line)
    assert reading.plain is None
    assert why in reading.why


@pytest.mark.parametrize(
    ("line", "seen"),
    [
        ("echo $'\\'' ; rm -f x ; #'", "rm -f x"),
        ("echo $(rm -rf /)", "rm -rf /"),
        ('echo "$(echo `rm -rf a`)"', "rm -rf a"),
        ("(cd x && rm y)", "rm y"),
        ("bash -c 'rm -rf x'", "rm -rf x"),
        ('sh -ec "rm -rf x"', "rm -rf x"),
        ("bash -c \"bash -c 'rm z'\"", "rm z"),
        ("eval 'rm x'", "rm x"),
        ("sudo rm -rf /", "rm -rf /"),
        ("timeout 5 rm x", "rm x"),
        ("find . -exec rm {} +", "rm {} +"),
        ("xargs rm < list", "rm"),
        ("r\\m -rf x", "rm -rf x"),
        ("FOO=1 rm x 2>/dev/null", "rm x"),
        ("if true; then rm x; fi", "rm x"),
        ("f() { rm x; }; f", "rm x"),
        ("jobs -x rm x", "rm x"),
        ("compgen -C 'rm x' y", "rm x"),
        ("mapfile -C 'rm x' -c 1 < f", "rm x"),
        ("printf -v 'a[$(rm x)]' %s y", "rm x"),
        ("declare 'a[$(rm x)]'=1", "rm x"),
        ("[[ -v 'a[$(rm x)]' ]]", "rm x"),
        ("unset 'a[`rm x`]'", "rm x"),
        ("y='a[$(rm x)]'; let z=y", "rm x"),
    ],
)
def test_deny_rules_see_nested_commands(line, seen):
    assert seen in read_command_line(line).seen


def test_a_whole_subject_is_one_part():
    assert Reading.whole("https://x/") == Reading(plain=("https://x/",), seen=("https://x/",))


def test_thousands_of_joined_commands_are_read_not_a_crash():
    """``a && a && …`` nests one list per operator: a model may send thousands."""
    reading = read_command_line("ls && " * 20_000 + "rm -rf x")
    assert len(reading.plain) == 20_001 and "rm -rf x" in reading.seen
    deep = read_command_line("echo " + "$(" * 2_000 + "rm x" + ")" * 2_000)
    assert deep.plain is None and "rm x" in deep.seen


@pytest.mark.parametrize(
    ("line", "plain"),
    [
        ("echo hi", ("echo hi",)),
        ("true x", ("true x",)),
        ("false", ("false",)),
        ("pwd -P", ("pwd -P",)),
        (": 'a[$(id)]'", (": a[$(id)]",)),
        ("ls -la", ("ls -la",)),
        ("/bin/ls -la", ("/bin/ls -la",)),
        ("/usr/bin/printf -v x", ("/usr/bin/printf -v x",)),  # coreutils: no -v
    ],
)
def test_programs_and_quiet_builtins_are_plain(line, plain):
    assert read_command_line(line).plain == plain


def test_the_names_bash_lists_are_its_builtins_and_keywords():
    names = shell_names()
    assert {"printf", "let", "jobs", "compgen", "fc", "echo", "if", "[[", "time"} <= names
    assert "ls" not in names and "git" not in names


@pytest.mark.parametrize(
    ("line", "program"),
    [("git status", "git"), ("find . -delete", "find"), ("/usr/bin/sort x", "sort"),
     ("python3 -c 1", "python3"), ("ls -la", None), ("git status; ls", None)],
)  # fmt: skip
def test_programs_that_run_others_are_named_for_the_card(line, program):
    assert program_runs_others(line) == program


def test_a_structured_call_is_read_argument_by_argument():
    from studio.shell import read_arguments

    schema = {"type": "object", "properties": {"cmd": {}, "opts": {}}}
    subject, reading = read_arguments({"opts": {"z": 1, "env": {"A": "b"}}, "cmd": "rm x"}, schema)
    assert subject == '{"cmd":"rm x","opts":{"env":{"A":"b"},"z":1}}'
    assert reading.plain == (subject,)
    # Each argument alone, and a nested one along its path.
    assert {'{"cmd":"rm x"}', '{"opts":{"z":1}}', '{"opts":{"env":{"A":"b"}}}'} <= set(reading.seen)
    assert read_arguments({"cmd": "x", "more": 1}, schema)[1].plain is None


def test_a_builtin_with_thousands_of_words_is_read_in_bounded_pieces():
    """Every tail of a command that may run its words is a piece for Deny rules:
    bounded, so a model's 20,000-word line costs megabytes, not gigabytes."""
    words = " ".join(f"w{i}" for i in range(20_000))
    reading = read_command_line(f"nosuchprogram {words}")
    assert reading.plain is None
    assert sum(len(piece) for piece in reading.seen) < 8_000_000

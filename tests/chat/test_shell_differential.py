"""The command-line reader against bash itself (issues 34 and 52).

A corpus of tricky lines runs through real ``bash -c`` inside the tool
sandbox, with no builtin switched off. Two records say what bash ran:

* ``PATH`` points at stub programs that log their own name and argv;
* a ``DEBUG`` trap (set in ``BASH_ENV``, inherited by functions, subshells
  and substitutions through ``set -T``) logs every simple command bash
  runs, builtins included, as ``$BASH_COMMAND``. (``extdebug`` is not set:
  in ``BASH_ENV`` it turns the inheritance off again.)

For every line:

* if the reader calls it plain (a pattern may vouch for it), every program
  bash started must be one of the reader's commands, argv for argv, and
  every command the trap saw must be one of them, name for name, each once;
* every command bash ran must be one the reader saw (what Deny, Review and
  Ask rules look at), unless the line is marked as one whose command name
  only exists when it runs (``$(echo rm)``), which must not be plain.

The corpus crosses every builtin and keyword bash lists (``compgen -b``,
``compgen -k``) with the argument shapes through which builtins evaluate or
run their words: subscripts holding ``$(…)``, ``-v``, ``-C``, ``-x``,
``-F``, ``-n``, history and ``fc``.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from chat.tools.sandbox import MB, Limits, run_sandboxed
from studio.shell import read_command_line

pytestmark = pytest.mark.usefixtures("root_sandbox")

STUBS = """
    [ cat chmod cp curl date echo env false find git grep head id kill ls mkdir mv
    nohup printf pwd python3 rm sort sudo tail test timeout touch true type wc wget
    xargs
""".split()

# Lines whose command name bash only learns while running them.
OPAQUE = [
    "$(enable echo; echo rm) -f x",
    "`enable echo; echo rm` -f x",
    "x=rm; $x -f y",
    "${X:-rm} -f y",
    'eval "$(enable echo; echo rm -f x)"',
    "eval $'r\\x6d -f x'",
    "c=i; d=d; $c$d",
    "printf 'rm -f x' | bash",
    "echo id | sh",
    # Arithmetic reads a variable's value as code: here the value comes in
    # while the line runs.
    "read y <<< 'a[$(id)]'; let x=y",
    'mapfile -t a <<< id; "${a[@]}"',
    "bash <<< 'rm -f x'",
    "bash <<EOF\nrm -f x\nEOF",
    "source /dev/stdin <<< 'rm x'",
    ". <(enable echo; echo id)",
    'a=(rm -f x); "${a[@]}"',
]

HANDWRITTEN = [
    # The attack of issue 34 and its twin past a Deny.
    "ls $'\\'' ; id > PWNED.txt ; #'",
    "echo $'\\'' ; rm -f x ; #'",
    "ls $'\\x27' ; id",
    "ls $'a\\'b' ; id ; #'",
    'ls $"a" ; id',
    "ls 'a'\\'' ; id ; #'",
    'ls "a\\" ; id ; #"',
    "ls a\\' ; id ; #'",
    "ls a\\\\' ; id ; #'",
    "ls 'a\\' ; id ; #'",
    'ls "a\\"" ; id',
    'ls "$(id)"',
    "ls `id`",
    "ls $(id) $(rm -f x)",
    'ls "`id`"',
    "ls <(id)",
    "ls >(id)",
    "ls; id",
    "ls && id || rm -f x",
    "ls | id | wc -l",
    "ls & id",
    "ls\nid",
    "ls\n\nid\n",
    "ls #; id",
    "ls # \nid",
    "# ls\nid",
    "ls a#b; id",
    "ls\\\n; id",
    "l\\\ns; id",
    "ls \\; id",
    "ls ';' id",
    'ls ";" id',
    "ls '&&' id",
    "ls \\&\\& id",
    "ls \\| id",
    "ls a\\ b",
    "ls 'a b' \"c d\" e\\ f",
    "ls ''",
    'ls ""',
    "ls '' '' x",
    "'ls' -la",
    '"ls" -la',
    "l's' -la",
    'l"s" -la',
    "l\\s -la",
    "\\ls -la",
    "ls -la 'it'\\''s'",
    'ls "it\'s"',
    "ls 'say \"hi\"'",
    'ls "a\\\\b"',
    'ls "a\\nb"',
    "ls 'a\\nb'",
    "ls a\\\\b",
    'ls "$HOME"',
    "ls \\$HOME",
    "ls '$HOME'",
    'ls "\\$HOME"',
    "ls $HOME",
    "ls ~",
    "ls ~root",
    "ls a=~",
    "ls *",
    "ls *.py",
    "ls [a]",
    "ls {a,b}",
    "ls {a..c}",
    "{ls,-la}",
    "{ id; }",
    "( id )",
    "(id); ls",
    "ls; (id)",
    "f() { id; }; f",
    "function f { id; }; f",
    "if ls; then id; fi",
    "while false; do id; done",
    "for i in a; do id; done",
    "case x in x) id;; esac",
    "[[ -n $(id) ]]",
    "[ -n x ] && id",
    "test -n x && id",
    "! ls; id",
    "ls;; id",
    "ls |& id",
    "ls >x; id",
    "ls 2>&1 | id",
    "ls > >(id)",
    "ls <<< $(id)",
    "ls <<EOF\n$(id)\nEOF",
    "ls <<'EOF'\n$(id)\nEOF",
    "FOO=1 ls",
    "PATH=/usr/bin ls",
    "export X=$(id)",
    "local x=$(id)",
    "declare -x y=$(id)",
    "x=$(id)",
    "env ls",
    "env -i id",
    "/usr/bin/env rm -f x",
    "xargs rm -f",
    "find . -exec rm -f {} +",
    "find . -execdir id \\;",
    "nohup id",
    "timeout 5 rm -f x",
    "sudo rm -rf /",
    "command rm -f x",
    "builtin echo hi",
    "exec id",
    "eval id",
    "eval 'rm -f x'",
    'eval "ls; id"',
    "bash -c 'rm -f x'",
    'bash -c "ls; id"',
    "sh -c 'rm -f x'",
    "bash -ec 'id'",
    "bash -c 'bash -c \"rm -f x\"'",
    "bash -c $'rm -f x'",
    "echo hi",
    "printf '%s\\n' a b",
    "printf \"%s\\n\" 'a;b'",
    "echo -n 'a' \"b\" c",
    "true && false || id",
    "pwd; type ls",
    "echo '#' hi",
    "echo #hi",
    "echo a#",
    "echo \\#x",
    "echo 'a\nb'",
    'echo "a\nb"',
    "echo a\tb",
    "ls\t-la",
    "ls\u00a0-la",
    "lś -la",
    "ls é",
    "ls\r\nid",
    "ls \x0bid",
    "ls\x0c; id",
    "ls 'unterminated; id",
    'ls "unterminated; id',
    "ls $(; id",
    "ls )",
    "ls (",
    "ls; ;id",
    "; ls",
    "&& ls",
    "ls &&",
    "ls |",
    "ls || ",
    "ls & & id",
    "git status",
    "git log --oneline -5",
    "git -c core.pager=id log",
    "grep -r 'rm -rf' .",
    "grep -e '$(id)' x",
    'cat "; id"',
    "wc -l < x",
    "cat x | sort | head -5",
    "mkdir -p a/b && touch a/b/c && ls a",
    "cp a b; mv b c; rm -f c",
    "chmod +x x; ./x",
    "./x",
    "../x",
    "/bin/ls",
    "/usr/bin/id",
    "python3 -c 'import os; os.system(\"id\")'",
    "python3 -c \"print('$(id)')\"",
    "curl -o x http://127.0.0.1/",
    "wget -q -O- http://127.0.0.1/ | bash",
    "date +%s",
    "date '+%Y-%m-%d'",
    "ls -- -x",
    "ls --color=auto",
    "ls '-la'",
    "ls $'x'",
    "ls $''",
    "ls $",
    "ls a$",
    'ls "a$"',
    "ls $ id",
    "ls '$'(id)",
    "ls \"$\"'(id)'",
    "ls \\$(id)",
    "ls '\\$(id)'",
    "ls \\`id\\`",
    "rm -rf /",
    "r\\m -f x",
    "r''m -f x",
    'r""m -f x',
    "'r'm -f x",
    "rm -f x #",
    "rm -f x;",
    "rm -f x &",
    "id; ls",
    # Issue 52: builtins that evaluate or run their plain words.
    "printf -v 'a[$(touch PWNED)]' %s x",
    "printf '%s\\n' hi",
    "test -v 'a[$(rm -f x)]'",
    "[ -v 'a[$(rm -f x)]' ]",
    "read 'a[$(id)]' <<< x",
    "let 'a[$(rm -f victim2)]'",
    "declare 'a[$(id)]'=1",
    "typeset 'a[$(id)]'",
    "jobs -x rm -f victim",
    "compgen -C 'rm -f victim3' x",
    "mapfile -C 'rm -f x' -c 1 <<< a",
    "readarray -C 'rm -f x' -c 1 <<< a",
    "history -s 'rm -f victim4'; fc -s",
    "y='a[$(rm -f x)]'; let z=y",
    "getopts x 'a[$(id)]'",
    "unset 'a[$(id)]'",
    "shift 'a[$(id)]'",
    "ulimit -t 'a[$(id)]'",
    "echo 'a[$(id)]'",
    "echo -e 'a[$(id)]'",
    ": 'a[$(id)]'",
    "true 'a[$(id)]'",
    "false 'a[$(id)]' || pwd -P",
    "ls -la\u3000#",
    "[[ -v 'a[$(rm -f x)]' ]]",
    "[[ 'a[$(id)]' -eq 0 ]]",
    "export 'a[$(id)]'",
    "ls\u2003-la",
    "/usr/bin/printf -v x",
    "./x -la",
]

WORDS = ["ls", "'ls'", '"ls"', "l's'", "l\\s", "$'ls'", "l$'s'", '$"ls"', 'l"s"', "\\ls"]
ARGUMENTS = [
    "-la",
    "'a b'",
    '"a;b"',
    "a\\;b",
    "'it'\\''s'",
    "\"$'x'\"",
    "\\$HOME",
    "'#x'",
    "a#b",
    "#c",
    "$'\\''",
    "'\\''",
    '"\\""',
    "$'\\x3b'",
]
JOINTS = [";", " && ", " || ", " | ", " & ", "\n", " ; ", ";;", " |& ", "&&\n"]
SECONDS = ["id", "rm -f x", "echo hi", "'id'", "$'id'"]


def generated() -> list[str]:
    """Each quoting of a command name, argument and joint, with a second command."""
    combos = itertools.product(WORDS, ARGUMENTS, JOINTS, SECONDS)
    # Every seventh of the 7,000 combinations: each part in many settings.
    return [f"{w} {a}{j}{s}" for i, (w, a, j, s) in enumerate(combos) if i % 7 == 0]


# The shapes in which builtins evaluate or run their words; P is a command.
SHAPES = [
    "{b} -v 'a[$(P)]' x",
    "{b} 'a[$(P)]'",
    "{b} 'a[$(P)]=1'",
    "{b} -n 'a[$(P)]'",
    "{b} -a 'a[$(P)]'",
    "{b} -p 'a[$(P)]' x",
    "{b} x 'a[$(P)]'",
    "{b} -C 'P' x",
    "{b} -x P",
    "{b} -F P x",
    "{b} -s 'P'; fc -s",
    "history -s 'P'; {b} -s",
    "{b} -- P",
    "{b} P",
    "{b} -e P x",
]
PAYLOADS = ["id", "rm -f x"]


def bash_names() -> list[str]:
    """Every builtin and keyword, as the tools' bash lists them."""
    listed = subprocess.run(
        ["/bin/bash", "--norc", "-c", "compgen -b; compgen -k"],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    )
    return sorted(set(listed.stdout.split()))


def builtin_lines() -> list[str]:
    """Each builtin and keyword in each shape, with one payload or the other."""
    combos = itertools.product(bash_names(), SHAPES)
    return [
        shape.replace("{b}", name).replace("P", PAYLOADS[i % 2])
        for i, (name, shape) in enumerate(combos)
    ]


BUILTIN_LINES = builtin_lines()
CORPUS = list(dict.fromkeys(HANDWRITTEN + OPAQUE + generated() + BUILTIN_LINES))
# ``source FILE`` and ``. FILE`` run what a file says (here a stub's own lines):
# like the opaque lines, never plain, and what they run is not the reader's.
SOURCING = [line for line in CORPUS if re.search(r"(^|; )(\.|source) ", line)]

# Runs inside the sandbox, whose private /tmp holds the stubs and the cases
# (the workspace's own parents are closed to the tool's uid).
DRIVER = textwrap.dedent(
    """
    import json, os, subprocess
    from concurrent.futures import ThreadPoolExecutor
    stubs = "/tmp/stubs"
    os.makedirs(stubs)
    for name in json.load(open("stubs.json")):
        path = os.path.join(stubs, name)
        with open(path, "w") as f:
            f.write(open("stub.sh").read())
        os.chmod(path, 0o755)
    # Shells run for real, with the same stubs and trap: what they run must show.
    os.symlink("/bin/bash", os.path.join(stubs, "bash"))
    os.symlink("/bin/bash", os.path.join(stubs, "sh"))
    with open("/tmp/bash_env", "w") as f:
        f.write(open("bash_env").read())

    def fields(path):
        return [f.decode("utf-8", "surrogateescape")
                for f in open(path, "rb").read().split(b"\\0")[:-1]]

    def run(n, line):
        case = os.path.join("/tmp/cases", str(n))
        log, work = os.path.join(case, "log"), os.path.join(case, "work")
        os.makedirs(log)
        os.makedirs(work)
        trace = os.path.join(case, "trace")
        env = {
            "PATH": stubs,
            "BASH_ENV": "/tmp/bash_env",
            "STUB_LOG": log,
            "STUDIO_TRACE": trace,
            "HOME": work,
            "LC_ALL": "C.UTF-8",
        }
        bash = subprocess.Popen(["/bin/bash", "-c", line], env=env, cwd=work,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # Output is read to its end: commands bash left in the background
            # have logged before their end of the pipe closes.
            bash.communicate(timeout=3)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(bash.pid, 9)
            bash.communicate()
            timed_out = True
        started = [fields(os.path.join(log, name)) for name in sorted(os.listdir(log))]
        traced = fields(trace) if os.path.exists(trace) else []
        return {"line": line, "started": started, "traced": traced, "timed_out": timed_out}

    # Several at a time: a line may stop its own shell (suspend) until the timeout.
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(run, *zip(*enumerate(json.load(open("corpus.json"))))))
    json.dump(results, open("results.json", "w"))
    """
)

# Logs its name and argv, one file per call; "false" still fails ([[ is no
# builtin). -p: it reads no BASH_ENV, so its own commands are not traced.
STUB = (
    "#!/bin/bash -p\n"
    'printf \'%s\\0\' "${0##*/}" "$@" > "$STUB_LOG/$$.$RANDOM$RANDOM"\n'
    "[[ ${0##*/} != false ]]\n"
)
# Every simple command bash runs, builtins included, in the line and in all it
# starts; the trap's own printf is the builtin whatever the line does.
BASH_ENV = 'set -T\ntrap \'builtin printf "%s\\0" "$BASH_COMMAND" >> "$STUDIO_TRACE"\' DEBUG\n'


@pytest.fixture(scope="module")
def bash_runs(workspace_root) -> list[dict]:
    """What bash started for each line of the corpus, run once in the sandbox."""
    workspace = workspace_root / "conversation-990001"
    workspace.mkdir()
    files = {
        "stubs.json": json.dumps(STUBS),
        "stub.sh": STUB,
        "bash_env": BASH_ENV,
        "corpus.json": json.dumps(CORPUS),
    }
    for name, text in files.items():
        (workspace / name).write_text(text)
        (workspace / name).chmod(0o644)  # written by the test's uid, read by the tool's
    limits = Limits(memory_bytes=1024 * MB, workspace_bytes=256 * MB, processes=256)
    result = run_sandboxed(
        ["/usr/bin/python3", "-"],
        stdin=DRIVER,
        workspace=workspace,
        timeout=300,
        limits=limits,
    )
    assert result.exit_code == 0, result.output
    return json.loads((workspace / "results.json").read_text())


def test_the_corpus_is_large_and_bash_ran_it(bash_runs):
    assert len(CORPUS) >= 2000
    assert len(BUILTIN_LINES) >= 1000
    assert {"printf", "let", "jobs", "compgen", "mapfile", "fc", "if", "[["} <= set(bash_names())
    assert [run["line"] for run in bash_runs] == CORPUS
    # The stubs and the trap see what bash runs: the corpus is not vacuous.
    assert sum(1 for run in bash_runs if run["started"]) > len(CORPUS) // 3
    ran = {tuple(argv) for run in bash_runs for argv in run["started"]}
    assert ("id",) in ran and ("rm", "-f", "x") in ran
    traced = {name for run in bash_runs for name in _traced_names(run)}
    assert {"echo", "printf", "let", "jobs", "compgen", "fc", "id", "rm"} <= traced
    # Builtins ran what their words said: the attacks of issue 52 are live.
    by_line = {run["line"]: run for run in bash_runs}
    assert ["touch", "PWNED"] in by_line["printf -v 'a[$(touch PWNED)]' %s x"]["started"]
    assert ["rm", "-f", "victim"] in by_line["jobs -x rm -f victim"]["started"]
    assert ["rm", "-f", "victim4"] in by_line["history -s 'rm -f victim4'; fc -s"]["started"]


def test_a_plain_line_runs_only_the_commands_the_reader_checked(bash_runs):
    wrong = []
    for run in bash_runs:
        reading = read_command_line(run["line"])
        if reading.plain is None:
            continue
        unchecked = [argv for argv in run["started"] if tuple(argv) not in reading.argvs]
        names = Counter(_name(argv[0]) for argv in reading.argvs)
        extra = Counter(_traced_names(run)) - names
        if unchecked or extra:
            wrong.append((run["line"], unchecked, sorted(extra), reading.argvs))
    assert wrong == []


def test_every_command_bash_ran_was_seen_by_the_reader(bash_runs):
    wrong = []
    for run in bash_runs:
        reading = read_command_line(run["line"])
        if run["line"] in OPAQUE or run["line"] in SOURCING:
            assert reading.plain is None, run["line"]
            continue
        names = {_name(piece.split(" ", 1)[0]) for piece in reading.seen if piece}
        ran = [_name(argv[0]) for argv in run["started"]] + _traced_names(run)
        unseen = [
            name
            for name in ran
            if name not in names
            and not any(p == name or p.startswith(f"{name} ") for p in reading.seen)
            # A name with a control character in it: no program, builtin or
            # function is called that (bash said "not found").
            and not _CONTROL.search(name)
        ]
        if unseen:
            wrong.append((run["line"], unseen, reading.seen))
    assert wrong == []


def test_a_line_whose_command_exists_only_when_it_runs_is_never_plain(bash_runs):
    """Such a line may hide anything from a Deny: no pattern vouches for it, a person decides."""
    by_line = {run["line"]: run for run in bash_runs}
    for line in OPAQUE:
        assert read_command_line(line).plain is None, line
        assert by_line[line]["started"], line  # bash did start what it hid


def test_no_builtin_but_the_quiet_ones_is_ever_plain():
    quiet = {"echo", "true", "false", "pwd", ":"}
    plain = {
        line.split(" ", 1)[0] for line in BUILTIN_LINES if read_command_line(line).plain is not None
    }
    assert plain <= quiet


# Entries of the trap that are no simple command: compound commands and
# assignments alone.
_COMPOUND = re.compile(r"\(\(|\[\[|(for|case|select|if|while|until|function)\b")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")


def _traced_names(run: dict) -> list[str]:
    """The name of each simple command the trap logged, as bash would look it up."""
    names = []
    for text in run["traced"]:
        if _COMPOUND.match(text):
            continue
        try:
            words = shlex.split(text)
        except ValueError:
            words = text.split()
        words = list(itertools.dropwhile(_ASSIGNMENT.match, words))
        if words:
            names.append(_name(words[0]))
    return names


def _name(word: str) -> str:
    return Path(word).name if "/" in word else word

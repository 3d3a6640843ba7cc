"""The command-line reader against bash itself (issue 34, part 1).

A corpus of tricky lines runs through real ``bash -c`` inside the tool
sandbox, with ``PATH`` pointing at stub commands that only log their own
name and argv (and bash's ``echo``, ``printf``, ``test`` ... switched off,
so those reach the stubs too). For every line:

* if the reader calls it plain (a pattern may vouch for it), every command
  bash started must be one of the reader's commands, argv for argv;
* every command bash started must be one the reader saw (what Deny, Review
  and Ask rules look at), unless the line is marked as one whose command
  name only exists when it runs (``$(echo rm)``), which must not be plain.
"""

from __future__ import annotations

import itertools
import json
import textwrap
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
# Builtins switched off so a call of them reaches its stub. eval, exec,
# source, command and friends stay real: what they run must show.
DISABLED = "echo printf test [ true false pwd kill type"

# Lines whose command name bash only learns while running them.
OPAQUE = [
    "$(enable echo; echo rm) -f x",
    "`enable echo; echo rm` -f x",
    "x=rm; $x -f y",
    "${X:-rm} -f y",
    'eval "$(enable echo; echo rm -f x)"',
    "eval $'r\\x6d -f x'",
    "c=i; d=d; $c$d",
    "enable printf; printf 'rm -f x' | bash",
    "enable echo; echo id | sh",
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


CORPUS = list(dict.fromkeys(HANDWRITTEN + OPAQUE + generated()))

# Runs inside the sandbox, whose private /tmp holds the stubs and the cases
# (the workspace's own parents are closed to the tool's uid).
DRIVER = textwrap.dedent(
    """
    import json, os, subprocess
    stubs = "/tmp/stubs"
    os.makedirs(stubs)
    for name in json.load(open("stubs.json")):
        path = os.path.join(stubs, name)
        with open(path, "w") as f:
            f.write(open("stub.sh").read())
        os.chmod(path, 0o755)
    # Shells run for real, with the same stubs: what they run must show.
    os.symlink("/bin/bash", os.path.join(stubs, "bash"))
    os.symlink("/bin/bash", os.path.join(stubs, "sh"))
    with open("/tmp/bash_env", "w") as f:
        f.write(open("bash_env").read())
    results = []
    for n, line in enumerate(json.load(open("corpus.json"))):
        case = os.path.join("/tmp/cases", str(n))
        log, work = os.path.join(case, "log"), os.path.join(case, "work")
        os.makedirs(log)
        os.makedirs(work)
        env = {
            "PATH": stubs,
            "BASH_ENV": "/tmp/bash_env",
            "STUB_LOG": log,
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
        started = []
        for name in sorted(os.listdir(log)):
            fields = open(os.path.join(log, name), "rb").read().split(b"\\0")[:-1]
            started.append([f.decode("utf-8", "surrogateescape") for f in fields])
        results.append({"line": line, "started": started, "timed_out": timed_out})
    json.dump(results, open("results.json", "w"))
    """
)

# Logs its name and argv, one file per call; "false" still fails ([[ is no
# builtin). -p: it does not read BASH_ENV, so its own printf is bash's.
STUB = (
    "#!/bin/bash -p\n"
    'printf \'%s\\0\' "${0##*/}" "$@" > "$STUB_LOG/$$.$RANDOM$RANDOM"\n'
    "[[ ${0##*/} != false ]]\n"
)


@pytest.fixture(scope="module")
def bash_runs(workspace_root) -> list[dict]:
    """What bash started for each line of the corpus, run once in the sandbox."""
    workspace = workspace_root / "conversation-990001"
    workspace.mkdir()
    files = {
        "stubs.json": json.dumps(STUBS),
        "stub.sh": STUB,
        "bash_env": f"enable -n {DISABLED}\n",
        "corpus.json": json.dumps(CORPUS),
    }
    for name, text in files.items():
        (workspace / name).write_text(text)
        (workspace / name).chmod(0o644)  # written by the test's uid, read by the tool's
    limits = Limits(memory_bytes=512 * MB, workspace_bytes=256 * MB, processes=64)
    result = run_sandboxed(
        ["/usr/bin/python3", "-"],
        stdin=DRIVER,
        workspace=workspace,
        timeout=120,
        limits=limits,
    )
    assert result.exit_code == 0, result.output
    return json.loads((workspace / "results.json").read_text())


def test_the_corpus_is_large_and_bash_ran_it(bash_runs):
    assert len(CORPUS) >= 200
    assert [run["line"] for run in bash_runs] == CORPUS
    # The stubs see what bash runs: the corpus is not vacuous.
    assert sum(1 for run in bash_runs if run["started"]) > len(CORPUS) // 2
    ran = {tuple(argv) for run in bash_runs for argv in run["started"]}
    assert ("id",) in ran and ("rm", "-f", "x") in ran and ("echo", "hi") in ran


def test_a_plain_line_starts_only_the_commands_the_reader_checked(bash_runs):
    wrong = []
    for run in bash_runs:
        reading = read_command_line(run["line"])
        if reading.plain is None:
            continue
        unchecked = [argv for argv in run["started"] if tuple(argv) not in reading.argvs]
        if unchecked:
            wrong.append((run["line"], unchecked, reading.argvs))
    assert wrong == []


def test_every_command_bash_started_was_seen_by_the_reader(bash_runs):
    wrong = []
    for run in bash_runs:
        reading = read_command_line(run["line"])
        if run["line"] in OPAQUE:
            assert reading.plain is None, run["line"]
            continue
        names = {_first_word(piece) for piece in reading.seen}
        unseen = [argv for argv in run["started"] if argv[0] not in names]
        if unseen:
            wrong.append((run["line"], unseen, reading.seen))
    assert wrong == []


def test_a_line_whose_command_exists_only_when_it_runs_is_never_plain(bash_runs):
    """Such a line may hide anything from a Deny: no pattern vouches for it, a person decides."""
    for run in bash_runs:
        if run["line"] in OPAQUE:
            assert read_command_line(run["line"]).plain is None, run["line"]
            assert run["started"], run["line"]  # bash did start what it hid


def _first_word(piece: str) -> str:
    word = piece.split(" ", 1)[0] if piece else ""
    return Path(word).name if "/" in word else word

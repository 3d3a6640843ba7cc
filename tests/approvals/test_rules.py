"""Rules: matching and precedence, table-driven (scopes x actions x patterns, the switch)."""

from __future__ import annotations

import pytest

from approvals.models import ToolApproval, ToolRule
from approvals.services.rules import approval_verdict
from studio.shell import read_command_line
from tests.factories import make_conversation

pytestmark = pytest.mark.django_db

A, S = ToolRule.Action, ToolRule.Scope


def rule(tool, action, scope="everyone", pattern="", *, where=None, revoked=False, note=""):
    return {"tool": tool, "action": action, "scope": scope, "pattern": pattern,
            "where": where, "revoked": revoked, "note": note}  # fmt: skip


# (rules, confirm switch, tool, subject) -> (action, reason, index of the deciding rule)
CASES = {
    "no rule, confirm on: ask": ([], True, "terminal", "ls", (A.ASK, "", None)),
    "no rule, confirm off: runs, the member's switch": (
        [], False, "terminal", "ls", (A.ALLOW, "confirm_off", None),
    ),
    "an allow pattern matches": (
        [rule("terminal", A.ALLOW, pattern="git status*")], True, "terminal", "git status -s",
        (A.ALLOW, "rule", 0),
    ),
    "an allow pattern that does not match: ask": (
        [rule("terminal", A.ALLOW, pattern="git status*")], True, "terminal", "git push",
        (A.ASK, "", None),
    ),
    "deny wins over allow, whatever the scopes": (
        [rule("terminal", A.ALLOW, "conversation", where="mine"),
         rule("terminal", A.DENY, "member", "rm -rf*", where="alice")],
        True, "terminal", "rm -rf /", (A.DENY, "rule", 1),
    ),
    "an admin's deny holds where the member switched confirmation off": (
        [rule("terminal", A.DENY, pattern="rm *")], False, "terminal", "rm x",
        (A.DENY, "rule", 0),
    ),
    "an admin's ask holds where the member switched confirmation off": (
        [rule("terminal", A.ASK, pattern="git push*")], False, "terminal", "git push origin",
        (A.ASK, "rule", 0),
    ),
    "ask wins over allow": (
        [rule("terminal", A.ALLOW, "member", where="alice"), rule("terminal", A.ASK)],
        True, "terminal", "make deploy", (A.ASK, "rule", 1),
    ),
    "review wins over ask, deny over review": (
        [rule("*", A.ASK), rule("terminal", A.REVIEW, pattern="deploy*"),
         rule("terminal", A.DENY, pattern="deploy --prod*")],
        True, "terminal", "deploy --prod now", (A.DENY, "rule", 2),
    ),
    "review over ask": (
        [rule("*", A.ASK), rule("terminal", A.REVIEW, pattern="deploy*")],
        True, "terminal", "deploy staging", (A.REVIEW, "rule", 1),
    ),
    "* is any tool": ([rule("*", A.ALLOW)], True, "python", "print(1)", (A.ALLOW, "rule", 0)),
    "another tool's rule does not apply": (
        [rule("python", A.ALLOW)], True, "terminal", "ls", (A.ASK, "", None),
    ),
    "a site pattern for web_fetch": (
        [rule("web_fetch", A.ALLOW, pattern="https://docs.python.org/*")], True, "web_fetch",
        "https://docs.python.org/3/library/fnmatch.html", (A.ALLOW, "rule", 0),
    ),
    "an MCP tool matches its arguments as canonical JSON": (
        [rule("files__remove", A.DENY, pattern='*"path":"/etc/*')], True, "files__remove",
        '{"path":"/etc/passwd"}', (A.DENY, "rule", 0),
    ),
    "'ls *' is ls with any arguments": (
        [rule("terminal", A.ALLOW, pattern="ls *")], True, "terminal", "ls",
        (A.ALLOW, "rule", 0),
    ),
    "'ls *' is not lsblk": (
        [rule("terminal", A.ALLOW, pattern="ls *")], True, "terminal", "lsblk",
        (A.ASK, "", None),
    ),
    "a prefix allow does not vouch for what follows a ';'": (
        [rule("terminal", A.ALLOW, pattern="ls *")], True, "terminal", "ls; rm -rf x",
        (A.ASK, "", None),
    ),
    "...nor a newline, '&&' or a pipe": (
        [rule("terminal", A.ALLOW, pattern="ls *")], False, "terminal", "ls\nrm x | cat && id",
        (A.ALLOW, "confirm_off", None),
    ),
    "a line is allowed when every command in it is": (
        [rule("terminal", A.ALLOW, pattern="ls *"),
         rule("terminal", A.ALLOW, pattern="git status *")],
        True, "terminal", "ls -la && git status", (A.ALLOW, "rule", 0),
    ),
    "substitution is never allowed by a pattern": (
        [rule("terminal", A.ALLOW, pattern="echo *")], True, "terminal", "echo $(rm x)",
        (A.ASK, "", None),
    ),
    "nor a redirection": (
        [rule("terminal", A.ALLOW, pattern="echo *")], True, "terminal", "echo x > ~/.bashrc",
        (A.ASK, "", None),
    ),
    "an exact command allows that very line": (
        [rule("terminal", A.ALLOW, pattern="ls [*] && echo $(date)")], True, "terminal",
        "ls * && echo $(date)", (A.ALLOW, "rule", 0),
    ),
    "a tool-wide allow allows any line": (
        [rule("terminal", A.ALLOW)], True, "terminal", "echo x > y", (A.ALLOW, "rule", 0),
    ),
    "a deny matches any command of the line": (
        [rule("terminal", A.ALLOW), rule("terminal", A.DENY, pattern="rm -rf*")], True,
        "terminal", "ls && rm -rf /", (A.DENY, "rule", 1),
    ),
    "quotes do not hide a command from a deny": (
        [rule("terminal", A.DENY, pattern="rm -rf*")], False, "terminal", "'rm' -rf /",
        (A.DENY, "rule", 0),
    ),
    "another conversation's rule does not apply": (
        [rule("terminal", A.ALLOW, "conversation", where="other")], True, "terminal", "ls",
        (A.ASK, "", None),
    ),
    "another member's rule does not apply": (
        [rule("terminal", A.ALLOW, "member", where="bob")], True, "terminal", "ls",
        (A.ASK, "", None),
    ),
    "a revoked rule does not apply": (
        [rule("terminal", A.DENY, revoked=True)], True, "terminal", "ls", (A.ASK, "", None),
    ),
    # Issue 34: shlex read one ls here; bash runs ls, then id, then a comment.
    "an ANSI-C quote does not smuggle a second command past an allow": (
        [rule("terminal", A.ALLOW, pattern="ls *")], True, "terminal",
        "ls $'\\'' ; id > PWNED.txt ; #'", (A.ASK, "", None),
    ),
    "...nor past a deny": (
        [rule("terminal", A.DENY, pattern="rm *")], False, "terminal",
        "echo $'\\'' ; rm -f x ; #'", (A.DENY, "rule", 0),
    ),
    "a deny sees into bash -c": (
        [rule("terminal", A.ALLOW), rule("terminal", A.DENY, pattern="rm *")], False, "terminal",
        "bash -c 'cd x && rm -rf y'", (A.DENY, "rule", 1),
    ),
    "a review sees through sudo": (
        [rule("terminal", A.REVIEW, pattern="systemctl *")], False, "terminal",
        "sudo systemctl restart web", (A.REVIEW, "rule", 0),
    ),
    "a line a deny cannot read asks, even with confirmation off": (
        [rule("terminal", A.DENY, pattern="rm *")], False, "terminal", "$(echo rm) -rf x",
        (A.ASK, "", None),
    ),
    "...and even with the whole tool allowed": (
        [rule("terminal", A.ALLOW), rule("terminal", A.DENY, pattern="rm *")], True, "terminal",
        "eval \"$CMD\"", (A.ASK, "", None),
    ),
    "a line a review cannot read goes to a reviewer": (
        [rule("terminal", A.REVIEW, pattern="*deploy*")], False, "terminal", "x=dep; ${x}loy",
        (A.REVIEW, "", 0),
    ),
    "an unreadable line with no guarding rule follows the switch": (
        [], False, "terminal", "echo $(date)", (A.ALLOW, "confirm_off", None),
    ),
    # Issue 52: builtins evaluate their plain-looking words.
    "an allow for printf does not vouch for printf -v's subscript": (
        [rule("terminal", A.ALLOW, pattern="printf *")], True, "terminal",
        "printf -v 'a[$(touch PWNED)]' %s x", (A.ASK, "", None),
    ),
    "...nor for any printf: a builtin that evaluates is never plain": (
        [rule("terminal", A.ALLOW, pattern="printf *")], True, "terminal", "printf '%s\\n' hi",
        (A.ASK, "", None),
    ),
    "a quiet builtin stays plain": (
        [rule("terminal", A.ALLOW, pattern="echo *")], True, "terminal", "echo 'a[$(id)]'",
        (A.ALLOW, "rule", 0),
    ),
    "a deny sees what jobs -x runs": (
        [rule("terminal", A.DENY, pattern="rm *")], False, "terminal", "jobs -x rm -f victim",
        (A.DENY, "rule", 0),
    ),
    "...what let's subscript runs": (
        [rule("terminal", A.DENY, pattern="rm *")], False, "terminal",
        "let 'a[$(rm -f victim2)]'", (A.DENY, "rule", 0),
    ),
    "...compgen -C's command": (
        [rule("terminal", A.DENY, pattern="rm *")], False, "terminal",
        "compgen -C 'rm -f victim3' x", (A.DENY, "rule", 0),
    ),
    "...what fc -s runs again": (
        [rule("terminal", A.DENY, pattern="rm *")], False, "terminal",
        "history -s 'rm -f victim4'; fc -s", (A.DENY, "rule", 0),
    ),
    "...a [ -v subscript": (
        [rule("terminal", A.DENY, pattern="rm *")], False, "terminal",
        "[ -v 'a[$(rm -f x)]' ]", (A.DENY, "rule", 0),
    ),
    "...and an assignment arithmetic reads later": (
        [rule("terminal", A.DENY, pattern="rm *")], False, "terminal",
        "y='a[$(rm -f x)]'; let z=y", (A.DENY, "rule", 0),
    ),
    "a builtin whose commands come from a file asks where a deny exists": (
        [rule("terminal", A.DENY, pattern="rm *")], False, "terminal", "history -r h; fc -s",
        (A.ASK, "", None),
    ),
    "a workspace file is no program a pattern vouches for": (
        [rule("terminal", A.ALLOW, pattern="./build.sh *")], True, "terminal", "./build.sh -j2",
        (A.ASK, "", None),
    ),
    "a command deep in a long line is still seen by a deny (or asks)": (
        [rule("terminal", A.DENY, pattern="rm *")], False, "terminal",
        "xargs " + "x " * 2000 + "rm -rf /", (A.DENY, "rule", 0),
    ),
    "a space bash does not split on is not plain": (
        [rule("terminal", A.ALLOW, pattern="ls *")], True, "terminal", "ls -la\u3000#",
        (A.ASK, "", None),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_rules_decide_with_precedence(case, alice, bob):
    specs, confirm, tool, subject, (action, reason, index) = CASES[case]
    mine = make_conversation(alice, confirm_tool_calls=confirm)
    other = make_conversation(alice)
    targets = {"mine": {"conversation": mine}, "other": {"conversation": other},
               "alice": {"member": alice}, "bob": {"member": bob}, None: {}}  # fmt: skip
    rules = [
        ToolRule.objects.create(
            tool=spec["tool"],
            action=spec["action"],
            scope=spec["scope"],
            pattern=spec["pattern"],
            note=spec["note"],
            **targets[spec["where"]],
        )  # fmt: skip
        for spec in specs
    ]
    for spec, row in zip(specs, rules, strict=True):
        if spec["revoked"]:
            row.revoked_at = row.created_at
            row.save()
    reading = read_command_line(subject) if tool == "terminal" else None
    verdict = approval_verdict(conversation=mine, tool_name=tool, subject=subject, reading=reading)
    assert (verdict.action, verdict.reason) == (action, reason)
    assert verdict.rule == (rules[index] if index is not None else None)
    if index is not None:
        rules[index].refresh_from_db()
        assert rules[index].hits == 1 and rules[index].last_hit_at is not None


def test_the_admin_policy_setting_is_an_admin_allow_rule(conversation, settings):
    settings.STUDIO_AUTO_ALLOW_TOOLS = ["web_fetch"]
    verdict = approval_verdict(conversation=conversation, tool_name="web_fetch", subject="x")
    assert (verdict.action, verdict.reason) == (A.ALLOW, ToolApproval.Reason.POLICY)
    assert verdict.rule.snapshot()["note"] == "STUDIO_AUTO_ALLOW_TOOLS"
    # ...and, like any Allow, loses to a Deny.
    ToolRule.objects.create(tool="web_fetch", action=A.DENY)
    assert (
        approval_verdict(conversation=conversation, tool_name="web_fetch", subject="x").action
        == A.DENY
    )


# Issue 52: an MCP call's arguments are read one by one, against the tool's schema.
RUN_SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}}


@pytest.mark.parametrize(
    "arguments",
    [{"cmd": "rm -rf /srv/data"}, {"a": 0, "cmd": "rm -rf /srv/data"}, {"cmd": "rm x", "z": 1}],
)
def test_a_deny_naming_one_argument_holds_whatever_sorts_before_it(alice, arguments):
    """Under ``{"cmd":"rm*`` the call {"a":0,"cmd":"rm -rf /srv/data"} sorted "a"
    first, missed the pattern and ran with no card."""
    from studio.shell import read_arguments

    conversation = make_conversation(alice, confirm_tool_calls=False)
    deny = ToolRule.objects.create(tool="evil__run", pattern='{"cmd":"rm*', action=A.DENY)
    subject, reading = read_arguments(arguments, RUN_SCHEMA)
    verdict = approval_verdict(
        conversation=conversation, tool_name="evil__run", subject=subject, reading=reading
    )
    assert (verdict.action, verdict.rule) == (A.DENY, deny)


def test_an_argument_the_schema_does_not_declare_makes_a_call_not_fully_read(alice):
    from studio.shell import read_arguments

    conversation = make_conversation(alice, confirm_tool_calls=False)
    ToolRule.objects.create(tool="evil__run", pattern='{"cmd":"shutdown*', action=A.DENY)
    ToolRule.objects.create(tool="evil__run", action=A.ALLOW, scope=S.MEMBER, member=alice)
    declared = read_arguments({"cmd": "ls"}, RUN_SCHEMA)
    extra = read_arguments({"cmd": "ls", "exec": "shutdown now"}, RUN_SCHEMA)
    assert extra[1].plain is None and "'exec'" in extra[1].why

    def verdict(read):
        return approval_verdict(
            conversation=conversation, tool_name="evil__run", subject=read[0], reading=read[1]
        ).action

    # Allowed as a whole tool when every argument is read; a person decides otherwise.
    assert (verdict(declared), verdict(extra)) == (A.ALLOW, A.ASK)

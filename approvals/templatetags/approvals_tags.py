from __future__ import annotations

import difflib
import json
import re
from urllib.parse import urlsplit

from django import template
from django.db.models import Count, Max, Min
from django.utils import timezone
from django.utils.timesince import timesince

from approvals.patterns import glob_escape
from studio.shell import program_runs_others, read_command_line

register = template.Library()

# Arguments shown as code blocks rather than JSON values.
CODE_ARGUMENTS = {"code", "command", "script", "source"}
# Plain-text glyphs: they render without any emoji font installed.
ICONS = {"python": "py", "terminal": ">_", "web_fetch": "www", "web_search": "?"}
# The editor a pending card offers for a built-in tool's one argument
# (any other tool is edited as JSON).
EDITORS = {
    "python": ("code", "code"),
    "terminal": ("command", "line"),
    "web_fetch": ("url", "line"),
}


@register.filter
def display_arguments(arguments: object) -> list[dict]:
    if not isinstance(arguments, dict):
        return [{"name": "arguments", "value": json.dumps(arguments, indent=2), "code": False}]
    rows = []
    for name, value in arguments.items():
        if isinstance(value, str):
            rows.append({"name": name, "value": value, "code": name in CODE_ARGUMENTS})
        else:
            text = json.dumps(value, indent=2, ensure_ascii=False)
            rows.append({"name": name, "value": text, "code": False})
    return rows


@register.filter
def tool_icon(tool_name: str) -> str:
    if "__" in (tool_name or ""):
        return "mcp"
    return ICONS.get(tool_name, "fn")


@register.filter
def tool_label(tool_name: str) -> str:
    """``server__tool`` (an MCP server's tool) as "server › tool"."""
    server, sep, tool = (tool_name or "").partition("__")
    return f"{server} › {tool}" if sep else tool_name


@register.filter
def waiting_for(since) -> str:
    """How long a call has waited, as the inbox says it: "for 5 minutes"."""
    if since is None or (timezone.now() - since).total_seconds() < 60:
        return "for less than a minute"
    return f"for {timesince(since)}"


@register.simple_tag(takes_context=True)
def card_rights(context, approval):
    """What the page's ``viewer`` may decide on the card (none: the conversation's owner)."""
    return approval.rights(context.get("viewer") or None)


@register.filter
def call_name(approval) -> str:
    """How a screen reader names the call: "python call", "files › write call"."""
    return f"{tool_label(approval.tool_name)} call"


@register.filter
def call_summary(approval, limit: int = 80) -> str:
    """The call in one short line: its command, URL or code, else its arguments."""
    text = " ".join((approval.subject or json.dumps(approval.arguments)).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@register.filter
def always_choices(approval) -> list[dict]:
    """What "Always allow" offers for this call, the narrowest first (and pre-selected)."""
    choices = []
    subject = approval.subject or ""
    if approval.tool_name == "terminal" and subject.strip():
        choices.append({"pattern": glob_escape(subject), "label": "this exact command"})
        # Word prefixes only for one plain command: a pattern never vouches
        # for what follows a ";" or a "&&", nor for a line it cannot read.
        argvs = read_command_line(subject).argvs or ()
        words = list(argvs[0]) if len(argvs) == 1 else []
        if program_runs_others(subject):
            words = []  # its options or files may run anything: no prefix vouches
        for count in (2, 1):
            if len(words) > count or (count == 1 and words):
                prefix = " ".join(words[:count])
                choices.append(
                    {
                        "pattern": glob_escape(prefix) + " *",
                        "label": f"commands starting with “{prefix}”",
                    }
                )
    elif approval.tool_name == "web_fetch" and subject.strip():
        choices.append({"pattern": glob_escape(subject), "label": "this exact URL"})
        parts = urlsplit(subject)
        if parts.scheme and parts.netloc:
            site = f"{parts.scheme}://{parts.netloc}/"
            choices.append({"pattern": glob_escape(site) + "*", "label": f"this site ({site}…)"})
    label = tool_label(approval.tool_name)
    choices.append({"pattern": "", "label": f"every {label} call in this chat, whatever it does"})
    return choices


@register.filter
def no_prefix_because(approval) -> str:
    """Why "Always allow" offers no "commands starting with …" here ("" when it may)."""
    if approval.tool_name != "terminal" or not approval.subject:
        return ""
    program = program_runs_others(approval.subject)
    if program is None:
        return ""
    return f"{program} can run other programs that its options or files name"


# What plainly asks for the network: a program that fetches, or python that
# opens connections. Tools run with none, so such a call can only fail; the
# card says so before anyone allows it (a hint, not a rule: it decides nothing).
NETWORK_PROGRAMS = frozenset(
    "curl wget ssh scp sftp rsync nc ncat telnet ftp ping dig nslookup host".split()
)
NETWORK_SUBCOMMANDS = {
    "pip": {"install", "download"}, "pip3": {"install", "download"},
    "git": {"clone", "fetch", "pull", "push", "ls-remote"},
    "npm": {"install", "i", "ci"}, "apt": {"install", "update"},
    "apt-get": {"install", "update"}, "docker": {"pull", "push"},
}  # fmt: skip
NETWORK_CODE = re.compile(
    r"\b(requests\.(get|post|put|delete|head|Session)|urllib\.request|urlopen\("
    r"|http\.client|httpx\.|aiohttp|socket\.create_connection|pip install"
    r"|subprocess\.\w+\(\s*\[?\s*['\"](curl|wget|pip)\b)"
)


@register.filter
def needs_network_note(approval) -> str:
    """ "" unless the call plainly needs the network, which tools do not have."""
    subject = approval.subject or ""
    if approval.tool_name == "terminal":
        for argv in read_command_line(subject).argvs or _rough_argvs(subject):
            program = argv[0].rsplit("/", 1)[-1] if argv else ""
            if program in NETWORK_PROGRAMS or (
                len(argv) > 1 and argv[1] in NETWORK_SUBCOMMANDS.get(program, ())
            ):
                return f"{program} needs the network"
    elif approval.tool_name == "python" and NETWORK_CODE.search(subject):
        return "this code opens network connections"
    return ""


def _rough_argvs(line: str) -> list[list[str]]:
    """A line the reader could not read in full, split roughly: a hint only."""
    return [part.split() for part in re.split(r"[;&|\n]+", line) if part.split()]


@register.filter
def kept_session_note(approval) -> str:
    """What a pending call of a tool that keeps state runs in: the chat's python
    session and the calls that shaped it, as far as its rows say ("" otherwise)."""
    from django.conf import settings

    from approvals.models import ToolApproval
    from approvals.services.decisions import FRESH_TOOLS

    if approval.tool_name not in FRESH_TOOLS or not settings.STUDIO_PYTHON_SESSIONS:
        return ""
    # One query: the sessions this chat's calls ran in, the latest first.
    last = (
        ToolApproval.objects.filter(
            conversation_id=approval.conversation_id, tool_name=approval.tool_name
        )
        .exclude(interpreter_session="")
        .values("interpreter_session")
        .annotate(calls=Count("id"), since=Min("started_at"), latest=Max("started_at"))
        .order_by("-latest")
        .first()
    )
    reset = getattr(approval.conversation, "python_reset_at", None)
    idle = timezone.now() - timezone.timedelta(seconds=settings.STUDIO_PYTHON_IDLE_SECONDS)
    if last is None or last["latest"] < idle or (reset and reset > last["latest"]):
        return "Runs in this chat's python session, which starts afresh with it."
    calls = "1 earlier call" if last["calls"] == 1 else f"{last['calls']} earlier calls"
    since = timezone.localtime(last["since"])
    return (
        f"Runs in this chat's python session: {calls} since {since:%H:%M} can change what it does."
    )


@register.filter
def rules_cannot_read(approval) -> str:
    """Why no Allow pattern can vouch for a pending command line ("" when one can)."""
    if approval.tool_name != "terminal" or not approval.subject:
        return ""
    return read_command_line(approval.subject).why


@register.filter
def edit_fields(approval) -> list[dict]:
    """The editor of a pending card: one field per argument of a built-in, else JSON.

    It starts from what would run: a reviewer edits the member's edit, if any.
    """
    arguments = approval.arguments_to_run
    arguments = arguments if isinstance(arguments, dict) else {}
    editor = EDITORS.get(approval.tool_name)
    if editor and set(arguments) <= {editor[0]}:
        name, kind = editor
        return [{"name": name, "kind": kind, "value": arguments.get(name, "")}]
    return [{"name": "arguments", "kind": "json", "value": json.dumps(arguments, indent=2)}]


@register.filter
def edit_diff(approval) -> list[dict]:
    """Lines of the change a person made before the call ran ("+"/"-"/" ")."""

    def text(arguments) -> str:
        editor = EDITORS.get(approval.tool_name)
        if editor and isinstance(arguments, dict) and set(arguments) <= {editor[0]}:
            return str(arguments.get(editor[0], ""))
        return json.dumps(arguments, indent=2, sort_keys=True, ensure_ascii=False)

    before = text(approval.arguments).splitlines()
    after = text(approval.approved_arguments).splitlines()
    lines = []
    for line in difflib.unified_diff(before, after, lineterm="", n=2):
        if line.startswith(("---", "+++", "@@")):
            continue
        lines.append({"kind": line[:1], "text": line})
    return lines


@register.filter
def pending_ids(blocks) -> list[str]:
    """The approvals still waiting among a message's tool blocks."""
    return [b.approval.approval_id for b in blocks if b.approval and b.approval.is_pending]

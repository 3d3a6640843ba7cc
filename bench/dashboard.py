"""The approvals dashboard over a million rows: how long its queries and its page take.

Fills a fresh database with N approval rows spread over 120 days (tools,
outcomes, decision times, denied subjects and rules drawn at random in SQL),
then times ``dashboard_data`` + ``charts`` and the whole admin page (Django's
test client, in-process) for each period, median of several runs.

    .venv/bin/python bench/dashboard.py --rows 1000000
    .venv/bin/python bench/dashboard.py --rows 1000000 --database sqlite:////tmp/dash.sqlite3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import make_conversation, make_member, setup_django  # noqa: E402

TOOLS = ["python", "terminal", "web_fetch", "web_search", "files__read", "files__write"]

# One SELECT that makes every row (generate_series on PostgreSQL, a recursive
# CTE on SQLite); outcomes: 55 % allowed by a person, 25 % by a rule or the
# switch, 12 % denied, 5 % ended without a decision, the rest pending.
POSTGRES = """
INSERT INTO approvals_toolapproval (
  approval_id, conversation_id, run_id, requested_by_id, tool_name, tool_hints, tool_call_id,
  tool_schema, arguments, arguments_sha256, subject, approved_sha256, status, reason,
  decided_by_id, note, requested_at, decided_at, needs_review, webhook_result,
  decision_seconds, output_summary, output_sha256, decided_user_agent, rule_id)
SELECT 'b' || g, %(conversation)s, '', %(user)s, (%(tools)s)[1 + g %% 6], '[]', '',
  '{}', '{}', md5(g::text) || md5(g::text), 'cmd ' || (g %% 997), '',
  CASE WHEN r < .55 THEN 'allowed' WHEN r < .80 THEN 'allowed' WHEN r < .92 THEN 'denied'
       WHEN r < .97 THEN 'denied' ELSE 'pending' END,
  CASE WHEN r < .55 THEN 'user' WHEN r < .80 THEN 'rule' WHEN r < .92 THEN 'user'
       WHEN r < .97 THEN 'timeout' ELSE '' END,
  CASE WHEN r < .55 OR (r >= .80 AND r < .92) THEN %(user)s END, '', t,
  CASE WHEN r < .97 THEN t + interval '30 seconds' END, false, '',
  CASE WHEN r < .55 OR (r >= .80 AND r < .92) THEN (g %% 600) / 10.0 END, '', '', '',
  CASE WHEN r >= .55 AND r < .80 THEN %(rule)s END
FROM (SELECT g, random() AS r,
             now() - (g %% (120 * 24 * 60)) * interval '1 minute' AS t
      FROM generate_series(1, %(rows)s) AS g) AS s
"""

SQLITE = """
INSERT INTO approvals_toolapproval (
  approval_id, conversation_id, run_id, requested_by_id, tool_name, tool_hints, tool_call_id,
  tool_schema, arguments, arguments_sha256, subject, approved_sha256, status, reason,
  decided_by_id, note, requested_at, decided_at, needs_review, webhook_result,
  decision_seconds, output_summary, output_sha256, decided_user_agent, rule_id)
WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < %(rows)s),
     v AS (SELECT g, (abs(random()) %% 1000) / 1000.0 AS r,
                  datetime('now', '-' || (g %% (120 * 24 * 60)) || ' minutes') AS t FROM s)
SELECT 'b' || g, %(conversation)s, '', %(user)s,
  CASE g %% 6 WHEN 0 THEN 'python' WHEN 1 THEN 'terminal' WHEN 2 THEN 'web_fetch'
              WHEN 3 THEN 'web_search' WHEN 4 THEN 'files__read' ELSE 'files__write' END,
  '[]', '', '{}', '{}', printf('%%064d', g), 'cmd ' || (g %% 997), '',
  CASE WHEN r < .55 THEN 'allowed' WHEN r < .80 THEN 'allowed' WHEN r < .92 THEN 'denied'
       WHEN r < .97 THEN 'denied' ELSE 'pending' END,
  CASE WHEN r < .55 THEN 'user' WHEN r < .80 THEN 'rule' WHEN r < .92 THEN 'user'
       WHEN r < .97 THEN 'timeout' ELSE '' END,
  CASE WHEN r < .55 OR (r >= .80 AND r < .92) THEN %(user)s END, '', t,
  CASE WHEN r < .97 THEN datetime(t, '+30 seconds') END, 0, '',
  CASE WHEN r < .55 OR (r >= .80 AND r < .92) THEN (g %% 600) / 10.0 END, '', '', '',
  CASE WHEN r >= .55 AND r < .80 THEN %(rule)s END
FROM v
"""


def fill(rows: int) -> None:
    from django.db import connection

    from approvals.models import ToolRule

    user, _ = make_member("owner")
    conversation = make_conversation(user)
    rule = ToolRule.objects.create(tool="*", action="allow", hits=rows // 4)
    params = {"conversation": conversation.pk, "user": user.pk, "rows": rows, "rule": rule.pk}
    if connection.vendor == "postgresql":
        sql = POSTGRES % {**params, "tools": "ARRAY[" + ",".join(f"'{t}'" for t in TOOLS) + "]"}
    else:
        sql = SQLITE % params
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(sql)
        cursor.execute("ANALYZE")
    print(f"filled {rows:,} rows in {time.perf_counter() - started:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--database", default="postgres://postgres@127.0.0.1:5432/studio_bench_dashboard"
    )
    args = parser.parse_args()
    setup_django(args.database)
    fill(args.rows)

    from django.contrib.auth import get_user_model
    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from approvals.dashboard import charts, dashboard_data

    admin = get_user_model().objects.create_superuser("admin", "a@example.com", "pw-123456789")
    client = Client(HTTP_HOST="127.0.0.1")  # an allowed host (DEBUG is off)
    client.force_login(admin)
    print(f"database: {connection.vendor}, rows: {args.rows:,}, runs per figure: {args.runs}")
    for days in (7, 30, 90):
        data_times, page_times = [], []
        for _ in range(args.runs):
            started = time.perf_counter()
            charts(dashboard_data(days))
            data_times.append(time.perf_counter() - started)
            reset_queries()
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                response = client.get("/admin/approvals/toolapproval/dashboard/", {"days": days})
                page_times.append(time.perf_counter() - started)
            assert response.status_code == 200, response.status_code
        print(
            f"{days:>2} days: data + charts median {statistics.median(data_times) * 1000:.0f} ms, "
            f"whole page median {statistics.median(page_times) * 1000:.0f} ms "
            f"(min {min(page_times) * 1000:.0f} ms), {len(queries)} queries"
        )


if __name__ == "__main__":
    main()

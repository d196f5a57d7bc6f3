"""longrunctl's examples: one per command, shown at the end of its ``--help`` (``longrun_client.ctl``
attaches them)."""

from __future__ import annotations

COMMAND_EXAMPLES: dict[tuple[str, ...], str] = {
    ("run", "list"): "run list --tenant acme --status WAITING_USER --label team=payments",
    ("run", "create"): "run create steps --tenant acme --input '{\"steps\": 2}' --idempotency-key order-1042",
    ("run", "show"): "run show RUN_ID",
    ("run", "timeline"): "run timeline RUN_ID --follow",
    ("run", "pause"): 'run pause RUN_ID --reason "forge maintenance tonight"',
    ("run", "resume"): 'run resume RUN_ID --reason "maintenance over"',
    ("run", "retry"): 'run retry RUN_ID --reason "decide fixed in 1.4.2, deployed"',
    ("run", "cancel"): 'run cancel RUN_ID --reason "superseded by RUN_ID2"',
    ("run", "terminate"): 'run terminate RUN_ID --reason "stuck cleanup, done by hand"',
    ("run", "migrate"): 'run migrate RUN_ID --to 2 --reason "fix for the CI parser"',
    ("run", "approve"): 'run approve RUN_ID --approval-id merge:e33f2c --hash 9e3f30d5... --reason "diff reviewed"',
    ("run", "answer"): 'run answer RUN_ID which-branch --json \'"release/2.4"\' --reason "asked the team"',
    ("run", "signal"): 'run signal RUN_ID build_finished --payload \'{"ok": true}\' --id build-1742',
    ("run", "resolve"): 'run resolve RUN_ID merge_request --done --external-id 412 --reason "MR 412 on the forge"',
    ("run", "retry-action"): 'run retry-action RUN_ID merge_request --reason "branch protection fixed"',
    ("run", "attach"): 'run attach RUN_ID ci.log --media-type text/plain --reason "the failing CI log"',
    ("audit",): "audit --target RUN_ID",
    ("alerts",): "alerts --action alert.silent_run",
    ("tenant", "policy"): "tenant policy acme --tool 'forge.*' --resource 'repo:acme/*' --reason \"scope acme\"",
    ("tenant", "ceiling"): "tenant ceiling acme --tool 'forge.*' --resource 'repo:acme/*' --reason \"acme's contract\"",
    ("tenant", "limits"): 'tenant limits acme --slots 8 --token-budget 2000000 --tool "forge.*=4" --reason "acme grows"',
    ("tenant", "limits-ceiling"): 'tenant limits-ceiling acme --slots 16 --token-budget 5000000 --reason "contract"',
    ("schedule", "create"): ('schedule create vuln_scan --tenant acme --cron "0 3 * * *" --input \'{"repo": "acme/api"}\' '
                             '--overlap skip --reason "nightly scan"'),
    ("schedule", "list"): "schedule list --tenant acme",
    ("schedule", "show"): "schedule show SCHEDULE_ID",
    ("schedule", "pause"): 'schedule pause SCHEDULE_ID --reason "release freeze"',
    ("schedule", "resume"): 'schedule resume SCHEDULE_ID --reason "freeze over"',
    ("schedule", "backfill"): ('schedule backfill SCHEDULE_ID --from 2026-03-01T00:00:00Z --to 2026-03-02T00:00:00Z '
                               '--reason "the scans the outage missed"'),
    ("schedule", "delete"): 'schedule delete SCHEDULE_ID --reason "the repository was archived"',
    ("versions",): "versions",
    ("dlq", "list"): "dlq list --all",
    ("dlq", "replay"): 'dlq replay 17 --reason "schema fixed upstream"',
    ("whoami",): "whoami",
    ("token", "create"): 'token create ci-bot --permission create_runs --tenant acme --reason "the release pipeline"',
    ("token", "list"): "token list --all",
    ("token", "revoke"): 'token revoke 7 --reason "the laptop was lost"',
}
"""One example per command, shown at the end of its ``--help``."""

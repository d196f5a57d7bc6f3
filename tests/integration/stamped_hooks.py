"""A webhook provider that signs the time of sending with the body (as Stripe and Slack do), for the
gateway's replay-window tests: ``LONGRUN_WEBHOOK_PROVIDERS=acme=tests.integration.stamped_hooks:acme``."""

from __future__ import annotations

from typing import Any

from longrun.ports.webhooks import Provider, Signature, Translated


def ci_finished(payload: dict[str, Any]) -> Translated:
    return Translated(str(payload["id"]), f"ci/{payload['repo']}/{payload['ci_run_id']}",
                      f"ci_result:{payload['ci_run_id']}", {"status": payload["status"]})


acme = Provider(ci_finished, Signature("x-acme-signature", timestamp_header="x-acme-timestamp"))

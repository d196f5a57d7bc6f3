"""The forge's webhooks to longrun: a CI run finished (the wait for CI ends), or someone pushed to
the agent's branch (an approval of the old head is void). Registered as the ``forge`` provider.

The forge signs the body alone (``X-Forge-Signature``), so its deliveries carry no time: a replayed
one is absorbed by dedup on its event id."""

from __future__ import annotations

from typing import Any

from longrun.ports.webhooks import Provider, Signature, Translated


def translate(payload: dict[str, Any]) -> Translated:
    if payload.get("type") == "branch.pushed":
        # Someone else moved the branch: any approval of the old head is void.
        return Translated(str(payload["id"]), f"branch/{payload['repo']}/{payload['branch']}",
                          f"head:{payload['branch']}", {"sha": payload["sha"], "pusher": payload.get("pusher", "")})
    if payload.get("type") != "ci.finished":
        raise ValueError(f"unsupported forge event type {payload.get('type')!r}")
    ci_id = payload["ci_run_id"]
    return Translated(str(payload["id"]), f"ci/{payload['repo']}/{ci_id}", f"ci_result:{ci_id}",
                      {"status": payload["status"], "sha": payload["sha"],
                       "log_excerpt": payload.get("log_excerpt", "")})


forge = Provider(translate, Signature("x-forge-signature"))

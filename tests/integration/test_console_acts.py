"""The console's acts on a run beside approving and denying, in a real browser (Playwright driving
Debian's Chromium, as ``test_console``): an operator and approver answers a question (first with an
answer its schema refuses: the page says why and nothing is recorded), pauses, resumes and cancels a
run, terminates another, retries a failed action and migrates a run to the version that takes it over,
checking each where a person would: the run's status and timeline, its actions and their ledger rows,
and the audit log. Without the browser: each act posted without the session's CSRF token, or by a
principal without its role (or an approver the question does not name), is refused with a 403 page and
changes nothing; a hostile answer is a 4xx. An operator sends a run a signal its kind declares (first with a
payload the kind's schema refuses), and the same form posted twice records it once. Only the gateway runs:
each run stays where the act leaves it."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from playwright.async_api import expect
from sqlalchemy import text

from longrun.db import actions as ledger
from longrun.domain import PinnedVersions
from tests.integration import identities
from tests.integration.ensemble import ROOT, Ensemble, status_of
from tests.integration.runs_factory import action_failed, asking, waiting_for_event, waiting_for_signal
from tests.integration.signal_kinds import SIGNALLED
from tests.integration.test_console import SHOTS, console_page, signed_in
from tests.integration.test_console import gateway  # noqa: F401  (the fixture: a gateway, its console's URL)
from tests.integration.test_console import _csrf as csrf_of

pytestmark = pytest.mark.integration

RELEASE_PACKAGE = Path(__file__).parent / "fixtures" / "acme_release"
RELEASE_V1 = PinnedVersions(workflow="1", prompt="none", model_policy="none", tool_schemas="acme-release-1")


@pytest.mark.long
async def test_an_operator_answers_steers_retries_and_migrates_runs_in_the_console(
        clean, engine, services, tmp_path) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    # Given a gateway that also deploys both versions of acme_release, an operator and approver of acme,
    # and runs of acme: one asking a question, two waiting for CI, one whose merge request FAILED, and
    # an acme_release run of version 1 (no worker: each run stays where the act leaves it)
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway",
                   PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "shared"), str(RELEASE_PACKAGE)]),
                   LONGRUN_RUN_KINDS="longrun.workflows:builtin,acme_release:V1,acme_release:V2")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    token = await identities.token(engine, "ops-ana", "approver", tenants=("acme",))
    asked = (await asking(engine, question_id="module")).snapshot.run_id
    steered = (await waiting_for_event(engine, "ci/acme/payments/1")).snapshot.run_id
    ended = (await waiting_for_event(engine, "ci/acme/payments/2")).snapshot.run_id
    failed = (await action_failed(engine, logical_action="open_mr")).snapshot.run_id
    release = (await waiting_for_event(engine, "ci/acme/release/1", kind="acme_release", versions=RELEASE_V1,
                                       goal={"release": "2026.12"})).snapshot.run_id
    base = f"{ensemble.gateway_url}/console"

    async with console_page(ensemble.gateway_url, token) as page:

        # When she answers the question with a value its schema refuses, the page says why and nothing changes
        await page.goto(f"{base}/runs/{asked}")
        await expect(page.locator("#question-text")).to_have_text("Which module?")
        await page.fill("#question textarea[name=answer]", '{"module": 7}')
        await page.fill("#question input[name=reason]", "asked the team")
        await page.click("#answer")
        await expect(page.locator("#error")).to_contain_text("does not satisfy its schema")
        await expect(page.locator("#error")).to_contain_text("module")
        await expect(page.locator("#status")).to_have_text("WAITING_USER")
        await page.screenshot(path=SHOTS / "7-answer-refused.png", full_page=True)
        # and then with one it accepts: recorded as hers, and the run goes back to work
        await expect(page.locator("#question input[name=reason]")).to_have_value("asked the team")
        await page.fill("#question textarea[name=answer]", '{"module": "payments-core"}')
        await page.click("#answer")
        await expect(page.locator("#notice")).to_have_text("Answer recorded.")
        await expect(page.locator("#status")).to_have_text("READY")
        await expect(page.locator("#timeline")).to_contain_text("payments-core")

        # When she pauses a run waiting for CI, resumes it, then cancels it
        await page.goto(f"{base}/runs/{steered}")
        for act, status in (("pause", "PAUSED"), ("resume", "WAITING_EVENT"), ("cancel", "CANCELLING")):
            await page.fill("#steer input[name=reason]", f"{act} for the release freeze")
            await page.click(f"#{act}")
            # Then the page shows the run's new status, and the timeline the act and its reason
            await expect(page.locator("#status")).to_have_text(status)
            await expect(page.locator("#timeline")).to_contain_text(f"{act} for the release freeze")
        await page.screenshot(path=SHOTS / "8-paused-resumed-cancelled.png", full_page=True)

        # When she terminates another
        await page.goto(f"{base}/runs/{ended}")
        await page.fill("#steer input[name=reason]", "superseded")
        await page.click("#terminate")
        await expect(page.locator("#notice")).to_have_text("Terminated.")
        await expect(page.locator("#status")).to_have_text("TERMINATED")
        await expect(page.locator("#steer")).to_have_count(0)

        # When she retries the merge request that FAILED
        await page.goto(f"{base}/runs/{failed}")
        await expect(page.locator("#retry-action-open_mr")).to_contain_text("failed")
        await page.fill("#retry-action-open_mr input[name=reason]", "branch unprotected")
        await page.click("#retry-action-open_mr button")
        # Then the action is RETRYABLE in the run and in the ledger, and the run back to work
        await expect(page.locator("#notice")).to_have_text("The action is sent again under its key.")
        row = page.locator("#actions tr", has_text="open_mr")
        await expect(row.locator("td.status")).to_have_text("RETRYABLE")
        await expect(row.locator("td.ledger")).to_have_text("RETRYABLE")
        await expect(page.locator("#status")).to_have_text("READY")

        # When she moves the release run to version 2, which takes over version 1's runs
        await page.goto(f"{base}/runs/{release}")
        await page.select_option("#migrate select[name=to_version]", "2")
        await page.fill("#migrate input[name=reason]", "release 2 deployed")
        await expect(page.locator("#migrate option")).to_have_text(["2"])
        await page.click("#migrate button")
        await expect(page.locator("#notice")).to_have_text("Moved to the new version.")
        await expect(page.locator("dd", has_text="acme_release 2")).to_have_count(1)
        await expect(page.locator("#timeline")).to_contain_text("release 2 deployed")
        await expect(page.locator("#migrate")).to_have_count(0)  # no deployed version takes over version 2
        await page.screenshot(path=SHOTS / "9-migrated.png", full_page=True)

        # And the audit log shows each act as hers, with its reason
        await page.goto(f"{base}/audit?actor=ops-ana")
        for reason in ("asked the team", "pause for the release freeze", "resume for the release freeze",
                       "cancel for the release freeze", "superseded", "branch unprotected",
                       "release 2 deployed"):
            await expect(page.locator("table")).to_contain_text(reason)
        await page.screenshot(path=SHOTS / "10-audit.png", full_page=True)
    async with engine.connect() as conn:
        audited = (await conn.execute(text("SELECT actor, action, target FROM audit_log ORDER BY id"))).all()
        row = next(r for r in await ledger.for_run(conn, failed) if r.logical_action == "open_mr")
        pinned = (await conn.execute(text("SELECT workflow_version FROM runs WHERE run_id = :r"),
                                     {"r": release})).scalar()
    assert [tuple(a) for a in audited] == [
        ("ops-ana", "answer", asked), ("ops-ana", "pause", steered), ("ops-ana", "resume", steered),
        ("ops-ana", "cancel", steered), ("ops-ana", "terminate", ended), ("ops-ana", "retry-action", failed),
        ("ops-ana", "migrate", release)]
    assert row.status == "RETRYABLE" and pinned == "2"


async def test_an_operator_sends_a_signal_in_the_console_checked_against_its_schema_and_recorded_once(
        clean, engine, services, tmp_path) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    # Given a gateway that deploys the kind that waits for the signal "ship", and a run of it waiting
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway",
                   LONGRUN_RUN_KINDS="longrun.workflows:builtin,tests.integration.signal_kinds:SIGNALLED")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    token = await identities.token(engine, "otto", "operator", tenants=("acme",))
    run_id = (await waiting_for_signal(engine, "ship", kind=SIGNALLED.name, versions=SIGNALLED.versions)).snapshot.run_id
    base = f"{ensemble.gateway_url}/console"

    async with console_page(ensemble.gateway_url, token) as page:
        await page.goto(f"{base}/runs/{run_id}")
        # Then the page offers the signals the kind declares, and has received none
        await expect(page.locator("#signals select[name=name] option")).to_have_text(["note", "ship"])
        await expect(page.locator("#signals")).to_contain_text("None received.")

        # When he sends "ship" with a payload its schema refuses, the page says why and nothing is recorded
        await page.select_option("#signals select[name=name]", "ship")
        await page.fill("#signals textarea[name=payload]", '{"by": 7}')
        await page.fill("#signals input[name=reason]", "release approved in the meeting")
        await page.click("#send-signal")
        await expect(page.locator("#error")).to_contain_text("ship")
        await expect(page.locator("#status")).to_have_text("WAITING_EVENT")
        await expect(page.locator("#received-signals")).to_have_count(0)
        # and then with one it accepts: recorded as his, and it wakes the run
        await page.fill("#signals textarea[name=payload]", '{"by": "otto"}')
        form = {name: await page.locator(f"#signals input[name={name}]").get_attribute("value")
                for name in ("csrf", "signal_id")}
        await page.click("#send-signal")
        await expect(page.locator("#notice")).to_have_text("Signal recorded.")
        await expect(page.locator("#status")).to_have_text("READY")
        await expect(page.locator("#received-signals tr", has_text="ship")).to_contain_text('{"by": "otto"}')
        await page.screenshot(path=SHOTS / "11-signalled.png", full_page=True)

        # When the same form is posted again (a double submit), under the same signal id
        again = await page.request.post(f"{base}/runs/{run_id}/signals", form={
            **form, "name": "ship", "payload": '{"by": "otto"}', "reason": "release approved in the meeting"})
        assert again.ok
        await page.goto(f"{base}/runs/{run_id}")
        # Then the run holds the signal once
        await expect(page.locator("#received-signals tr", has_text="ship")).to_have_count(1)
    async with engine.connect() as conn:
        audited = (await conn.execute(text("SELECT actor, action, target FROM audit_log ORDER BY id"))).all()
        kept = (await conn.execute(text("SELECT count(*) FROM run_events WHERE run_id = :r AND type = "
                                        "'signal.received'"), {"r": run_id})).scalar()
    assert kept == 1
    assert [tuple(a) for a in audited] == [("otto", "signal", run_id)]


STEERS = ("pause", "resume", "cancel", "terminate")


async def test_each_run_act_without_the_session_csrf_token_is_refused_and_changes_nothing(
        clean, engine, gateway) -> None:
    # Given an approver and operator signed in, and runs of acme asking a question, waiting for CI and
    # holding a FAILED action
    token = await identities.token(engine, "ops-ana", "approver", tenants=("acme",))
    asked = (await asking(engine, question_id="module")).snapshot.run_id
    waiting = (await waiting_for_event(engine, "ci/acme/payments/1")).snapshot.run_id
    failed = (await action_failed(engine, logical_action="open_mr")).snapshot.run_id
    forms = [(asked, "answer", {"question_id": "module", "answer": '{"module": "core"}'}),
             (failed, "retry-action", {"logical_action": "open_mr"}), (waiting, "migrate", {"to_version": "2"}),
             (waiting, "signals", {"signal_id": "s-1", "name": "ship", "payload": '{"by": "ana"}'}),
             *((waiting, act, {}) for act in STEERS)]
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, token)
        for run_id, act, fields in forms:
            # When each act's form is posted without the CSRF token, or with another session's
            missing = await console.post(f"/runs/{run_id}/{act}", data={**fields, "reason": "r"})
            forged = await console.post(f"/runs/{run_id}/{act}", data={**fields, "reason": "r", "csrf": "0" * 64})
            # Then both are refused, saying why, under the console's security headers
            assert (missing.status_code, forged.status_code) == (403, 403), act
            assert "CSRF" in missing.text and "CSRF" in forged.text
            assert "frame-ancestors 'none'" in forged.headers["content-security-policy"]
        # And with the token, a hostile answer (nested past the API's depth, not JSON, holding NUL) is a 4xx too
        page = await console.get(f"/runs/{asked}")
        for hostile in ("[" * 100 + "]" * 100, "{", '"\u0000"'):
            refused = await console.post(f"/runs/{asked}/answer", data={
                "question_id": "module", "answer": hostile, "reason": "r", "csrf": csrf_of(page)})
            assert refused.status_code in (400, 422) and 'id="error"' in refused.text, (hostile, refused.text)
    # And nothing changed: each run where it was, nothing audited
    assert [await status_of(engine, r) for r in (asked, waiting, failed)] == [
        "WAITING_USER", "WAITING_EVENT", "NEEDS_ATTENTION"]
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM audit_log"))).scalar() == 0


async def test_a_principal_without_the_role_of_a_run_act_is_refused_with_403_and_offered_no_form(
        clean, engine, gateway) -> None:
    # Given a viewer and an operator of acme, an approver the question does not name, and runs of acme
    viewer = await identities.token(engine, "val", "viewer", tenants=("acme",))
    operator = await identities.token(engine, "otto", "operator", tenants=("acme",))
    stranger = await identities.token(engine, "ops-carl", "approver", tenants=("acme",))
    asked = (await asking(engine, question_id="module")).snapshot.run_id
    owned = (await asking(engine, question_id="module", owner="user_42")).snapshot.run_id
    waiting = (await waiting_for_event(engine, "ci/acme/payments/1")).snapshot.run_id
    failed = (await action_failed(engine, logical_action="open_mr")).snapshot.run_id
    answer = {"question_id": "module", "answer": '{"module": "core"}', "reason": "r"}
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, viewer)
        page = await console.get(f"/runs/{waiting}")
        # Then a viewer is offered no act, and each one posted is refused with 403 naming the role
        assert 'id="steer"' not in page.text and 'id="migrate"' not in page.text
        for run_id, act, fields in [(asked, "answer", answer),
                                    (failed, "retry-action", {"logical_action": "open_mr", "reason": "r"}),
                                    (waiting, "migrate", {"to_version": "2", "reason": "r"}),
                                    (waiting, "signals", {"signal_id": "s-1", "name": "ship", "reason": "r"}),
                                    *((waiting, act, {"reason": "r"}) for act in STEERS)]:
            refused = await console.post(f"/runs/{run_id}/{act}", data={**fields, "csrf": csrf_of(page)})
            assert refused.status_code == 403 and "val may not" in refused.text, (act, refused.text)
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, operator)
        page = await console.get(f"/runs/{asked}")
        # And an operator, who may steer, may not answer: it needs the approver role
        assert 'id="steer"' in page.text and 'id="answer"' not in page.text
        refused = await console.post(f"/runs/{asked}/answer", data={**answer, "csrf": csrf_of(page)})
        assert refused.status_code == 403 and "needs the role approver" in refused.text
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, stranger)
        page = await console.get(f"/runs/{owned}")
        # And an approver the question does not name is offered no answer and refused one
        assert 'id="not-yours"' in page.text and 'id="answer"' not in page.text
        refused = await console.post(f"/runs/{owned}/answer", data={**answer, "csrf": csrf_of(page)})
        assert refused.status_code == 403 and "only user_42 may answer" in refused.text
    assert [await status_of(engine, r) for r in (asked, owned, waiting, failed)] == [
        "WAITING_USER", "WAITING_USER", "WAITING_EVENT", "NEEDS_ATTENTION"]
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM audit_log"))).scalar() == 0

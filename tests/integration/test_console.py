"""The web console in a real browser (Playwright driving Debian's Chromium, /usr/bin/chromium): an
approver signs in with a named token, finds the run waiting for approval, sees the hash it approves,
approves it and watches the run complete; an operator of another tenant finds nothing of it.
Screenshots are kept in var/test-artifacts/console/. Without the browser: a POST without the
session's CSRF token is refused and changes nothing, another tenant's operator can neither read nor
act on a run, nor an approver the approval does not name decide it, an action in doubt is resolved
and a quarantined message replayed as the signed-in principal, and revoking the token ends the
session, and so does signing out, for a copy of the cookie too, which holds no token. Signing in at
an OIDC provider (the authorization-code flow) is driven in the browser too, and so are signing in
and out through a TLS-terminating proxy (``tls_proxy``) in front of the gateway, as an ingress is:
the cookie is ``__Host-`` and Secure, every answer and redirect stays on https, the cookie holds no
token, and a copy of it kept from before sign-out is refused."""

from __future__ import annotations

import base64
import contextlib
import re
from collections.abc import AsyncIterator
from urllib.parse import urljoin

import httpx
import pytest
from playwright.async_api import Page, async_playwright, expect
from sqlalchemy import text

from longrun.config import Settings
from longrun.db import console_sessions, quarantine, tokens
from longrun.identity import Authenticator, Vouched
from longrun.principals import BOOTSTRAP, Principal
from tests.fixtures import eventually
from tests.integration import identities, oidc_provider, tls_proxy
from tests.integration.bus_helpers import wakeup
from tests.integration.ensemble import ROOT, Ensemble, goal, new_key, publish_create, run_id_for, status_of
from tests.integration.runs_factory import action_unknown, waiting_for_user

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
SHOTS = ROOT / "var" / "test-artifacts" / "console"


async def sign_in(page: Page, base: str, token: str) -> None:
    await page.goto(f"{base}/console/")
    await expect(page).to_have_url(re.compile(r"/console/sign-in"))
    await page.fill("#token", token)
    await page.click("button[type=submit]")
    await expect(page).to_have_url(re.compile(r"/console/runs$"))


@contextlib.asynccontextmanager
async def console_page(base: str, token: str) -> AsyncIterator[Page]:
    """A page of a headless Chromium signed in to the console at ``base`` with ``token``; the browser
    closes after."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = await (await browser.new_context()).new_page()
            await sign_in(page, base, token)
            yield page
        finally:
            await browser.close()


@pytest.mark.long
async def test_an_approver_approves_in_the_console_and_watches_the_run_complete(
        clean, engine, bus, services, tmp_path) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    # Given the live services, a run of tenant acme waiting for user_42's approval, and two named
    # tokens: user_42 approving for acme, and an operator of globex
    ensemble = Ensemble(services, tmp_path)
    ensemble.start_forge()
    ensemble.start_services("gateway", "scheduler", "worker", "relay")
    await ensemble.configure_forge()
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    approver = await identities.token(engine, "user_42", "approver", tenants=("acme",))
    stranger = await identities.token(engine, "olga", "operator", "approver", tenants=("globex",))
    key = new_key()
    await publish_create(bus, tenant="acme", key=key, input_=goal("console"))
    run_id = await eventually(lambda: run_id_for(engine, "acme", key), what="the run")
    approved_hash = await eventually(lambda: _asked_hash(engine, run_id), timeout=60, what="approval asked")

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            # When the approver signs in and searches for runs waiting for a person
            page = await (await browser.new_context()).new_page()
            await sign_in(page, ensemble.gateway_url, approver)
            await page.select_option("select[name=status]", "WAITING_USER")
            await page.click("#search button[type=submit]")
            await page.click(f"a:text-is('{run_id}')")
            # Then the run page shows exactly what is approved and its hash
            await expect(page.locator("#approval-hash")).to_have_text(approved_hash)
            await expect(page.locator("#approval-subject")).to_contain_text("merge agent/payment-sdk-v5-console")
            await page.screenshot(path=SHOTS / "1-approval-pending.png", full_page=True)
            # When they approve it
            await page.fill("#approval input[name=reason]", "reviewed the diff")
            await page.click("#approve")
            await expect(page.locator("#notice")).to_have_text("Approved.")
            # Then the page follows the run to its completion by itself
            await expect(page.locator("#status")).to_have_text("COMPLETED", timeout=60_000)
            await expect(page.locator("#timeline")).to_contain_text("approved by user_42")
            await page.screenshot(path=SHOTS / "2-completed.png", full_page=True)

            # And an operator of another tenant finds nothing of it: not in a search, not at its URL
            other = await (await browser.new_context()).new_page()
            await sign_in(other, ensemble.gateway_url, stranger)
            await expect(other.locator("#no-runs")).to_be_visible()
            await other.screenshot(path=SHOTS / "3-other-tenant-search.png", full_page=True)
            answer = await other.goto(f"{ensemble.gateway_url}/console/runs/{run_id}")
            assert answer is not None and answer.status == 404
            await expect(other.locator("#error")).to_have_text(f"No run {run_id}.")
            await other.screenshot(path=SHOTS / "4-other-tenant-run.png", full_page=True)
        finally:
            await browser.close()
    assert await status_of(engine, run_id) == "COMPLETED"
    async with engine.connect() as conn:
        actors = (await conn.execute(text("SELECT actor FROM audit_log WHERE target = :r AND action = 'approve'"),
                                     {"r": run_id})).scalars().all()
    assert actors == ["user_42"]


@pytest.fixture
async def gateway(services, tmp_path) -> str:  # type: ignore[no-untyped-def]
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    return f"{ensemble.gateway_url}/console"


async def signed_in(console: httpx.AsyncClient, token: str) -> None:
    answer = await console.post("/sign-in", data={"token": token, "csrf": _csrf(await console.get("/sign-in"))})
    assert answer.status_code == 303, answer.text


async def test_a_post_without_the_session_csrf_token_is_refused_and_changes_nothing(clean, engine, gateway) -> None:
    # Given a signed-in console session and a run waiting for approval
    token = await identities.token(engine, "user_42", "approver", tenants=("acme",))
    run_id = (await waiting_for_user(engine, approval_id="a1", approved_hash="h1")).snapshot.run_id
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, token)
        decision = {"approval_id": "a1", "approved_hash": "h1", "reason": "ok"}
        # When a form is posted without the CSRF token, or with another session's
        missing = await console.post(f"/runs/{run_id}/approve", data=decision)
        forged = await console.post(f"/runs/{run_id}/approve", data={**decision, "csrf": "0" * 64})
        # Then both are refused and the run still waits
        assert (missing.status_code, forged.status_code) == (403, 403)
        assert "CSRF" in missing.text
        assert await status_of(engine, run_id) == "WAITING_USER"
        # while the same form with the session's token is taken
        page = await console.get(f"/runs/{run_id}")
        taken = await console.post(f"/runs/{run_id}/approve", data={**decision, "csrf": _csrf(page)})
        assert taken.status_code == 303, taken.text
    # And signing in is refused without the token of the sign-in page's session
    async with httpx.AsyncClient(base_url=gateway) as fresh:
        await fresh.get("/sign-in")
        assert (await fresh.post("/sign-in", data={"token": token})).status_code == 403


async def test_a_runs_page_lists_its_children_and_a_childs_page_links_its_parent(clean, engine, gateway) -> None:
    # Given a run with a child named c0 (linked as a parent's step links the child it starts)
    parent = (await waiting_for_user(engine, approval_id="a1", approved_hash="h1")).snapshot.run_id
    child = (await waiting_for_user(engine, approval_id="a2", approved_hash="h2")).snapshot.run_id
    async with engine.begin() as conn:
        await conn.execute(text("INSERT INTO children (child_run_id, parent_run_id, name, on_parent_cancel) "
                                "VALUES (:c, :p, 'c0', 'cancel')"), {"c": child, "p": parent})
    token = await identities.token(engine, "user_42", "viewer", tenants=("acme",))
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, token)
        parent_page, child_page = (await console.get(f"/runs/{parent}")).text, (await console.get(f"/runs/{child}")).text
    # Then the parent's page lists the child with its status and a link, and the child's links its parent
    assert 'id="children"' in parent_page and f'/console/runs/{child}"' in parent_page and "WAITING_USER" in parent_page
    assert 'id="parent"' in child_page and f'/console/runs/{parent}"' in child_page and "<code>c0</code>" in child_page
    assert 'id="children"' not in child_page


async def test_an_operator_of_another_tenant_can_neither_find_nor_read_nor_act_on_a_run(
        clean, engine, gateway) -> None:
    # Given a run of acme waiting for approval and an approver of globex signed in
    run_id = (await waiting_for_user(engine, approval_id="a1", approved_hash="h1")).snapshot.run_id
    token = await identities.token(engine, "user_42", "approver", "operator", tenants=("globex",))
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, token)
        listing = await console.get("/runs", params={"tenant_id": "acme"})
        page = await console.get(f"/runs/{run_id}")
        acted = await console.post(f"/runs/{run_id}/approve", data={
            "approval_id": "a1", "approved_hash": "h1", "reason": "ok", "csrf": _csrf(listing)})
        live = await console.get(f"/runs/{run_id}/stream")
    # Then the search shows nothing, the run is not found, and approving it changes nothing
    assert listing.status_code == 200 and run_id not in listing.text and 'id="no-runs"' in listing.text
    assert (page.status_code, acted.status_code, live.status_code) == (404, 404, 404)
    assert await status_of(engine, run_id) == "WAITING_USER"


async def test_an_approver_the_approval_does_not_name_is_refused_and_nothing_changes(clean, engine, gateway) -> None:
    # Given a run waiting for user_42's approval and another approver of its tenant signed in
    run_id = (await waiting_for_user(engine, approval_id="a1", approved_hash="h1")).snapshot.run_id
    token = await identities.token(engine, "ops-carl", "approver", tenants=("acme",))
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, token)
        page = await console.get(f"/runs/{run_id}")
        # When he approves it all the same
        acted = await console.post(f"/runs/{run_id}/approve", data={
            "approval_id": "a1", "approved_hash": "h1", "reason": "ok", "csrf": _csrf(page)})
    # Then the page offered him no buttons, the approval is refused, and the run still waits
    assert 'id="not-yours"' in page.text and 'id="approve"' not in page.text
    assert acted.status_code == 403 and "only user_42 may decide" in acted.text
    assert await status_of(engine, run_id) == "WAITING_USER"


async def test_an_action_in_doubt_is_resolved_in_the_console_as_the_signed_in_principal(
        clean, engine, gateway) -> None:
    # Given a run whose merge request is in doubt, and an operator of its tenant signed in
    run_id = (await action_unknown(engine, logical_action="open_mr")).snapshot.run_id
    token = await identities.token(engine, "ops-anna", "operator", tenants=("acme",))
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, token)
        page = await console.get(f"/runs/{run_id}")
        assert 'id="resolve-open_mr"' in page.text
        # When she says it was done, with the forge's id and receipt
        answer = await console.post(f"/runs/{run_id}/resolve", data={
            "logical_action": "open_mr", "outcome": "confirmed", "external_id": "mr-9",
            "receipt": '{"number": 9}', "reason": "found it on the forge", "csrf": _csrf(page)})
        assert answer.status_code == 303, answer.text
        # Then the action is confirmed, recorded as hers
        shown = await console.get(answer.headers["location"].removeprefix("/console"))
    assert "Resolution recorded." in shown.text and "mr-9" in shown.text
    async with engine.connect() as conn:
        actors = (await conn.execute(text("SELECT actor FROM audit_log WHERE target = :r AND action = 'resolve'"),
                                     {"r": run_id})).scalars().all()
    assert actors == ["ops-anna"]


async def test_the_quarantine_is_replayed_from_the_console_by_an_operator_of_every_tenant(
        clean, engine, gateway) -> None:
    # Given a quarantined message whose consumer was since fixed, and one that is still malformed
    good = wakeup("run-q", "after-fix")
    async with engine.begin() as conn:
        good_id = await quarantine.put(conn, owner="worker", queue="longrun.worker.p3",
                                       body=good.model_dump_json().encode(), headers={}, message_id=good.event_id,
                                       error_code="handler_error", reason="KeyError: 'x'", attempts=5)
        bad_id = await quarantine.put(conn, owner="worker", queue="longrun.worker.p3", body=b"{broken", headers={},
                                      message_id="raw", error_code="decode_error", reason="body is not JSON",
                                      attempts=1)
    oncall = await identities.token(engine, "ops-oncall", "operator")
    tenant_operator = await identities.token(engine, "ops-acme", "operator", tenants=("acme",))
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, oncall)
        listed = await console.get("/quarantine")
        assert "KeyError: &#39;x&#39;" in listed.text and "body is not JSON" in listed.text
        # When the on-call operator replays both
        refused = await console.post(f"/quarantine/{bad_id}/replay", data={"reason": "again", "csrf": _csrf(listed)})
        replayed = await console.post(f"/quarantine/{good_id}/replay",
                                      data={"reason": "consumer fixed", "csrf": _csrf(listed)})
        # Then the malformed one is refused, saying why, and the other is replayed as theirs
        assert refused.status_code == 409 and "still invalid" in refused.text
        assert replayed.status_code == 303, replayed.text
    async with engine.connect() as conn:
        audit = (await conn.execute(text("SELECT actor, action, target FROM audit_log"))).all()
    assert [tuple(a) for a in audit] == [("ops-oncall", "quarantine.replay", str(good_id))]
    # And an operator of one tenant may not see the quarantine, whose messages are no one tenant's
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, tenant_operator)
        assert (await console.get("/quarantine")).status_code == 403


async def test_revoking_the_token_ends_its_console_session(clean, engine, gateway) -> None:
    # Given an operator signed in with a named token
    async with engine.begin() as conn:
        stored, secret = await tokens.create(conn, name="ops-ben", roles=("viewer",), tenants=("acme",),
                                             created_by="tests")
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, secret)
        assert (await console.get("/runs")).status_code == 200
        # When the token is revoked
        async with engine.begin() as conn:
            await tokens.revoke(conn, stored.id)
        # Then the next page sends them to sign in again, saying why, and the session is gone
        ended = await console.get("/runs")
        assert (ended.status_code, ended.headers["location"]) == (303, "/console/sign-in?notice=ended")
        assert "no longer accepted" in (await console.get(ended.headers["location"].removeprefix("/console"))).text
        assert (await console.get("/runs")).headers["location"] == "/console/sign-in"


async def test_an_operator_signs_in_at_the_identity_provider_with_the_authorization_code_flow(
        clean, engine, services, tmp_path) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    # Given an identity provider where alice is an approver of acme, and a gateway whose console is its client
    user = {"sub": "alice", "roles": ["approver"], "tenants": ["acme"]}
    async with oidc_provider.serving(client_id="longrun-console", client_secret="console-secret",
                                     audience="longrun-api", user=user) as provider:
        ensemble = Ensemble(services, tmp_path)
        ensemble.start("gateway", "longrun.services.gateway", **provider.gateway_env())
        await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
        run_id = (await waiting_for_user(engine, approval_id="a1", approved_hash="h1")).snapshot.run_id
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                # When she chooses to sign in at the provider
                page = await browser.new_page()
                await page.goto(f"{ensemble.gateway_url}/console/sign-in")
                await page.click("#oidc")
                # Then she is back in the console, signed in as herself, seeing her tenant's runs
                await expect(page).to_have_url(re.compile(r"/console/runs$"))
                await expect(page.locator("#subject")).to_have_text(f"{provider.url}|alice")
                await expect(page.locator("#runs")).to_contain_text(run_id)
                await page.screenshot(path=SHOTS / "5-signed-in-at-the-identity-provider.png", full_page=True)
            finally:
                await browser.close()
        # And a callback that this browser did not start is refused
        async with httpx.AsyncClient(base_url=f"{ensemble.gateway_url}/console") as console:
            forged = await console.get("/oidc/callback", params={"code": "stolen", "state": "guessed"})
        assert forged.status_code == 403 and "not started from this browser" in forged.text


def _csrf(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert found, page.text
    return found.group(1)


async def _asked_hash(engine, run_id: str) -> str | None:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        return (await conn.execute(text(
            "SELECT snapshot->'wait'->>'approved_hash' FROM runs WHERE run_id = :r AND status = 'WAITING_USER'"),
            {"r": run_id})).scalar()



async def test_every_console_answer_carries_the_security_headers_and_its_inline_code_the_nonce(
        clean, engine, gateway) -> None:
    token = await identities.token(engine, "user_42", "approver", tenants=("acme",))
    run_id = (await waiting_for_user(engine, approval_id="a1", approved_hash="h1")).snapshot.run_id
    async with httpx.AsyncClient(base_url=gateway) as console:
        answers = [await console.get("/"), await console.get("/sign-in"), await console.get("/no-such-page")]
        await signed_in(console, token)
        answers += [await console.get("/runs"), await console.get(f"/runs/{run_id}"),
                    await console.get("/runs/no-such-run/stream"), await console.get("/audit")]
    nonces = set()
    for answer in answers:
        csp = answer.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, answer.url
        assert (answer.headers["x-content-type-options"], answer.headers["referrer-policy"],
                answer.headers["cache-control"]) == ("nosniff", "no-referrer", "no-store"), answer.url
        nonce = re.search(r"'nonce-([^']+)'", csp)
        assert nonce is not None
        nonces.add(nonce.group(1))
        for tag in re.findall(r"<(?:script|style)[^>]*>", answer.text):
            assert f'nonce="{nonce.group(1)}"' in tag, (answer.url, tag)
    assert len(nonces) == len(answers)  # a nonce is drawn for each answer


async def test_behind_a_trusted_tls_proxy_the_session_cookie_is_host_only_and_secure(
        clean, engine, services, tmp_path) -> None:
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway", LONGRUN_FORWARDED_ALLOW_IPS="127.0.0.1")
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    token = await identities.token(engine, "user_42", "approver", tenants=("acme",))
    https = {"x-forwarded-proto": "https"}
    async with httpx.AsyncClient(base_url=f"{ensemble.gateway_url}/console") as console:
        page = await console.get("/sign-in", headers=https)
        cookie = page.headers["set-cookie"]
        assert cookie.startswith("__Host-longrun_console=") and "Secure" in cookie and "Path=/;" in cookie
        jar = {"cookie": cookie.split(";")[0]}
        signed = await console.post("/sign-in", headers={**https, **jar}, data={"token": token, "csrf": _csrf(page)})
        assert signed.status_code == 303, signed.text
        session = {"cookie": signed.headers["set-cookie"].split(";")[0]}
        assert (await console.get("/runs", headers={**https, **session})).status_code == 200
        # The same cookie over plain HTTP is not the session's: the console asks to sign in
        assert (await console.get("/runs", headers=session)).status_code == 303


async def test_a_forwarded_scheme_from_an_untrusted_peer_is_ignored(clean, gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway) as console:
        page = await console.get("/sign-in", headers={"x-forwarded-proto": "https"})
    assert page.headers["set-cookie"].startswith("longrun_console=") and "Secure" not in page.headers["set-cookie"]


async def test_a_copy_of_the_cookie_kept_from_before_sign_out_is_refused(clean, engine, gateway) -> None:
    # Given an operator signed in, and a copy of their session cookie
    token = await identities.token(engine, "user_42", "approver", tenants=("acme",))
    run_id = (await waiting_for_user(engine, approval_id="a1", approved_hash="h1")).snapshot.run_id
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, token)
        copy = dict(console.cookies)
        page = await console.get(f"/runs/{run_id}")
        assert page.status_code == 200
        # When they sign out
        out = await console.post("/sign-out", data={"csrf": _csrf(page)})
        assert (out.status_code, out.headers["location"]) == (303, "/console/sign-in?notice=signed-out")
    # Then the copy, replayed, is a visitor not signed in: sent to sign in, shown nothing, refused a POST
    async with httpx.AsyncClient(base_url=gateway, cookies=copy) as replay:
        shown = await replay.get(f"/runs/{run_id}")
        acted = await replay.post(f"/runs/{run_id}/approve", data={
            "approval_id": "a1", "approved_hash": "h1", "reason": "ok", "csrf": _csrf(page)})
    assert (shown.status_code, shown.headers["location"]) == (303, "/console/sign-in")
    assert acted.status_code == 401 and run_id not in acted.text
    assert await status_of(engine, run_id) == "WAITING_USER"
    async with engine.connect() as conn:
        kept = (await conn.execute(text("SELECT principal->>'subject', ended_at IS NOT NULL FROM console_sessions"))
                ).all()
    assert [tuple(k) for k in kept] == [("user_42", True)]


async def test_the_session_keeps_no_token_and_expired_sessions_go_at_a_sign_in(clean, engine, gateway) -> None:
    # Given a session that expired, kept from an earlier sign-in
    token = await identities.token(engine, "user_42", "approver", tenants=("acme",))
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, token)
        old = dict(console.cookies)
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE console_sessions SET expires_at = now() - interval '1 second'"))
    async with httpx.AsyncClient(base_url=gateway, cookies=old) as stale:
        assert (await stale.get("/runs")).headers["location"] == "/console/sign-in"
    # When the operator signs in again
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, token)
        cookie = console.cookies["longrun_console"]
    # Then the expired session is gone, and neither the cookie nor the table holds the token
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT * FROM console_sessions"))).mappings().all()
    assert len(rows) == 1 and rows[0]["expires_at"] > rows[0]["created_at"]
    assert rows[0]["principal"]["subject"] == "user_42" and rows[0]["token_id"] is not None
    for held in (str(dict(rows[0])), cookie, _decoded(cookie)):
        assert token not in held and token.removeprefix(tokens.SECRET_PREFIX) not in held


async def test_signing_in_and_out_through_a_tls_terminating_proxy(clean, engine, services, tmp_path) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    # Given the gateway behind a TLS-terminating proxy that it trusts to say the scheme, and a run of acme
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway", LONGRUN_FORWARDED_ALLOW_IPS=tls_proxy.HOST)
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    token = await identities.token(engine, "user_42", "approver", tenants=("acme",))
    run_id = (await waiting_for_user(engine, approval_id="a1", approved_hash="h1")).snapshot.run_id
    async with tls_proxy.serving(ensemble.gateway_port) as proxy, async_playwright() as playwright:
        # Chromium trusts the proxy's one certificate by its public key's hash: nothing else is let through
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=[f"--ignore-certificate-errors-spki-list={proxy.spki_sha256()}"])
        try:
            context = await browser.new_context()
            page = await context.new_page()
            visited: list[str] = []
            page.on("response", lambda r: visited.extend(
                [r.url, *([urljoin(r.url, r.headers["location"])] if "location" in r.headers else [])]))
            # When the approver signs in at the proxy's https address
            await sign_in(page, proxy.url, token)
            await expect(page.locator("#runs")).to_contain_text(run_id)
            await page.screenshot(path=SHOTS / "6-signed-in-through-tls.png", full_page=True)
            # Then every answer and every redirect was https, and the session cookie is __Host- and Secure
            assert visited and all(url.startswith(f"{proxy.url}/") for url in visited), visited
            (cookie,) = [c for c in await context.cookies() if c["name"].startswith("__Host-")]
            assert (cookie["name"], cookie["secure"], cookie["httpOnly"], cookie["path"]) == (
                "__Host-longrun_console", True, True, "/")
            # And the cookie, decoded, holds no bearer token
            for held in (cookie["value"], _decoded(cookie["value"])):
                for form in (token, base64.b64encode(token.encode()).decode().rstrip("="),
                             base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")):
                    assert form not in held
            # And a copy of the cookie, replayed through the proxy, is the session while it lasts
            copy = {cookie["name"]: cookie["value"]}
            async with httpx.AsyncClient(base_url=f"{proxy.url}/console", verify=proxy.client_context(),
                                         cookies=copy) as replay:
                assert run_id in (await replay.get(f"/runs/{run_id}")).text
                # When the approver signs out
                await page.click("text=Sign out")
                await expect(page).to_have_url(f"{proxy.url}/console/sign-in?notice=signed-out")
                # Then the copy is refused: sent to sign in, over https, and shown nothing of the run
                refused = await replay.get(f"/runs/{run_id}")
                assert (refused.status_code, refused.headers["location"]) == (303, "/console/sign-in")
                assert run_id not in (await replay.get(f"/runs/{run_id}", follow_redirects=True)).text
        finally:
            await browser.close()


async def test_a_kept_session_vouches_for_its_principal_only_while_its_credential_does(clean, engine) -> None:
    # Given sessions kept for a named token, a bootstrap token and an OIDC subject
    bootstrap, oidc_settings = "b" * 40, {"LONGRUN_OIDC_ISSUER": "https://id.example.test",
                                          "LONGRUN_OIDC_AUDIENCE": "longrun", "LONGRUN_OIDC_JWKS_URL":
                                          "https://id.example.test/jwks"}
    gateway = Authenticator(engine, Settings.from_env({"LONGRUN_OPERATOR_TOKENS": bootstrap, **oidc_settings}))
    async with engine.begin() as conn:
        stored, secret = await tokens.create(conn, name="ops-ben", roles=("viewer",), tenants=("acme",),
                                             created_by="tests")
    named, by_bootstrap = await gateway.vouched(secret), await gateway.vouched(bootstrap)
    assert named is not None and by_bootstrap is not None and named.token_id == stored.id
    alice = Principal("alice", frozenset({"approver"}), frozenset({"acme"}), credential="oidc:https://id.example.test")
    async with engine.begin() as conn:
        for session_id, vouched in (("s-named", named), ("s-bootstrap", by_bootstrap), ("s-oidc", Vouched(alice))):
            await console_sessions.open_session(conn, session_id, vouched.principal, token_id=vouched.token_id,
                                                bootstrap_sha256=vouched.bootstrap_sha256, lifetime=60)

    async def still(authenticator: Authenticator, session_id: str) -> Principal | None:
        async with engine.begin() as conn:
            kept = await console_sessions.find(conn, session_id)
        assert kept is not None
        return authenticator.still(kept)
    # Then each vouches for its principal, as it was signed in
    assert await still(gateway, "s-named") == named.principal and named.principal.subject == "ops-ben"
    assert await still(gateway, "s-bootstrap") == BOOTSTRAP
    assert await still(gateway, "s-oidc") == alice
    # But no longer once the token is revoked, the bootstrap token rotated, the issuer another
    async with engine.begin() as conn:
        await tokens.revoke(conn, stored.id)
    rotated = Authenticator(engine, Settings.from_env({"LONGRUN_OPERATOR_TOKENS": "c" * 40, **oidc_settings,
                                                       "LONGRUN_OIDC_ISSUER": "https://other.example.test"}))
    assert await still(gateway, "s-named") is None
    assert (await still(rotated, "s-bootstrap"), await still(rotated, "s-oidc")) == (None, None)
    # And an ended session is found no more
    async with engine.begin() as conn:
        await console_sessions.end(conn, "s-oidc")
        assert await console_sessions.find(conn, "s-oidc") is None


def _decoded(cookie: str) -> str:
    """A sealed cookie's payload (base64 JSON before its MAC), decoded."""
    payload = cookie.split(".")[0]
    return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()


async def test_a_tenants_limits_are_shown_and_changed_in_the_console_within_the_ceiling(
        clean, engine, gateway) -> None:
    # Given an admin of acme, and a viewer of globex, signed in
    admin = await identities.token(engine, "tia", "admin", tenants=("acme",))
    outsider = await identities.token(engine, "gil", "viewer", tenants=("globex",))
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, admin)
        shown = await console.get("/limits", params={"tenant_id": "acme"})
        assert shown.status_code == 200 and 'id="change-limits"' in shown.text
        # When the admin lowers acme's slots to 2 with a tool group bounded
        saved = await console.post("/tenants/acme/limits", data={
            "run_slots": "2", "token_budget": "", "cost_budget": "", "tool_concurrency": "forge.*=3",
            "reason": "fewer at once", "csrf": _csrf(shown)})
        # Then they hold, shown with the platform's defaults for the rest
        assert saved.status_code == 303, saved.text
        after = await console.get(saved.headers["location"].removeprefix("/console"))
        assert "Limits saved" in after.text and "forge.*=3" in after.text
        # and raising them past the ceiling is refused, saying why, and nothing changes
        refused = await console.post("/tenants/acme/limits", data={
            "run_slots": "9", "tool_concurrency": "forge.*=3", "reason": "more", "csrf": _csrf(shown)})
        assert refused.status_code == 403 and "run_slots 9 go beyond the ceiling&#39;s 2" in refused.text
        bad = await console.post("/tenants/acme/limits", data={"run_slots": "many", "reason": "r",
                                                                "csrf": _csrf(shown)})
        assert bad.status_code == 422 and "run_slots" in bad.text
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT run_slots, tool_concurrency FROM tenant_limits"))).all()
        audit = (await conn.execute(text("SELECT actor, action, target FROM audit_log"))).all()
    assert [tuple(r) for r in rows] == [(2, {"forge.*": 3})]
    assert [tuple(a) for a in audit] == [("tia", "tenant_limits.set", "acme")]
    # And a principal of another tenant does not see acme's limits
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, outsider)
        assert (await console.get("/limits", params={"tenant_id": "acme"})).status_code == 404
        listed = await console.get("/limits", params={"tenant_id": "globex"})
        assert listed.status_code == 200 and 'id="change-limits"' not in listed.text
        assert (await console.post("/tenants/globex/limits", data={
            "run_slots": "1", "reason": "r", "csrf": _csrf(listed)})).status_code == 403

"""The console's schedules page against the real gateway: an operator sees its tenant's schedules and
pauses and resumes one (audited, as through the API); a form without the session's CSRF token, a viewer,
and an operator of another tenant change nothing; the page carries the console's security headers."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest
from playwright.async_api import expect
from sqlalchemy import text

from longrun.cadence import Cadence, Schedule
from longrun.db import schedules
from longrun.domain.schedules import Overlap
from tests.integration import identities
from tests.integration.test_console import _csrf, console_page, gateway, signed_in

pytestmark = pytest.mark.integration
__all__ = ["gateway"]


async def _schedule(engine, schedule_id: str, tenant: str) -> None:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    async with engine.begin() as conn:
        await schedules.insert(conn, Schedule(schedule_id, tenant, {"workflow": "dependency_upgrade", "input": {}},
                                              Cadence(now, cron="0 3 * * *"), Overlap.SKIP, 300.0, False,
                                              Cadence(now, cron="0 3 * * *").first(), "tests", now))


async def _paused(engine, schedule_id: str) -> bool:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        paused: bool = (await conn.execute(text("SELECT paused FROM schedules WHERE schedule_id = :s"),
                                           {"s": schedule_id})).scalar_one()
    return paused


async def test_an_operator_pauses_and_resumes_a_schedule_in_the_console(clean, engine, gateway) -> None:  # type: ignore[no-untyped-def]
    # Given a nightly schedule of acme and one of globex, and acme's operator signed in
    ours, theirs = "sched-00000000-0000-4000-8000-000000000001", "sched-00000000-0000-4000-8000-000000000002"
    await _schedule(engine, ours, "acme")
    await _schedule(engine, theirs, "globex")
    operator = await identities.token(engine, "opal", "operator", tenants=("acme",))
    viewer = await identities.token(engine, "vic", "viewer", tenants=("acme",))
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, operator)
        shown = await console.get("/schedules")
        # Then only acme's schedule is listed, with its cron and a pause form
        assert shown.status_code == 200 and ours in shown.text and theirs not in shown.text
        assert "0 3 * * *" in shown.text and f'action="/console/schedules/{ours}/pause"' in shown.text
        assert "default-src 'none'" in shown.headers["content-security-policy"]
        assert shown.headers["x-content-type-options"] == "nosniff"
        # When a pause is posted without the session's CSRF token, nothing changes
        forged = await console.post(f"/schedules/{ours}/pause", data={"reason": "r"})
        assert forged.status_code == 403 and not await _paused(engine, ours)
        # When the operator pauses it, then resumes it
        paused = await console.post(f"/schedules/{ours}/pause", data={"reason": "quiet night", "csrf": _csrf(shown)})
        assert paused.status_code == 303 and await _paused(engine, ours)
        after = await console.get(paused.headers["location"].removeprefix("/console"))
        assert "Schedule paused." in after.text and f'action="/console/schedules/{ours}/resume"' in after.text
        again = await console.post(f"/schedules/{ours}/pause", data={"reason": "r", "csrf": _csrf(shown)})
        assert again.status_code == 409
        resumed = await console.post(f"/schedules/{ours}/resume", data={"reason": "back", "csrf": _csrf(after)})
        assert resumed.status_code == 303 and not await _paused(engine, ours)
        # And globex's schedule is not found for acme's operator
        other = await console.post(f"/schedules/{theirs}/pause", data={"reason": "r", "csrf": _csrf(shown)})
        assert other.status_code == 404 and not await _paused(engine, theirs)
    async with httpx.AsyncClient(base_url=gateway) as console:
        await signed_in(console, viewer)
        listed = await console.get("/schedules", params={"tenant_id": "acme"})
        assert ours in listed.text and "/pause" not in listed.text
        refused = await console.post(f"/schedules/{ours}/pause", data={"reason": "r", "csrf": _csrf(listed)})
        assert refused.status_code == 403 and not await _paused(engine, ours)
    async with engine.connect() as conn:
        audit = (await conn.execute(text("SELECT actor, action, target FROM audit_log ORDER BY id"))).all()
    assert [tuple(a) for a in audit] == [("opal", "schedule.pause", ours), ("opal", "schedule.resume", ours)]


async def test_a_schedule_is_paused_and_resumed_in_the_browser(clean, engine, gateway) -> None:  # type: ignore[no-untyped-def]
    # Given acme's nightly schedule, and acme's operator signed in in a browser
    ours = "sched-00000000-0000-4000-8000-000000000003"
    await _schedule(engine, ours, "acme")
    operator = await identities.token(engine, "opal", "operator", tenants=("acme",))
    async with console_page(gateway.removesuffix("/console"), operator) as page:
        # When they open the schedules page and pause it with a reason
        await page.click("header a:text-is('Schedules')")
        row = page.locator(f"tr[data-schedule='{ours}']")
        await expect(row).to_contain_text("0 3 * * *")
        await row.locator("input[name=reason]").fill("release freeze")
        await row.locator("button").click()
        # Then it shows paused, and resuming it brings it back
        await expect(page.locator("#notice")).to_have_text("Schedule paused.")
        await expect(row).to_contain_text("paused")
        await row.locator("input[name=reason]").fill("freeze over")
        await row.locator("button:text-is('Resume')").click()
        await expect(page.locator("#notice")).to_have_text("Schedule resumed.")
    assert not await _paused(engine, ours)
    async with engine.connect() as conn:
        reasons = (await conn.execute(text("SELECT reason FROM audit_log WHERE target = :s ORDER BY id"),
                                      {"s": ours})).scalars().all()
    assert reasons == ["release freeze", "freeze over"]

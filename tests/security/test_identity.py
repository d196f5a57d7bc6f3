"""Operators are who their bearer token says, and may only what their roles and tenants allow: named
tokens (kept hashed, revocable, managed with longrunctl), OIDC JWTs verified against the issuer's
JWKS (served here by a tiny local HTTP server, keys made with ``cryptography``), the approver an
approval names, tenant scopes through the API and through longrunctl, and the webhook intake on a
port of its own."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from sqlalchemy import text

from longrun.db import runs
from tests.integration.ensemble import OPERATOR_TOKEN, Ensemble
from tests.integration.identities import bearer, token
from tests.integration.runs_factory import waiting_for_event, waiting_for_user
from tests.ports import free_port

pytestmark = pytest.mark.integration

LONGRUNCTL = Path(sys.executable).parent / "longrunctl"
ISSUER = "https://id.example.test"
AUDIENCE = "longrun-operator-api"
BOOTSTRAP = {"authorization": f"Bearer {OPERATOR_TOKEN}"}


class Issuer:
    """An identity provider's signing key, published as a JWKS at a local URL."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "issuer-key-1"
        public = json.loads(RSAAlgorithm.to_jwk(self.key.public_key()))
        self.jwks = json.dumps({"keys": [{**public, "kid": self.kid, "use": "sig", "alg": "RS256"}]}).encode()
        self.fetches = 0

    def sign(self, claims: dict[str, Any], *, key: rsa.RSAPrivateKey | None = None) -> str:
        now = int(time.time())
        body = {"iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 300, **claims}
        return jwt.encode(body, key or self.key, algorithm="RS256", headers={"kid": self.kid})


@pytest.fixture
def issuer() -> Iterator[tuple[Issuer, str]]:
    """The issuer and its JWKS URL, served from this process until the test ends."""
    served = Issuer()

    class Keys(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            served.fetches += 1
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(served.jwks)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Keys)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    server.shutdown()
    thread.join()


@pytest.fixture
async def gateway(clean, services, tmp_path, issuer):  # type: ignore[no-untyped-def]
    """A live gateway that takes named tokens, the bootstrap token and the issuer's JWTs."""
    ensemble = Ensemble(services, tmp_path)
    ensemble.start("gateway", "longrun.services.gateway", LONGRUN_OIDC_ISSUER=ISSUER, LONGRUN_OIDC_AUDIENCE=AUDIENCE,
                   LONGRUN_OIDC_JWKS_URL=issuer[1])
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    async with httpx.AsyncClient(base_url=ensemble.gateway_url, timeout=10) as http:
        yield http


def auth(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


async def audit_rows(engine) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT actor, action, target FROM audit_log ORDER BY id"))
        return [tuple(r) for r in rows]  # type: ignore[misc]


async def test_a_forged_or_revoked_named_token_is_refused(engine, gateway) -> None:
    secret = await token(engine, "ana", "viewer")
    assert (await gateway.get("/me", headers=auth(secret))).json() == {
        "subject": "ana", "roles": ["viewer"], "permissions": [], "tenants": None, "groups": []}
    for refused in (None, {"authorization": "Bearer lrt_forged-secret"}, {"authorization": "Bearer " + secret[:-1]},
                    {"authorization": secret}, {"authorization": "Basic " + secret}):
        answer = await gateway.get("/runs", headers=refused)
        assert answer.status_code == 401 and answer.json() == {"error": "missing or bad bearer token"}, refused
        assert answer.headers["www-authenticate"] == "Bearer"
    async with engine.connect() as conn:
        stored = (await conn.execute(text("SELECT id, secret_sha256, last_used_at FROM operator_tokens"))).one()
    assert secret not in stored.secret_sha256 and stored.last_used_at is not None  # kept hashed, its use seen
    revoked = await gateway.post(f"/tokens/{stored.id}/revoke", headers=BOOTSTRAP, json={"reason": "ana left"})
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert (await gateway.get("/runs", headers=auth(secret))).status_code == 401
    assert await audit_rows(engine) == [("bootstrap", "token.revoke", f"token:{stored.id}")]


async def test_a_jwt_of_the_issuer_names_its_subject_roles_tenants_and_groups(gateway, issuer) -> None:
    keys, _ = issuer
    signed = keys.sign({"sub": "ana@example.test", "roles": ["approver", "unknown"], "tenants": ["acme"],
                        "groups": ["release-managers"]})
    me = await gateway.get("/me", headers=auth(signed))
    assert me.json() == {"subject": f"{ISSUER}|ana@example.test", "roles": ["approver"], "permissions": [],
                         "tenants": ["acme"],
                         "groups": ["release-managers"]}
    everyone = keys.sign({"sub": "root", "roles": "admin", "tenants": "*"})
    assert (await gateway.get("/me", headers=auth(everyone))).json()["tenants"] is None


async def test_a_jwt_signed_by_another_key_expired_or_for_another_audience_is_refused(gateway, issuer) -> None:
    keys, _ = issuer
    claims = {"sub": "mallory", "roles": ["admin"], "tenants": "*"}
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    refused = {
        "signed by a key the JWKS does not hold": keys.sign(claims, key=stranger),
        "expired": keys.sign({**claims, "iat": now - 600, "exp": now - 60}),
        "for another audience": keys.sign({**claims, "aud": "someone-else"}),
        "of another issuer": keys.sign({**claims, "iss": "https://evil.example.test"}),
        "without a subject": keys.sign({"roles": ["admin"]}),
        "unsigned": jwt.encode({**claims, "iss": ISSUER, "aud": AUDIENCE, "exp": now + 300}, None, algorithm="none"),
        "signed with a shared secret": jwt.encode({**claims, "iss": ISSUER, "aud": AUDIENCE, "exp": now + 300},
                                                  "a-guessable-secret-of-32-bytes!!", algorithm="HS256",
                                                  headers={"kid": keys.kid}),
    }
    for why, signed in refused.items():
        answer = await gateway.get("/runs", headers=auth(signed))
        assert answer.status_code == 401, (why, answer.text)
    assert (await gateway.get("/runs", headers=auth(keys.sign(claims)))).status_code == 200


async def test_each_operation_needs_its_role(engine, gateway) -> None:
    stored = await waiting_for_event(engine, "ci/acme/payments/50")
    run_id = stored.snapshot.run_id
    viewer = auth(await token(engine, "vic", "viewer"))
    operator = auth(await token(engine, "olga", "operator"))
    assert (await gateway.get(f"/runs/{run_id}", headers=viewer)).status_code == 200
    paused = await gateway.post(f"/runs/{run_id}/pause", headers=viewer, json={"reason": "look"})
    assert paused.status_code == 403 and paused.json()["error"] == "vic may not pauseRun: it needs the role operator"
    for answer in (await gateway.post("/tokens", headers=operator, json={
                       "name": "x", "roles": ["admin"], "tenants": None, "reason": "r"}),
                   await gateway.put("/tenants/acme/policy", headers=operator, json={
                       "tools": [], "resources": [], "reason": "r"})):
        assert answer.status_code == 403 and "needs the role admin" in answer.json()["error"], answer.text
    assert (await gateway.post(f"/runs/{run_id}/pause", headers=operator, json={"reason": "look"})).status_code == 200
    assert await audit_rows(engine) == [("olga", "pause", run_id)]


async def test_only_the_approver_the_request_names_may_decide_it_and_a_refusal_changes_nothing(
        engine, gateway, issuer) -> None:
    keys, _ = issuer
    by_subject = await waiting_for_user(engine, approval_id="merge:1", approved_hash="a" * 64)
    by_group = await waiting_for_user(engine, approval_id="merge:2", approved_hash="b" * 64,
                                      owner="group:release-managers")
    by_role = await waiting_for_user(engine, approval_id="merge:3", approved_hash="c" * 64, owner="role:admin")

    async def decide(stored: runs.StoredRun, headers: dict[str, str], action: str = "approve") -> httpx.Response:
        wait = stored.snapshot.wait
        assert wait is not None
        return await gateway.post(f"/runs/{stored.snapshot.run_id}/{action}", headers=headers, json={
            "approval_id": wait.approval_id, "approved_hash": wait.approved_hash, "reason": "reviewed"})

    mallory = await bearer(engine, "mallory", "approver")
    outsider = auth(keys.sign({"sub": "bob", "roles": ["approver"], "tenants": "*", "groups": ["developers"]}))
    refusals = [(by_subject, mallory, "approve"), (by_subject, mallory, "deny"), (by_subject, BOOTSTRAP, "approve"),
                (by_group, mallory, "approve"), (by_group, outsider, "deny"), (by_role, outsider, "approve")]
    for stored, headers, action in refusals:
        answer = await decide(stored, headers, action)
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"].startswith(f"run {stored.snapshot.run_id}: only {stored.snapshot.wait.owner} "
                                                 "may decide this approval")
    async with engine.connect() as conn:
        assert [await runs.load(conn, s.snapshot.run_id) for s in (by_subject, by_group, by_role)] == [
            by_subject, by_group, by_role]
    assert await audit_rows(engine) == []
    # The named approvers may
    release_manager = auth(keys.sign({"sub": "rita", "roles": ["approver"], "tenants": ["acme"],
                                      "groups": ["release-managers"]}))
    decided = [await decide(by_subject, await bearer(engine, "user_42")), await decide(by_group, release_manager),
               await decide(by_role, BOOTSTRAP, "deny")]
    assert [d.status_code for d in decided] == [200, 200, 200], [d.text for d in decided]
    assert [actor for actor, _, _ in await audit_rows(engine)] == ["user_42", f"{ISSUER}|rita", "bootstrap"]


async def test_no_token_acts_as_an_identity_providers_user_whatever_it_is_named(engine, gateway, issuer) -> None:
    # Given an approval owned by the issuer's user alice
    keys, _ = issuer
    stored = await waiting_for_user(engine, approval_id="merge:9", approved_hash="d" * 64, owner=f"{ISSUER}|alice")
    body = {"approval_id": "merge:9", "approved_hash": "d" * 64, "reason": "reviewed"}
    approve = f"/runs/{stored.snapshot.run_id}/approve"
    # When an admin mints a token named alice, and tries one named like her subject
    alice_token = await gateway.post("/tokens", headers=BOOTSTRAP, json={
        "name": "alice", "roles": ["approver"], "tenants": None, "reason": "impersonate"})
    assert alice_token.status_code == 200, alice_token.text
    like_her = await gateway.post("/tokens", headers=BOOTSTRAP, json={
        "name": f"{ISSUER}|alice", "roles": ["approver"], "tenants": None, "reason": "impersonate"})
    # Then no token is named like her subject, the token named alice is not her, nor is another issuer's alice
    assert like_her.status_code == 422, like_her.text
    refused = await gateway.post(approve, headers=auth(alice_token.json()["secret"]), json=body)
    assert refused.status_code == 403 and f"only {ISSUER}|alice may decide" in refused.json()["error"]
    async with engine.connect() as conn:
        assert await runs.load(conn, stored.snapshot.run_id) == stored
    # and she decides, the decision recording her issuer
    her = auth(keys.sign({"sub": "alice", "roles": ["approver"], "tenants": ["acme"]}))
    assert (await gateway.post(approve, headers=her, json=body)).status_code == 200
    async with engine.connect() as conn:
        actor, details = (await conn.execute(text(
            "SELECT actor, details FROM audit_log WHERE action = 'approve'"))).one()
    assert actor == f"{ISSUER}|alice" and details["credential"] == f"oidc:{ISSUER}"


async def test_an_operator_of_one_tenant_cannot_list_read_or_act_on_another_tenants_runs(engine, gateway) -> None:
    mine = (await waiting_for_event(engine, "ci/acme/payments/60", tenant="acme")).snapshot.run_id
    theirs = await waiting_for_event(engine, "ci/globex/web/61", tenant="globex")
    other = theirs.snapshot.run_id
    acme = auth(await token(engine, "ana", "admin", tenants=("acme",)))
    listed = (await gateway.get("/runs", headers=acme)).json()["runs"]
    assert [r["run_id"] for r in listed] == [mine]
    assert (await gateway.get("/runs", headers=acme, params={"tenant_id": "globex"})).json()["runs"] == []
    for answer in (await gateway.get(f"/runs/{other}", headers=acme),
                   await gateway.post(f"/runs/{other}/pause", headers=acme, json={"reason": "mine now"}),
                   await gateway.post(f"/runs/{other}/artifacts", headers=acme, params={"name": "x", "reason": "r"},
                                      content=b"evidence"),
                   await gateway.get("/tenants/globex/policy", headers=acme)):
        assert answer.status_code == 404, answer.text
    # answered as a run that does not exist is
    assert (await gateway.get(f"/runs/{other}", headers=acme)).json() == {"error": f"no run {other!r}"}
    assert (await gateway.get("/runs/run-never", headers=acme)).json() == {"error": "no run 'run-never'"}
    async with engine.connect() as conn:
        assert await runs.load(conn, other) == theirs
    # The audit log shows what concerns its tenant's runs only; what spans tenants is refused
    assert (await gateway.post(f"/runs/{mine}/pause", headers=acme, json={"reason": "look"})).status_code == 200
    assert (await gateway.post(f"/runs/{other}/pause", headers=BOOTSTRAP, json={"reason": "look"})).status_code == 200
    trail = (await gateway.get("/audit", headers=acme)).json()["entries"]
    assert [(e["actor"], e["target"]) for e in trail] == [("ana", mine)]
    for path in ("/quarantine", "/versions", "/tokens"):
        refused = await gateway.get(path, headers=acme)
        assert refused.status_code == 403 and "only a principal of every tenant may" in refused.json()["error"]


async def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    quiet = {k: v for k, v in os.environ.items() if not k.startswith(("LONGRUN_", "LONGRUNCTL_"))}
    return await asyncio.to_thread(subprocess.run, [str(LONGRUNCTL), *args], capture_output=True, text=True,
                                   timeout=60, env={**quiet, "LONGRUNCTL_CONFIG": "/nonexistent"})


async def test_longrunctl_as_an_operator_of_one_tenant_sees_and_touches_only_its_runs(engine, gateway) -> None:
    mine = (await waiting_for_event(engine, "ci/acme/payments/70", tenant="acme")).snapshot.run_id
    other = (await waiting_for_event(engine, "ci/globex/web/71", tenant="globex")).snapshot.run_id
    argv = ["--url", str(gateway.base_url), "--token", await token(engine, "ana", "operator", tenants=("acme",))]
    listed = await ctl(*argv, "-o", "json", "run", "list")
    assert listed.returncode == 0, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)["runs"]] == [mine]
    for command in (["run", "show", other], ["run", "pause", other, "--reason", "mine now"],
                    ["run", "timeline", other]):
        done = await ctl(*argv, *command)
        assert done.returncode == 1 and done.stderr.strip() == f"Error: 404 Not Found: no run {other!r}", done.stderr
    denied = await ctl(*argv, "dlq", "list")
    assert denied.returncode == 1 and denied.stderr.startswith("Error: 403 Forbidden: ana may not quarantine")
    assert "(longrunctl whoami shows your roles and tenants)" in denied.stderr
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT status FROM runs WHERE run_id = :r"), {"r": other})).scalar() == \
            "WAITING_EVENT"


@pytest.mark.long
async def test_longrunctl_creates_lists_and_revokes_named_tokens(engine, gateway) -> None:
    url = ["--url", str(gateway.base_url)]
    admin = [*url, "--token", OPERATOR_TOKEN]
    created = await ctl(*admin, "token", "create", "ana", "--role", "operator", "--tenant", "acme", "--tenant",
                        "initech", "--reason", "ana joins on-call")
    assert created.returncode == 0, created.stderr
    table, secret_line = created.stdout.rsplit("\n\n", 1)
    assert table.splitlines()[0].split()[:5] == ["ID", "NAME", "ROLES", "PERMISSIONS", "TENANTS"]
    secret = secret_line.strip().removeprefix("secret (shown once): ")
    whoami = await ctl(*url, "--token", secret, "-o", "json", "whoami")
    assert json.loads(whoami.stdout) == {"subject": "ana", "roles": ["operator"], "permissions": [],
                                         "tenants": ["acme", "initech"], "groups": []}
    listed = json.loads((await ctl(*admin, "-o", "json", "token", "list")).stdout)
    assert [(t["id"], t["name"], t["created_by"], t["revoked_at"]) for t in listed] == [(1, "ana", "bootstrap", None)]
    assert "secret" not in listed[0] and secret not in json.dumps(listed)
    revoked = await ctl(*admin, "-o", "json", "token", "revoke", "1", "--reason", "ana left")
    assert revoked.returncode == 0 and json.loads(revoked.stdout)["revoked_at"] is not None, revoked.stderr
    assert json.loads((await ctl(*admin, "-o", "json", "token", "list")).stdout) == []
    assert len(json.loads((await ctl(*admin, "-o", "json", "token", "list", "--all")).stdout)) == 1
    # Error paths: each one line and a non-zero exit, and nothing made
    gone = await ctl(*url, "--token", secret, "whoami")
    viewer = await token(engine, "vic", "viewer")
    scoped_admin = await token(engine, "sam", "admin", tenants=("acme",))
    failures = [
        (gone, 1, "Error: 401 Unauthorized: missing or bad bearer token"),
        (await ctl(*url, "--token", viewer, "token", "list"), 1,
         "Error: 403 Forbidden: vic may not listTokens: it needs the role admin"),
        (await ctl(*url, "--token", scoped_admin, "token", "create", "eve", "--role", "admin", "--reason", "r"), 1,
         "Error: 403 Forbidden: sam may not createToken: only a principal of every tenant may"),
        (await ctl(*admin, "token", "revoke", "999", "--reason", "r"), 1, "Error: 404 Not Found: no token 999"),
        (await ctl(*admin, "token", "create", "has:colon", "--role", "viewer", "--reason", "r"), 1,
         "Error: 422 Unprocessable Entity: name: String should match pattern"),
        (await ctl(*admin, "token", "create", "bootstrap", "--role", "admin", "--reason", "r"), 1,
         "Error: 422 Unprocessable Entity: the name 'bootstrap' is the bootstrap tokens'"),
        (await ctl(*admin, "token", "create", "eve", "--role", "root", "--reason", "r"), 2, ""),
        (await ctl(*admin, "token", "create", "eve", "--role", "viewer"), 2, ""),
    ]
    for done, code, error in failures:
        assert done.returncode == code and done.stdout == "", (done.args, done.stderr)
        assert done.stderr.startswith(error) and (code == 2 or len(done.stderr.strip().splitlines()) == 1), done.stderr
    async with engine.connect() as conn:
        names = (await conn.execute(text("SELECT name FROM operator_tokens ORDER BY id"))).scalars().all()
    assert names == ["ana", "vic", "sam"]
    assert [(a, action) for a, action, _ in await audit_rows(engine)] == [
        ("bootstrap", "token.create"), ("bootstrap", "token.revoke")]


async def test_the_webhook_intake_can_be_served_on_a_port_of_its_own(clean, services, tmp_path) -> None:
    ensemble = Ensemble(services, tmp_path)
    intake = free_port()
    ensemble.start("gateway", "longrun.services.gateway", LONGRUN_WEBHOOK_PORT=str(intake))
    await ensemble.wait_http(f"{ensemble.gateway_url}/healthz")
    await ensemble.wait_http(f"http://127.0.0.1:{intake}/healthz")
    async with httpx.AsyncClient(timeout=10) as http:
        unsigned = await http.post(f"http://127.0.0.1:{intake}/webhooks/forge", content=b"{}")
        assert unsigned.status_code == 401 and unsigned.json()["error"].startswith("refused")
        assert (await http.get(f"http://127.0.0.1:{intake}/runs", headers=BOOTSTRAP)).status_code == 404
        assert (await http.post(f"{ensemble.gateway_url}/webhooks/forge", content=b"{}")).status_code == 404
        assert (await http.get(f"{ensemble.gateway_url}/runs", headers=BOOTSTRAP)).status_code == 200

"""The forge's operations as longrun tools: argument schemas, effect kinds and reconciliation lookups."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from longrun.authoring import Tool, ToolResult
from longrun.domain import EffectKind
from longrun_dependency_upgrade.forge_client import ForgeClient


FORGE = "forge"
"""The far side every forge tool calls (their shared circuit breaker)."""


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BranchArgs(_Args):
    repo: str
    name: str
    from_ref: str


class CommitArgs(_Args):
    repo: str
    branch: str
    message: str
    files: dict[str, str]


class CiArgs(_Args):
    repo: str
    sha: str


class MergeRequestArgs(_Args):
    repo: str
    source_branch: str
    title: str
    description: str
    sha: str


def repository(args: Mapping[str, Any]) -> str:
    """What every forge call acts on, for a run's scope: ``repo:<owner>/<name>``."""
    return f"repo:{args['repo']}"


def forge_tools(client: ForgeClient, *, timeout: float = 10.0) -> dict[str, Tool]:
    async def create_branch(args: Mapping[str, Any], key: str, token: int) -> ToolResult:
        branch = await client.create_branch(args["repo"], name=args["name"], from_ref=args["from_ref"],
                                            idempotency_key=key, fencing_token=token)
        return ToolResult(branch["name"], {"name": branch["name"], "head_sha": branch["head_sha"]})

    async def create_commit(args: Mapping[str, Any], key: str, token: int) -> ToolResult:
        commit = await client.create_commit(args["repo"], branch=args["branch"], files=dict(args["files"]),
                                            message=args["message"], idempotency_key=key,
                                            fencing_token=token)
        return ToolResult(commit["sha"], {"sha": commit["sha"], "branch": commit["branch"], "diff": commit["diff"]})

    async def start_ci(args: Mapping[str, Any], key: str, token: int) -> ToolResult:
        run = await client.start_ci_run(args["repo"], sha=args["sha"], idempotency_key=key, fencing_token=token)
        return ToolResult(str(run["id"]), {"id": run["id"], "sha": run["sha"]})

    async def create_mr(args: Mapping[str, Any], key: str, token: int) -> ToolResult:
        mr = await client.create_merge_request(
            args["repo"], source_branch=args["source_branch"], title=args["title"],
            description=args["description"], sha=args["sha"], idempotency_key=key, fencing_token=token)
        return ToolResult(str(mr["id"]), {"id": mr["id"], "number": mr["number"], "url": mr["url"]})

    async def lookup(key: str) -> ToolResult | None:
        found = await client.lookup(key)
        if found is None:
            return None
        obj = found["object"]
        return ToolResult(str(obj.get("id") or obj.get("sha") or obj.get("name")), obj)

    write = EffectKind.IDEMPOTENT_WRITE
    # One far side: when the forge is down, every one of its tools waits for it to be healthy again.
    return {tool.name: tool for tool in (
        Tool("forge.create_branch", "1", write, BranchArgs, create_branch, lookup, start_to_close=timeout,
             far_side=FORGE, resource=repository),
        Tool("forge.create_commit", "1", write, CommitArgs, create_commit, lookup, start_to_close=timeout,
             far_side=FORGE, resource=repository),
        Tool("forge.start_ci_run", "1", write, CiArgs, start_ci, lookup, start_to_close=timeout, far_side=FORGE,
             resource=repository),
        # Creating a merge request twice opens two: never blind-retried, reconciled by key.
        Tool("forge.create_merge_request", "1", EffectKind.NON_IDEMPOTENT_WRITE, MergeRequestArgs, create_mr,
             lookup, start_to_close=timeout, public_receipt=("number", "url"), far_side=FORGE, resource=repository),
    )}

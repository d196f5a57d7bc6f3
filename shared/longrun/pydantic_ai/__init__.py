"""Pydantic AI agents on the ledger: an agent's model requests are the run's model calls (charged to its
budget), its tool calls ledger actions (effect kinds, lookups, approvals bound to the arguments' hash),
and its whole loop replayed from the run's journal inside a code-first function.

The optional extra ``longrun-runtime[pydantic-ai]``; nothing in the runtime imports this package.
"""

from longrun.pydantic_ai.agent import AgentTool, Approval, LedgerAgent
from longrun.pydantic_ai.model import AgentModel

__all__ = ["AgentModel", "AgentTool", "Approval", "LedgerAgent"]

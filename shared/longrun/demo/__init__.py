"""Stand-ins for the outside world in the demo and the fault tests.

``forge`` plays a code forge with CI (branches, commits, CI runs, merge requests,
signed webhooks, injectable faults), ``forge_client`` is the runtime's tool client
for it, and ``fake_llm`` plays an OpenAI-compatible chat-completions endpoint.
Nothing here is imported by the services in production.
"""

from __future__ import annotations

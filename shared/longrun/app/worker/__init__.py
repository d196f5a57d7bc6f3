"""The worker's use case, in three parts: the loop (``loop``: take, heartbeat, rounds), the far side
(``model_call``, ``tool_call``, ``tool_answers``, ``scope``, ``cancelling``: calls out, scope,
breakers, call watch, receipts) and the commit (``commit``: one ``WorkerStore.commit`` of a
``Transition`` per write). ``rounds`` plays one decision."""

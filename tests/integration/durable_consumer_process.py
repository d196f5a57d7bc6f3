"""A durable consumer as its own process, for the tests that kill it: one JSON line per event handed
on (and per miss reported) in ``--out``; ``--block-at N`` makes the handler hang before recording the
N-th event of this process (it writes ``blocked_on`` with its id), so a kill then leaves that event
taken but not handled."""

from __future__ import annotations

import argparse
import asyncio
import json

from longrun_client import Client, Envelope, Missed


def record(event: Envelope) -> dict[str, object]:
    """What the tests check of an event handed on."""
    status = event.payload.status if event.type == "run.event" else None
    return {"event_id": event.event_id, "type": event.type, "run_id": event.run_id,
            "seq": event.payload.seq if event.type == "run.event" else None, "status": status}


async def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--url", "--tenant", "--name", "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--block-at", type=int, default=0)
    args = parser.parse_args()
    handled = 0

    def write(line: dict[str, object]) -> None:
        with open(args.out, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")

    async def handle(event: Envelope) -> None:
        nonlocal handled
        handled += 1
        if handled == args.block_at:
            write({"blocked_on": event.event_id})
            await asyncio.Event().wait()
        write(record(event))

    def missed(report: Missed) -> None:
        write({"missed": repr(report)})

    async with await Client.connect(args.url, producer="consumer-process") as client:
        consumer = await client.consume(args.tenant, handle, name=args.name, on_missed=missed, window=2)
        print("consuming", flush=True)
        await consumer.join()


if __name__ == "__main__":
    asyncio.run(main())

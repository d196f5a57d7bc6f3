#!/usr/bin/env node
// Create a longrun run over AMQP and print its events until it ends.
//   LONGRUN_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/ node create-and-follow.mjs --tenant acme
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';
import amqp from 'amqplib';
import { follow, subscribe } from './consumer.mjs';
import { brokerUser, publishRunCreate, runCreate } from './producer.mjs';

const { values: opts } = parseArgs({
  options: {
    tenant: { type: 'string', default: process.env.LONGRUN_TENANT ?? 'acme' },
    workflow: { type: 'string', default: 'steps' },
    input: { type: 'string', default: '{"steps": 2}' },
    key: { type: 'string', default: `node-${randomUUID()}` }, // the idempotency key
    timeout: { type: 'string', default: '60' }, // seconds
  },
});
const url = process.env.LONGRUN_AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672/'; // the path is the vhost

function print(event) {
  const p = event.payload;
  if (event.type === 'run.accepted') {
    console.log(`run.accepted run_id=${p.run_id} workflow=${p.workflow} repeated=${p.repeated}`);
  } else if (event.type === 'run.event') {
    console.log(`status seq=${p.seq} ${p.status}${p.data?.from ? ` (from ${p.data.from})` : ''}`);
  } else {
    console.log(`${event.type} ${JSON.stringify(p)}`);
  }
}

let connection;
try {
  const request = runCreate({ tenant: opts.tenant, workflow: opts.workflow, input: JSON.parse(opts.input),
                              idempotencyKey: opts.key });
  connection = await amqp.connect(url);
  const events = await subscribe(connection, opts.tenant);
  await publishRunCreate(connection, request, brokerUser(url));
  console.log(`run.create published event_id=${request.event_id} key=${opts.key}`,
              `correlation_id=${request.correlation_id}`);
  const end = await follow(events, request.correlation_id, { timeoutMs: Number(opts.timeout) * 1000, onEvent: print });
  console.log(`outcome ${JSON.stringify(end.payload.outcome)}`);
} catch (err) {
  console.error(`error: ${err.message}`);
  process.exitCode = 1;
} finally {
  await connection?.close().catch(() => {});
}

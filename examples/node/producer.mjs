// The producer: a run.create (v4, the current version) envelope, published to longrun's ingress with a publisher confirm.
import { randomUUID } from 'node:crypto';

export const INGRESS_EXCHANGE = 'longrun.ingress';
export const TENANT_PATTERN = /^[A-Za-z0-9_-]{1,100}$/; // the first word of the tenant's routing keys

export function runCreate({ tenant, workflow, input, idempotencyKey, correlationId = randomUUID(), priority = 5 }) {
  if (!TENANT_PATTERN.test(tenant)) throw new Error(`tenant ${JSON.stringify(tenant)} must match ${TENANT_PATTERN}`);
  return {
    event_id: randomUUID(), // fresh for every message: longrun dedups on it
    type: 'run.create',
    schema_version: 4,
    producer: 'examples/node',
    tenant_id: tenant,
    correlation_id: correlationId, // every event about this request carries it back
    occurred_at: new Date().toISOString(),
    payload: { workflow, idempotency_key: idempotencyKey, input, priority },
  };
}

// The broker user an AMQP URL logs in as (amqplib's default: guest).
export function brokerUser(url) {
  return decodeURIComponent(new URL(url).username) || 'guest';
}

// Resolves once the broker has taken the message (persistent, confirmed, routed to a queue).
// userId names the publishing connection's user: RabbitMQ checks it, and longrun admits the create
// only in the tenants that user is allowed.
export async function publishRunCreate(connection, envelope, userId) {
  const channel = await connection.createConfirmChannel();
  let returned = null;
  let failure = null;
  channel.on('return', (message) => { returned = message.fields.replyText; }); // arrives before the ack
  channel.on('error', (err) => { failure = err; }); // e.g. 404: no ingress exchange on this vhost
  try {
    channel.publish(INGRESS_EXCHANGE, 'run.create', Buffer.from(JSON.stringify(envelope)), {
      persistent: true,
      mandatory: true,
      contentType: 'application/json',
      messageId: envelope.event_id,
      correlationId: envelope.correlation_id,
      type: envelope.type,
      userId,
      timestamp: Math.floor(Date.parse(envelope.occurred_at) / 1000),
      headers: {
        'cloudEvents:specversion': '1.0',
        'cloudEvents:id': envelope.event_id,
        'cloudEvents:type': envelope.type,
        'cloudEvents:source': envelope.producer,
        'cloudEvents:time': envelope.occurred_at,
        schema_version: envelope.schema_version,
        tenant_id: envelope.tenant_id,
      },
    });
    await channel.waitForConfirms();
  } catch (err) {
    throw failure ?? err;
  } finally {
    await channel.close().catch(() => {});
  }
  if (returned) throw new Error(`run.create was not routed (${returned}): is longrun running on this vhost?`);
}

// The consumer: a private queue on longrun's events exchange, and the events of one request read from it.
import { randomUUID } from 'node:crypto';

export const EVENTS_EXCHANGE = 'longrun.events';
export const TERMINAL = new Set(['COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED', 'TIMED_OUT', 'BUDGET_EXHAUSTED']);

// Bind before publishing the request, or its run.accepted may be gone before the queue exists.
export async function subscribe(connection, tenant) {
  const channel = await connection.createChannel();
  channel.on('error', () => {}); // a refused operation (e.g. 404: no events exchange) rejects its own promise
  // Named with the tenant first: a tenant's broker user may declare only queues named so (docs/bus.md).
  const { queue } = await channel.assertQueue(`${tenant}.node-${randomUUID()}`, { exclusive: true, autoDelete: true });
  await channel.bindQueue(queue, EVENTS_EXCHANGE, `${tenant}.run.#`);
  return { channel, queue };
}

// Calls onEvent once per event (deduplicated by event_id) of the request with this correlation id,
// or of the run it was accepted as; resolves with the terminal run.event, rejects on run.rejected or timeout.
export function follow({ channel, queue }, correlationId, { timeoutMs, onEvent }) {
  return new Promise((resolve, reject) => {
    const seen = new Set();
    let runId = null;
    const finish = (settle, value) => { clearTimeout(timer); settle(value); };
    const timer = setTimeout(() => {
      const waiting = runId ? `run ${runId} has not ended` : 'no run.accepted';
      reject(new Error(`timed out after ${timeoutMs / 1000}s (${waiting})`));
    }, timeoutMs);
    channel.consume(queue, (message) => {
      if (message === null) return finish(reject, new Error('the broker cancelled the consumer'));
      const event = JSON.parse(message.content.toString());
      if (seen.has(event.event_id)) return;
      if (event.correlation_id !== correlationId && !(runId && event.run_id === runId)) return;
      seen.add(event.event_id);
      if (event.type === 'run.accepted') runId = event.payload.run_id;
      onEvent(event);
      if (event.type === 'run.rejected') {
        finish(reject, new Error(`run.rejected ${event.payload.code}: ${event.payload.reason}`));
      } else if (event.type === 'run.event' && TERMINAL.has(event.payload.status)) {
        finish(resolve, event);
      }
    }, { noAck: true }).catch((err) => finish(reject, err));
  });
}

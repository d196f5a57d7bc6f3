"""outbox-relay: publishes committed outbox rows to RabbitMQ."""

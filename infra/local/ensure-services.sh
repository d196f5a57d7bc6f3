#!/usr/bin/env bash
# Start the local PostgreSQL and RabbitMQ if they are not answering (Debian packages),
# and wait until both accept connections. Used by `make run`, `make test` and CI.
set -euo pipefail

answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if ! answers 5432; then
  if command -v pg_ctlcluster >/dev/null; then
    echo "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  else
    echo "PostgreSQL is not running on 127.0.0.1:5432 and pg_ctlcluster is not installed;" >&2
    echo "start PostgreSQL or set LONGRUN_DATABASE_URL" >&2
    exit 1
  fi
fi
if ! answers 5672; then
  if command -v rabbitmq-server >/dev/null; then
    echo "starting RabbitMQ"
    rabbitmq-server -detached
  else
    echo "RabbitMQ is not running on 127.0.0.1:5672 and rabbitmq-server is not installed;" >&2
    echo "start RabbitMQ or set LONGRUN_AMQP_URL" >&2
    exit 1
  fi
fi
for _ in $(seq 1 90); do
  if answers 5432 && answers 5672; then
    # The AMQP port opens before the broker finishes booting its apps.
    if ! command -v rabbitmqctl >/dev/null || rabbitmqctl await_startup --timeout 60 >/dev/null 2>&1; then
      exit 0
    fi
  fi
  sleep 1
done
echo "PostgreSQL or RabbitMQ did not come up within 90 s" >&2
exit 1

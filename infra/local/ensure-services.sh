#!/usr/bin/env bash
# Make sure PostgreSQL and RabbitMQ answer where LONGRUN_DATABASE_URL and LONGRUN_AMQP_URL point
# (default: this machine's 5432 and 5672), starting this machine's own servers (Debian packages)
# when they are the ones asked for, with RabbitMQ's management plugin enabled. Used by `make run`, `make test` and CI.
#
# --or-containers (the tests): when neither answers nor can be started here but a Docker engine
# does, leave them to the tests, which start both with testcontainers (tests/infra.py).
set -euo pipefail

or_containers=false
[ "${1:-}" = "--or-containers" ] && or_containers=true

# host and port of a URL, the default port when it names none
endpoint() {
  python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); print(p.hostname or "127.0.0.1", p.port or sys.argv[2])' "$1" "$2"
}
read -r db_host db_port < <(endpoint "${LONGRUN_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/longrun}" 5432)
read -r mq_host mq_port < <(endpoint "${LONGRUN_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}" 5672)

answers() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
local_host() { case "$1" in 127.0.0.1|localhost|::1) return 0 ;; *) return 1 ;; esac; }

if answers "$db_host" "$db_port" && answers "$mq_host" "$mq_port"; then
  :
elif $or_containers && ! { local_host "$db_host" && command -v pg_ctlcluster >/dev/null \
    && local_host "$mq_host" && command -v rabbitmq-server >/dev/null; } \
    && command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  echo "PostgreSQL or RabbitMQ is not reachable here; a Docker engine answers, so the tests start both with testcontainers"
  exit 0
else
  if ! answers "$db_host" "$db_port"; then
    if local_host "$db_host" && [ "$db_port" = 5432 ] && command -v pg_ctlcluster >/dev/null; then
      echo "starting PostgreSQL"
      pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
    else
      echo "PostgreSQL does not answer on $db_host:$db_port (LONGRUN_DATABASE_URL) and is not one this machine can start;" >&2
      echo "start it, point LONGRUN_DATABASE_URL at one that runs$($or_containers && echo ', or run a Docker engine for testcontainers')" >&2
      exit 1
    fi
  fi
  if ! answers "$mq_host" "$mq_port"; then
    if local_host "$mq_host" && [ "$mq_port" = 5672 ] && command -v rabbitmq-server >/dev/null; then
      echo "starting RabbitMQ"
      rabbitmq-server -detached
    else
      echo "RabbitMQ does not answer on $mq_host:$mq_port (LONGRUN_AMQP_URL) and is not one this machine can start;" >&2
      echo "start it, point LONGRUN_AMQP_URL at one that runs$($or_containers && echo ', or run a Docker engine for testcontainers')" >&2
      exit 1
    fi
  fi
fi
for _ in $(seq 1 90); do
  if answers "$db_host" "$db_port" && answers "$mq_host" "$mq_port"; then
    # The AMQP port opens before the broker finishes booting its apps.
    if ! local_host "$mq_host" || ! command -v rabbitmqctl >/dev/null; then
      exit 0
    fi
    if rabbitmqctl await_startup --timeout 60 >/dev/null 2>&1; then
      # The scheduler bounds the ingress queue with a policy set through the management API
      # (docs/flow-control.md): enabled on a running node without a restart, kept across restarts.
      if ! rabbitmq-plugins -q is_enabled rabbitmq_management >/dev/null 2>&1; then
        echo "enabling RabbitMQ's management plugin"
        rabbitmq-plugins -q enable rabbitmq_management >/dev/null
      fi
      for _ in $(seq 1 30); do
        answers "$mq_host" 15672 && exit 0
        sleep 1
      done
      echo "RabbitMQ's management API did not answer on $mq_host:15672 within 30 s" >&2
      exit 1
    fi
  fi
  sleep 1
done
echo "PostgreSQL or RabbitMQ did not come up within 90 s" >&2
exit 1

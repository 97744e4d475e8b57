#!/usr/bin/env bash
# Starts PostgreSQL and Redis when they are down (this machine kind starts them before a session; CI
# may find one stopped). The start commands are the machine's own.
set -euo pipefail

if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  echo "postgres: down, starting"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "redis: down, starting"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 1; done
fi
echo "redis: $(redis-cli -h 127.0.0.1 -p 6379 ping)"

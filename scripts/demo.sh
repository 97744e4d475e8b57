#!/usr/bin/env bash
# Starts / stops the demo stack on embedded defaults: a local Ray head, two Celery workers (runs, with beat;
# user code) and the ASGI web server. Each runs in its own process group (setsid) whose id is kept in
# $DEMO_HOME/pids, so `stop` ends exactly what `start` began and nothing else.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/.venv/bin"
export POSTTRAIN_HOME="${POSTTRAIN_HOME:-$ROOT/.demo}"
PIDS="$POSTTRAIN_HOME/pids"
LOGS="$POSTTRAIN_HOME/logs"
WEB_PORT="${POSTTRAIN_PORT:-8000}"
RAY_DASHBOARD_PORT="${POSTTRAIN_RAY_DASHBOARD_PORT:-8265}"
RAY_GCS_PORT="${POSTTRAIN_RAY_GCS_PORT:-6390}"   # not 6379: that is Redis's
# The job agent's HTTP port (Ray's default 52365): a second head on the machine needs its own, or
# job submission answers "No available agent" forever.
RAY_AGENT_PORT="${POSTTRAIN_RAY_AGENT_PORT:-52365}"
# Unix socket paths must stay under ~107 characters, so Ray's session folder lives in /tmp.
RAY_TMP="${POSTTRAIN_RAY_TMP:-/tmp/posttrain-ray-$(id -u)}"
export RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:$RAY_DASHBOARD_PORT}"
# Where the engine of a run posts its events: this web server.
export POSTTRAIN_PUBLIC_URL="${POSTTRAIN_PUBLIC_URL:-http://127.0.0.1:$WEB_PORT}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# The machine's CPUs (its affinity mask), for the Ray head: GNU nproc prints OMP_NUM_THREADS instead when that is
# set, as it is here (2, the engine's torch threads), which gave the head 2 CPUs on any machine and 1 where
# OMP_NUM_THREADS=1, where the demo experiment (2 CPUs) then waited in the queue for ever.
cpus() { env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc; }

# The web server's own limits (docs/SECURITY.md, "Request bodies"); request bodies are capped by the app in front of
# Django (posttrain.core.request_bounds). h11 parses HTTP: it caps a request's line and headers (1 MiB, so a long
# prompt in the compare page's query string still fits), which httptools does not; at most 200 connections and
# requests at once (past that uvicorn answers 503). The test stack's web server and bench/request_bounds.py read it.
WEB_FLAGS=(--http h11 --h11-max-incomplete-event-size 1048576 --limit-concurrency 200)

alive() { [ -f "$PIDS/$1.pid" ] && kill -0 "$(cat "$PIDS/$1.pid")" 2>/dev/null; }

launch() {  # name, command...
  local name="$1"; shift
  if alive "$name"; then echo "  $name: already running (pid $(cat "$PIDS/$name.pid"))"; return; fi
  setsid nohup "$@" >"$LOGS/$name.log" 2>&1 < /dev/null &
  echo $! >"$PIDS/$name.pid"
  echo "  $name: started (pid $!, log $LOGS/$name.log)"
}

wait_http() {  # url, what, seconds
  for _ in $(seq "$3"); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 1
  done
  echo "error: $2 did not answer at $1 within $3 s; see $LOGS" >&2
  return 1
}

# The Ray head's environment, `env` and its arguments: token authentication with the platform's token file (made
# once next to the secret key; POSTTRAIN_RAY_TOKEN_FILE names another), the one the web server and workers send
# (docs/SECURITY.md, "Ray"). The head gets the file's path, never the token; RAY_AUTH_TOKEN would override the
# file, so it is dropped. RAY_AUTH_MODE=disabled is an admin's explicit opt-out, said loudly here and by every
# platform process.
ray_head_env() {
  local auth
  auth="$("$BIN/python" "$ROOT/manage.py" ray_auth)"
  if [[ "$auth" == disabled ]]; then
    echo "  WARNING: RAY_AUTH_MODE=disabled: anyone who can reach ports $RAY_GCS_PORT and $RAY_DASHBOARD_PORT can run code as you" >&2
    HEAD_ENV=(env -u RAY_AUTH_TOKEN -u RAY_AUTH_TOKEN_PATH RAY_AUTH_MODE=disabled)
  else
    HEAD_ENV=(env -u RAY_AUTH_TOKEN RAY_AUTH_MODE=token "RAY_AUTH_TOKEN_PATH=${auth#token }")
  fi
}

start() {
  mkdir -p "$PIDS" "$LOGS"
  echo "Starting the Posttrain demo stack (state in $POSTTRAIN_HOME)"
  if [[ "$RAY_ADDRESS" == "http://127.0.0.1:$RAY_DASHBOARD_PORT" ]]; then
    ray_head_env
    launch ray "${HEAD_ENV[@]}" "$BIN/ray" start --head --block --port "$RAY_GCS_PORT" --dashboard-host 127.0.0.1 \
      --dashboard-port "$RAY_DASHBOARD_PORT" --dashboard-agent-listen-port "$RAY_AGENT_PORT" --num-cpus "$(cpus)" --temp-dir "$RAY_TMP" --disable-usage-stats
  fi
  # Two workers: runs (submit, admission, cancel, the periodic reconcile) on the default queue, and user code
  # (import checks, "Try it") on a queue of its own, in prefork children Celery's time limits can kill, so
  # uploads can never hold the workers that start and stop runs.
  launch worker "$BIN/celery" --workdir "$ROOT" -A workers.celery_app worker -n "runs@%h" -Q celery -B \
    --pool threads --concurrency 4 --schedule "$POSTTRAIN_HOME/celerybeat-schedule" --loglevel INFO
  launch user_code "$BIN/celery" --workdir "$ROOT" -A workers.celery_app worker -n "user_code@%h" -Q user_code \
    --pool prefork --concurrency 2 --max-tasks-per-child 50 --loglevel INFO
  launch web "$BIN/uvicorn" --app-dir "$ROOT/platform" posttrain.asgi:application --host 127.0.0.1 --port "$WEB_PORT" \
    "${WEB_FLAGS[@]}"
  wait_http "http://127.0.0.1:$WEB_PORT/login/" "the web server" 60
  # A health path Ray answers without a token: the token stays out of this script.
  wait_http "$RAY_ADDRESS/api/gcs_healthz" "the Ray head" 90
}

stop() {
  [ -d "$PIDS" ] || { echo "nothing to stop"; return; }
  for pidfile in "$PIDS"/*.pid; do
    [ -e "$pidfile" ] || continue
    local name pid
    name="$(basename "$pidfile" .pid)"; pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -KILL -- "-$pid" 2>/dev/null || true
      echo "  $name: stopped (process group $pid)"
    fi
    rm -f "$pidfile"
  done
}

status() {
  for name in ray worker user_code web; do
    if alive "$name"; then echo "  $name: running (pid $(cat "$PIDS/$name.pid"))"; else echo "  $name: not running"; fi
  done
}

"${1:-start}"

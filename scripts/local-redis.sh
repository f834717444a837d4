#!/usr/bin/env bash
# A private redis-server for the README's three-terminal path: on a free loopback port (or the one you name, refused
# loudly when something already listens there), no persistence, and stopped by the pid this script recorded, so
# it never touches a Redis someone else runs.
#
#   scripts/local-redis.sh start [--port N]   start it (once; a second start reports the running one), print its URL
#   scripts/local-redis.sh url                print the URL of the running one (export REDIS_URL=$(... url))
#   scripts/local-redis.sh stop               stop the one this script started (by its recorded pid)
#
# The server comes from scripts/ensure-redis.sh (REDIS_SERVER_BIN, PATH, or provided). Its state (pid, port, log)
# is in target/local-redis/. Only the URL goes to stdout; everything else is said on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
state=target/local-redis
say() { echo "local-redis: $*" >&2; }

# Answers +PONG on 127.0.0.1:$1 (bash's /dev/tcp; no redis-cli needed).
pong() {
  local line=""
  { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
  printf 'PING\r\n' >&3
  read -r -t 2 line <&3 || true
  exec 3<&- 3>&-
  [ "${line%$'\r'}" = "+PONG" ]
}

# Something accepts connections on 127.0.0.1:$1.
listening() {
  { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
  exec 3<&- 3>&-
}

# The pid recorded by `start`, when that process is still the redis-server it started.
running_pid() {
  [ -f "$state/pid" ] && [ -f "$state/port" ] || return 1
  local pid port
  pid=$(cat "$state/pid")
  port=$(cat "$state/port")
  [ -r "/proc/$pid/cmdline" ] || return 1
  # redis-server rewrites its title to `redis-server 127.0.0.1:<port>`; the arguments show before it does.
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -e "redis-server.*:$port\b" -e "--port $port " || return 1
  echo "$pid"
}

start() {
  local port=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --port) port=${2:?--port needs a number}; shift 2 ;;
      *) say "usage: scripts/local-redis.sh start [--port N]"; exit 2 ;;
    esac
  done
  if pid=$(running_pid); then
    say "already running: pid $pid on port $(cat "$state/port") (scripts/local-redis.sh stop stops it)"
    echo "redis://127.0.0.1:$(cat "$state/port")"
    return 0
  fi
  if [ -n "$port" ]; then
    if listening "$port"; then
      say "port $port is taken: something already listens on 127.0.0.1:$port. Refusing to start there;"
      say "leave out --port to get a free one"
      exit 1
    fi
  else
    for _ in $(seq 1 50); do
      port=$((20000 + RANDOM % 40000))
      listening "$port" || break
    done
  fi
  local bin
  bin=$(scripts/ensure-redis.sh)
  mkdir -p "$state"
  rm -f "$state/pid" "$state/port"
  # Not --daemonize: a daemon that cannot bind exits silently; this process is watched until it answers.
  nohup "$bin" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$PWD/$state" \
    >"$state/redis.log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$state/pid"
  echo "$port" >"$state/port"
  for _ in $(seq 1 100); do
    if ! kill -0 "$pid" 2>/dev/null; then
      say "redis-server exited at start (port $port); its log:"
      tail -n 20 "$state/redis.log" >&2
      rm -f "$state/pid" "$state/port"
      exit 1
    fi
    if pong "$port"; then
      say "redis-server $bin started: pid $pid, port $port, log $state/redis.log"
      echo "redis://127.0.0.1:$port"
      return 0
    fi
    sleep 0.1
  done
  say "redis-server (pid $pid) did not answer PING on port $port within 10 s; stopping it"
  kill "$pid" 2>/dev/null || true
  rm -f "$state/pid" "$state/port"
  exit 1
}

case "${1:-}" in
  start) shift; start "$@" ;;
  url)
    if running_pid >/dev/null; then echo "redis://127.0.0.1:$(cat "$state/port")"; else
      say "none running (scripts/local-redis.sh start starts one)"
      exit 1
    fi
    ;;
  stop)
    if pid=$(running_pid); then
      kill "$pid"
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      rm -f "$state/pid" "$state/port"
      say "stopped pid $pid"
    else
      say "none running that this script started: nothing stopped"
      rm -f "$state/pid" "$state/port"
    fi
    ;;
  *) say "usage: scripts/local-redis.sh start [--port N] | url | stop"; exit 2 ;;
esac

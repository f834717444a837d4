# Sourced by the scripts that check a running coordinator (check-status-page.sh, schemathesis.sh): a scratch
# directory, one Redis and one coordinator on free loopback ports, all removed when the script exits.
#
# Needs: REDIS_BIN, COORD_BIN, TOKEN, and `missing` (the caller's way to stop with a reason). Sets WORK,
# REDIS_PORT, COORD_PORT and BASE. PY may name the Python that picks free ports (default python3).

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
  "${PY:-python3}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

REDIS_PORT=$(free_port)
"$REDIS_BIN" --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" \
  >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
COORD_PORT=$(free_port)
BASE="http://127.0.0.1:$COORD_PORT"
RUST_LOG=${RUST_LOG:-warn} "$COORD_BIN" --redis-url "redis://127.0.0.1:$REDIS_PORT" --listen "127.0.0.1:$COORD_PORT" \
  --admin-token "$TOKEN" --client-token "$TOKEN" >"$WORK/coordinator.log" 2>&1 &
PIDS+=($!)

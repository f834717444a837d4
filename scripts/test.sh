#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test (unit, property, integration against real redis-server
# processes the tests start themselves on free loopback ports), and doc tests. Ends with one verdict line.
#
#   scripts/test.sh           everything (about 15 min on 2 cores, after a cold build of about 5 min)
#   scripts/test.sh --quick   the tests only: no fmt, clippy, doc tests or fresh-machine check
#
# A missing redis-server is provided by scripts/ensure-redis.sh (it says what it did).
set -Eeuo pipefail
cd "$(dirname "$0")/.."

quick=false
case "${1:-}" in
  --quick) quick=true ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
started=$(date +%s)
done_steps=()
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
trap 'echo "test.sh: FAIL (passed before the failure: $(steps)) in $(elapsed)" >&2' ERR

steps() {
  local IFS=';'
  echo "${done_steps[*]:-nothing}" | sed 's/;/, /g'
}

elapsed() {
  local s=$(($(date +%s) - started))
  echo "$((s / 60)) min $((s % 60)) s"
}

# Counts what the runner printed: nextest's "N tests run", or the sum of libtest's "N passed".
count_tests() {
  local n
  n=$(grep -Eo '[0-9]+ tests? run' "$log" | tail -1 | grep -Eo '^[0-9]+' || true)
  if [ -z "$n" ]; then
    n=$(grep -Eo 'test result: ok\. [0-9]+ passed' "$log" | grep -Eo '[0-9]+' | awk '{ s += $1 } END { print s + 0 }')
  fi
  echo "${n:-0}"
}

run_tests() {
  if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast 2>&1 | tee "$log"
  else
    cargo test --workspace --no-fail-fast 2>&1 | tee "$log"
  fi
  done_steps+=("$(count_tests) tests")
}

REDIS_SERVER_BIN="$(scripts/ensure-redis.sh)"
export REDIS_SERVER_BIN

if $quick; then
  echo "== tests (quick mode)"
  run_tests
  echo "test.sh: PASS (quick: $(steps)) in $(elapsed)"
  exit 0
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
done_steps+=(fmt)
echo "== cargo clippy -D warnings"
# Default features are all features of the SDKs (`metrics`), so this run and the tests below cover them.
cargo clippy --workspace --all-targets -- -D warnings
echo "== SDKs with no features (metrics off)"
# Not a repeat of the run above: within the workspace, features unify, so the SDKs are only ever linted with
# `metrics` on there. This run lints the code compiled when `metrics` is off (its cfg branches and imports).
cargo clippy -p stream-consumer -p stream-producer --all-targets --no-default-features -- -D warnings
done_steps+=(clippy)
echo "== tests"
run_tests
echo "== doc tests"
cargo test --workspace --doc 2>&1 | tee "$log"
done_steps+=("$(count_tests) doc tests")
echo "== OpenAPI conformance (schemathesis against the debug coord-server)"
# The tests above built it already; this only makes sure when they were skipped.
cargo build -p coord-server --bin coord-server
scripts/schemathesis.sh
done_steps+=(schemathesis)
echo "== publish script cost (callgrind instruction counts, deterministic)"
if ! command -v valgrind >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  if command -v apt-get >/dev/null 2>&1 && $sudo true 2>/dev/null; then
    echo "valgrind missing: installing the Debian package"
    $sudo apt-get install -y -qq --no-install-recommends valgrind || { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends valgrind; }
  else
    echo "test.sh: valgrind is missing and cannot be installed here (Debian/Ubuntu: apt-get install valgrind)" >&2
    exit 1
  fi
fi
scripts/script-cost.sh --check
done_steps+=(script-cost)
echo "== status page in headless Chromium"
scripts/check-status-page.sh
done_steps+=(status-page)
echo "== fresh machine: no redis-server on PATH"
scripts/check-no-redis.sh
done_steps+=("no-redis check")

echo "test.sh: PASS ($(steps)) in $(elapsed)"
